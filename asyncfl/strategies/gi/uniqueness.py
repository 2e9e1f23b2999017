"""Is a stale update's knowledge unique? (gradient-inversion paper, Sec. 3.4, Eq. 7-8)

Inversion runs only for stale updates whose direction differs from the
unstale ones: ``D_c(a, b) = 1 - a.b / (|a||b|)`` (Eq. 7), compared with the
adaptive threshold of Eq. 8, the average cosine distance among the unstale
updates of the version the stale job started from,
``1/|S|^2 * sum_{j,k in S} D_c(w_j, w_k)`` (the paper's normalisation, diagonal included).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    """``1 - cos(a, b)`` (Eq. 7); 1.0 when either vector is zero."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0
    return 1.0 - float(np.dot(a.astype(np.float64), b.astype(np.float64))) / (na * nb)


def adaptive_threshold(unstale: Sequence[np.ndarray]) -> float | None:
    """Eq. 8 over the unstale updates of one version; ``None`` with fewer than two updates."""
    if len(unstale) < 2:
        return None
    stack = np.stack([u.astype(np.float64) for u in unstale])
    norms = np.linalg.norm(stack, axis=1)
    norms[norms == 0.0] = 1.0
    unit = stack / norms[:, None]
    distances = 1.0 - unit @ unit.T
    np.fill_diagonal(distances, 0.0)
    return float(distances.sum() / len(unstale) ** 2)


def mean_distance_to(update: np.ndarray, others: Sequence[np.ndarray]) -> float:
    """Average ``D_c`` between ``update`` and each of ``others``."""
    if not others:
        raise ValueError("need at least one unstale update to compare with")
    return float(np.mean([cosine_distance(update, other) for other in others]))


def is_unique(update: np.ndarray, recent_unstale: Sequence[np.ndarray], threshold: float | None) -> bool:
    """True when ``update`` is farther from the recent unstale updates than ``threshold``.

    With no threshold or nothing to compare with, the update counts as unique
    (inversion runs: the conservative choice for the affected clients).
    """
    if threshold is None or not recent_unstale:
        return True
    return mean_distance_to(update, recent_unstale) > threshold
