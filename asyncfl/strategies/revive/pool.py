"""The KD dataset D_KD: a FIFO pool of synthetic (input, label) pairs with class-weighted sampling.

FedRevive paper, Sec. 2.2: the lowest-loss synthesis batch joins the pool, the
oldest samples leave when it is full; a teacher's minibatch is drawn by first
sampling a label from the teacher's class proportions, then an input uniformly
among the pool's inputs of that label.

The inputs live on the server method's device (where the teachers run), the labels on
the CPU (the draws are numpy's, so they are the same on every device).
"""

from __future__ import annotations

import numpy as np
import torch

from asyncfl.errors import ConfigError


class KDPool:
    """FIFO pool of at most ``capacity`` samples."""

    state_attributes = ("x", "y")

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ConfigError(f"KD pool capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.y is None else len(self.y)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Append a batch, dropping the oldest samples beyond capacity."""
        x, y = x.detach().to(self.device), y.detach().cpu()
        self.x = x if self.x is None else torch.cat([self._inputs(), x])
        self.y = y if self.y is None else torch.cat([self.y, y])
        if len(self.y) > self.capacity:
            self.x, self.y = self.x[-self.capacity :], self.y[-self.capacity :]

    def sample(self, proportions: np.ndarray, size: int, rng: np.random.Generator) -> torch.Tensor:
        """``size`` inputs: labels drawn from ``proportions`` (restricted to labels present), inputs uniform."""
        if self.y is None:
            raise ValueError("the KD pool is empty")
        labels = self.y.numpy()
        present = np.unique(labels)
        weights = np.asarray(proportions, dtype=np.float64)[present]
        weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(present), 1.0 / len(present))
        drawn = rng.choice(present, size=size, p=weights)
        rows = np.empty(size, dtype=np.int64)
        for label in np.unique(drawn):
            members = np.flatnonzero(labels == label)
            slots = np.flatnonzero(drawn == label)
            rows[slots] = rng.choice(members, size=len(slots))
        return self._inputs()[torch.from_numpy(rows).to(self.device)]

    def _inputs(self) -> torch.Tensor:
        """The inputs on the pool's device (a checkpoint restores them on the CPU)."""
        assert self.x is not None
        if self.x.device != self.device:
            self.x = self.x.to(self.device)
        return self.x
