"""Centroid proximal regularisation of local training (PushCen-ADFL paper, Sec. 4.2, Eq. 1-2).

The anchor ``w_hat`` is the layer decoded from the peer's centroid dictionary
through the current WCP assignments; the local loss gets ``lambda * ||w - w_hat||^2``
and pruned coordinates (assigned to the zero centroid) are held at 0.

How the squared distance is taken per layer (:data:`PENALTIES`): the paper's Eq. 2
writes the sum over coordinates (``"sum"``); its reference code takes each layer's
*mean* (``"layer-mean"``, the default here). They differ by the layer's size: on
LeNet-5's first dense layer (48,000 weights) the sum is 48,000 times the mean, so
``lambda = 0.1`` summed pins the layer to its anchor (measured: docs/fidelity.md, PushCen rows).
"""

from __future__ import annotations

import numpy as np
import torch


def centroid_anchor(indices: np.ndarray, dictionary: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``w_hat = dictionary[indices]`` in the layer's shape (Eq. 1)."""
    return np.asarray(dictionary, dtype=np.float32)[np.asarray(indices)].reshape(shape)


def proximal_penalty(weights: torch.Tensor, anchor: torch.Tensor, lam: float, reduction: str = "sum") -> torch.Tensor:
    """``lam * sum (w - w_hat)^2`` (Eq. 2's regulariser) or, ``reduction="layer-mean"``, ``lam * mean (w - w_hat)^2``."""
    squared = (weights - anchor).pow(2)
    return lam * (squared.mean() if reduction == "layer-mean" else squared.sum())


@torch.no_grad()
def enforce_mask_(weights: torch.Tensor, keep: torch.Tensor) -> None:
    """Zero the pruned coordinates in place (``keep`` is False where pruned)."""
    weights.mul_(keep.to(weights.dtype))
