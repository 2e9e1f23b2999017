"""Top-K sparsification of the inversion target (gradient-inversion paper, Sec. 3.3 and Table 4).

Only the ``K`` largest-magnitude coordinates of the stale update enter the
disparity: the paper keeps 5% (95% sparsification), which cuts inversion
iterations by ~80% and makes recovered samples unrecognisable (its Table 6).
"""

from __future__ import annotations

import math

import torch

from asyncfl.errors import ConfigError


def kept_count(size: int, keep_fraction: float) -> int:
    """``K = ceil(keep_fraction * size)``, at least 1; ``keep_fraction`` in (0, 1]."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ConfigError(f"top-K keep fraction must be in (0, 1], got {keep_fraction}")
    return max(1, min(size, math.ceil(keep_fraction * size)))


def top_k_mask(vector: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Boolean mask with exactly ``K`` True entries at the largest ``|vector|`` (ties: lowest index first)."""
    flat = vector.reshape(-1)
    k = kept_count(flat.numel(), keep_fraction)
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    if k == flat.numel():
        mask[:] = True
    else:
        # a stable sort makes ties deterministic
        order = torch.sort(flat.abs(), descending=True, stable=True).indices
        mask[order[:k]] = True
    return mask.reshape(vector.shape)
