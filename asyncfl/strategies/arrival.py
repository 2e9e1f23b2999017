"""What the engine hands a strategy for each accepted reply.

Its own module, below both sides: the engine builds arrivals and strategies read them,
and neither has to import the other to do so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Arrival:
    """One accepted client reply, as the engine hands it to a strategy.

    Parameters
    ----------
    client_index : int
        The client's stable index (its ``partition-id`` when known).
    base_version : int
        Server model version the job was dispatched with.
    staleness : int
        ``tau = current server version - base_version``.
    weights : np.ndarray
        The client's trained model, flattened to float32.
    base : np.ndarray
        The global model of ``base_version``, flattened (read-only).
    num_examples : int
        Examples the client trained on, as it reported.
    train_loss : float
        The client's reported training loss.
    time : float
        Clock time (virtual or wall) at which the reply was accepted.
    """

    client_index: int
    base_version: int
    staleness: int
    weights: np.ndarray
    base: np.ndarray
    num_examples: int
    train_loss: float
    time: float

    @cached_property
    def delta(self) -> np.ndarray:
        """The client's update ``Delta = weights - base`` (computed once, on demand)."""
        return self.weights - self.base
