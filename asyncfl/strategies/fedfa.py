"""FedFa: fully asynchronous training with a queue of recent client models.

Xu, Zhang, Di, Liu, Alharthi and Cao, IJCAI 2024, "FedFa: A Fully Asynchronous
Training Paradigm for Federated Learning". The server keeps the ``Q`` most
recent client models in a FIFO queue (the oldest is dropped when a new one
arrives on a full queue); the global model is their average, recomputed on
every arrival. A running sum makes each arrival O(model), whatever ``Q`` is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import StrategyConfig, knob


@dataclass(frozen=True)
class FedFaConfig(StrategyConfig):
    """FedFa's knob (run-config ``fedfa.queue-size``).

    Parameters
    ----------
    queue_size : int
        ``Q``: client models averaged into the global one.
    """

    label: ClassVar[str] = "FedFa"
    prefix: ClassVar[str] = "fedfa"

    queue_size: int = knob(10, minimum=1)


class FedFa(Strategy):
    """FedFa (Xu et al., 2024): the global model is the mean of the last ``queue_size`` client models.

    Knobs: :class:`FedFaConfig`.
    """

    config_class = FedFaConfig

    def __init__(self, queue_size: int = 10, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedFaConfig(queue_size)
        self._queue: deque[np.ndarray] = deque()
        self._sum: np.ndarray | None = None
        self._arrivals = 0

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        weights = arrival.weights
        if self._sum is None:
            self._sum = np.zeros_like(weights)
        self._queue.append(weights)
        self._sum += weights
        if len(self._queue) > self.config.queue_size:
            self._sum -= self._queue.popleft()
        self._arrivals += 1
        if self._arrivals % (10 * self.config.queue_size) == 0:  # bound float32 drift of the running sum
            self._sum = np.sum(np.stack(self._queue), axis=0)
        return self._sum / np.float32(len(self._queue))

    def summary(self) -> dict[str, float | int | str]:
        return {"queue-length": len(self._queue)}
