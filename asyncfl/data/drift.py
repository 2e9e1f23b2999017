"""Variant data: clients' samples drift to another representation of the same task over time.

The gradient-inversion paper's variant-data scenario (its Sec. 4.3, Fig. 13):
every client starts with its MNIST partition and, during training, keeps
replacing random samples of its local dataset with SVHN samples (same digits,
other features). SVHN is not on these machines, so the replacement sources
here are (``drift.source``):

* ``digits``: scikit-learn's 8x8 digits (ships in the package), resized to the
  clients' input size and standardised on their own statistics -- other
  writers, other resolution;
* ``inverted``: the sample itself with its standardised intensities negated
  (mirrored about the dataset's mean: dark strokes on a light ground), a pure
  feature shift that works for every dataset.

A replaced sample keeps its label (the replacement is drawn from the source's
samples of that label), so the label skew the scenario is built on (which
clients hold the affected class) stays as it was. At virtual time ``t`` the
fraction ``min(1, drift.rate * t)`` of each client's samples is replaced; which
samples go first and what replaces each is fixed per client and seed, so the
replaced set only grows and a run is reproducible. The server's test split
drifts the same way, so accuracy is measured on the data in effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from asyncfl.errors import ConfigError

DRIFT_SOURCES = ("none", "digits", "inverted")
DIGIT_DATASETS = ("mnist5k", "mnist")


@dataclass(frozen=True)
class DriftConfig:
    """``drift.source`` and ``drift.rate`` (fraction of the samples replaced per virtual time unit)."""

    source: str = "none"
    rate: float = 0.0

    def __post_init__(self) -> None:
        if self.source not in DRIFT_SOURCES:
            raise ConfigError(f"unknown drift.source {self.source!r}; valid: {', '.join(DRIFT_SOURCES)}")
        if self.source != "none" and not self.rate > 0:
            raise ConfigError(f"drift.source={self.source!r} needs drift.rate > 0 (fraction replaced per time unit), "
                             f"got {self.rate}")
        if self.rate < 0:
            raise ConfigError(f"drift.rate must be >= 0, got {self.rate}")

    @property
    def active(self) -> bool:
        return self.source != "none"

    def fraction(self, at: float) -> float:
        """Fraction of the samples replaced at virtual time ``at``."""
        return min(1.0, max(0.0, self.rate * at)) if self.active else 0.0


@lru_cache(maxsize=4)
def _digits_pool(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    from asyncfl.data.unlabeled import resized_digits_with_labels

    return resized_digits_with_labels(height, width)


def check_source(source: str, dataset: str) -> None:
    """Refuse a source that cannot stand in for ``dataset`` (before anything runs)."""
    if source == "digits" and dataset not in DIGIT_DATASETS:
        raise ConfigError(f"drift.source 'digits' replaces handwritten digits by other handwritten digits; valid "
                         f"for dataset {' or '.join(DIGIT_DATASETS)}, not {dataset!r} (use 'inverted')")


def drifted(x: np.ndarray, y: np.ndarray, fraction: float, source: str, seed: tuple[int, ...]) -> np.ndarray:
    """``x`` with the first ``floor(fraction * len(x))`` samples of a seeded order replaced from ``source``.

    Parameters
    ----------
    x, y : numpy.ndarray
        Inputs (N x C x H x W, standardised) and labels.
    fraction : float
        Share of the samples replaced, in [0, 1].
    source : str
        One of :data:`DRIFT_SOURCES`.
    seed : tuple of int
        Fixes the order of replacement and each sample's replacement (per client, or the test split).

    Returns
    -------
    numpy.ndarray
        A new array when anything is replaced, else ``x`` itself.
    """
    count = int(np.floor(min(1.0, max(0.0, fraction)) * len(x)))
    if source == "none" or count == 0:
        return x
    order = np.random.default_rng([*seed, 23]).permutation(len(x))[:count]
    out = x.copy()
    if source == "inverted":
        out[order] = -x[order]  # standardised intensities mirrored about the dataset mean: dark strokes, light ground
        return out
    pool_x, pool_y = _digits_pool(int(x.shape[2]), int(x.shape[3]))
    picks = np.random.default_rng([*seed, 24]).integers(0, 2**31 - 1, size=len(x))[order]
    members = {label: np.flatnonzero(pool_y == label) for label in np.unique(y[order])}
    for index, pick in zip(order, picks):
        of_label = members[y[index]]
        out[index] = pool_x[of_label[pick % len(of_label)]]
    return out
