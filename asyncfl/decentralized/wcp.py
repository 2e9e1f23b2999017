"""Weight Clustering Pruning: a layer as k scalar centroids plus one index per weight.

PushCen-ADFL paper, Sec. 4.3, Algorithm 3 and Appendix B. Per weight layer:
1-D k-means with one centroid fixed at 0 (weights assigned to it are pruned),
warm-started from the peer's dictionary when it has one, then SortRemap: the
centroids are put in ascending order and the indices renumbered, so tables from
different peers line up entry by entry (push-sum averages them). The message
carries the k-1 non-zero centroids and the indices at ``ceil(log2 k)`` bits
(Eq. 11-13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asyncfl.errors import ConfigError


@dataclass(frozen=True)
class EncodedLayer:
    """One layer in centroid form.

    Parameters
    ----------
    centroids : np.ndarray
        ``k`` float32 values in ascending order, exactly one of them 0.0 (at ``zero_index``).
    indices : np.ndarray
        The centroid index of every weight (flattened, integer).
    shape : tuple of int
        The layer's shape.
    """

    centroids: np.ndarray
    indices: np.ndarray
    shape: tuple[int, ...]

    @property
    def zero_index(self) -> int:
        return int(np.flatnonzero(self.centroids == 0.0)[0])

    @property
    def k(self) -> int:
        return int(self.centroids.size)

    def decode(self) -> np.ndarray:
        """The quantised layer: ``centroids[indices]`` in the layer's shape (Eq. 1's lookup)."""
        return self.centroids[self.indices].reshape(self.shape)

    def mask(self) -> np.ndarray:
        """True where the weight is kept (not assigned to the zero centroid)."""
        return (self.indices != self.zero_index).reshape(self.shape)


def index_bits(k: int) -> int:
    """Bits per index, ``ceil(log2 k)`` (at least 1)."""
    return max(1, math.ceil(math.log2(k)))


def nearest_sorted(values: np.ndarray, sorted_centroids: np.ndarray) -> np.ndarray:
    """Index of the nearest of ``sorted_centroids`` for every value (ties go to the lower centroid)."""
    midpoints = (sorted_centroids[1:] + sorted_centroids[:-1]) / 2.0
    return np.searchsorted(midpoints, values, side="left")


def _initial_nonzero(values: np.ndarray, k: int, init: np.ndarray | None) -> np.ndarray:
    if init is not None:
        nonzero = np.asarray(init, dtype=np.float32)
        nonzero = nonzero[nonzero != 0.0]
        if nonzero.size == k - 1:
            return nonzero.copy()
    # evenly spaced quantiles of the layer: a deterministic, spread-out start
    return np.quantile(values, (np.arange(k - 1) + 0.5) / (k - 1)).astype(np.float32)


def wcp_encode(weights: np.ndarray, k: int = 32, init: np.ndarray | None = None, iterations: int = 10) -> EncodedLayer:
    """Cluster ``weights`` into ``k`` centroids (one fixed at 0), warm-started from ``init``'s non-zero entries.

    Parameters
    ----------
    weights : np.ndarray
        One layer.
    k : int
        Centroids including the zero one (the paper's default is 32), 2 <= k <= 65536.
    init : np.ndarray, optional
        The peer's current centroid table for this layer (used when it has ``k - 1`` non-zero entries).
    iterations : int
        Lloyd iterations (assignment, then cluster means); an empty cluster keeps its centroid.
    """
    if not 2 <= k <= 65536:
        raise ConfigError(f"WCP needs 2 <= k <= 65536 centroids, got {k}")
    values = np.asarray(weights, dtype=np.float32).reshape(-1)
    nonzero = _initial_nonzero(values, k, init)
    for _ in range(max(iterations, 1)):
        centroids = np.sort(np.concatenate([nonzero, np.zeros(1, np.float32)]))
        assigned = nearest_sorted(values, centroids)
        sums = np.bincount(assigned, weights=values, minlength=k)
        counts = np.bincount(assigned, minlength=k)
        updated = np.where(counts > 0, sums / np.maximum(counts, 1), centroids).astype(np.float32)
        zero_at = int(np.flatnonzero(centroids == 0.0)[0])
        updated[zero_at] = 0.0
        nonzero = np.delete(updated, zero_at)
        nonzero[nonzero == 0.0] = np.float32(1e-12)  # keep exactly one zero centroid
    centroids = np.sort(np.concatenate([nonzero, np.zeros(1, np.float32)]))  # SortRemap
    indices = nearest_sorted(values, centroids)
    dtype = np.uint8 if k <= 256 else np.uint16
    return EncodedLayer(centroids, indices.astype(dtype), tuple(np.shape(weights)))


def encoded_bytes(layer: EncodedLayer) -> int:
    """Payload of one layer: ``k - 1`` float32 centroids plus the bit-packed indices (Eq. 13)."""
    return 4 * (layer.k - 1) + math.ceil(layer.indices.size * index_bits(layer.k) / 8)
