"""FedAsync: mix every arrival into the global model at once.

Xie, Koyejo and Gupta, 2019, "Asynchronous Federated Optimization":
``x <- (1 - alpha_t) x + alpha_t x_client`` with ``alpha_t = alpha * s(tau)``
and ``s`` one of the staleness functions in :mod:`asyncfl.strategies.staleness`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.staleness import fedasync_staleness


def fedasync_mix(current: np.ndarray, client: np.ndarray, alpha_t: float) -> np.ndarray:
    """``(1 - alpha_t) * current + alpha_t * client``."""
    return current + np.float32(alpha_t) * (client - current)


class FedAsync(Strategy):
    """FedAsync (Xie et al., 2019) with constant, polynomial or hinge staleness."""

    def __init__(self, alpha: float = 0.6, staleness: str = "polynomial", a: float = 0.5, b: float = 4.0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.alpha = alpha
        self.staleness = staleness
        self.a = a
        self.b = b

    def mixing_weight(self, tau: int) -> float:
        """``alpha_t = alpha * s(tau)``."""
        return self.alpha * fedasync_staleness(self.staleness, tau, self.a, self.b)

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        return fedasync_mix(current, arrival.weights, self.mixing_weight(arrival.staleness))
