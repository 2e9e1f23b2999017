"""FedFa: fully asynchronous training with a queue of recent client models.

Xu, Zhang, Di, Liu, Alharthi and Cao, IJCAI 2024, "FedFa: A Fully Asynchronous
Training Paradigm for Federated Learning". The server keeps the ``Q`` most
recent client models in a FIFO queue (the oldest is dropped when a new one
arrives on a full queue); the global model is their average, recomputed on
every arrival. A running sum makes each arrival O(model), whatever ``Q`` is.
"""

from __future__ import annotations

from typing import Any

from collections import deque

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy


class FedFa(Strategy):
    """FedFa (Xu et al., 2024): the global model is the mean of the last ``queue_size`` client models."""

    def __init__(self, queue_size: int = 10, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        if queue_size < 1:
            raise ValueError(f"fedfa.queue-size must be >= 1, got {queue_size}")
        self.queue_size = queue_size
        self._queue: deque[np.ndarray] = deque()
        self._sum: np.ndarray | None = None
        self._arrivals = 0

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        weights = arrival.weights
        if self._sum is None:
            self._sum = np.zeros_like(weights)
        self._queue.append(weights)
        self._sum += weights
        if len(self._queue) > self.queue_size:
            self._sum -= self._queue.popleft()
        self._arrivals += 1
        if self._arrivals % (10 * self.queue_size) == 0:  # bound float32 drift of the running sum
            self._sum = np.sum(np.stack(self._queue), axis=0)
        return self._sum / np.float32(len(self._queue))

    def summary(self) -> dict[str, float | int | str]:
        return {"queue-length": len(self._queue)}
