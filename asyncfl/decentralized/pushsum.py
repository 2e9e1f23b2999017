"""Push-sum with mass splitting (PushCen-ADFL paper, Sec. 4.4, Eq. 3-5; Kempe et al., 2003).

A sender with mass ``m`` and ``d`` out-neighbours keeps ``m / (d + 1)`` and
sends the same share with each message. A receiver merges what it buffered:
``m' = m + sum_j m_j`` and ``theta' = (m theta + sum_j m_j theta_j) / m'``; the
centroid dictionary is merged with the same weights. Mass is never created or
destroyed, so the mass-weighted average over peers, in-flight and buffered
messages is preserved whatever the topology or message rates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def split_mass(mass: float, out_degree: int) -> float:
    """The share ``m / (d + 1)``: what the sender keeps and what each of its ``d`` messages carries."""
    if out_degree < 0 or mass <= 0:
        raise ValueError(f"need mass > 0 and out-degree >= 0, got mass={mass}, out-degree={out_degree}")
    return mass / (out_degree + 1)


def push_sum_merge(own: np.ndarray, own_mass: float, received: Sequence[tuple[np.ndarray, float]]) -> tuple[np.ndarray, float]:
    """``((m theta + sum m_j theta_j) / (m + sum m_j), m + sum m_j)`` (Eq. 3-4); also for centroid tables (Eq. 5)."""
    total = own_mass + sum(mass for _, mass in received)
    if total <= 0:
        raise ValueError("push-sum masses must stay positive")
    merged = own.astype(np.float64) * (own_mass / total)
    for value, mass in received:
        merged += np.asarray(value, dtype=np.float64) * (mass / total)
    return merged.astype(own.dtype), total
