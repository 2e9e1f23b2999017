"""FedFa: fully asynchronous training with a queue of recent client models.

Xu, Zhang, Di, Liu, Alharthi and Cao, IJCAI 2024, "FedFa: A Fully Asynchronous
Training Paradigm for Federated Learning". The server keeps the ``Q`` most
recent client models in a FIFO queue (the oldest is dropped when a new one
arrives on a full queue); the global model is their average, recomputed on
every arrival. A running sum makes each arrival O(model), whatever ``Q`` is.

Its pace: a client model is its base (about ``K`` arrivals old) plus one update, so the
average of the last ``Q`` is about ``K + Q / 2`` arrivals behind plus one mean update: one
mean update per ``K + Q / 2`` arrivals, where FedAvg makes one per ``K``. A small window
keeps up, a large one smooths noise; the default ``Q = ceil(K / 2)`` costs a fifth of
FedAvg's pace. The window costs time, not the model: given twice the rounds FedFa ends level with
FedAvg where a short run leaves it behind (measured in the drop-in study: docs/methods.md).
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
        ``Q``: client models averaged into the global one; 0 (default) = ``ceil(K / 2)`` for ``K``
        jobs in flight.
    """

    label: ClassVar[str] = "FedFa"
    prefix: ClassVar[str] = "fedfa"

    queue_size: int = knob(0, minimum=0)


class FedFa(Strategy):
    """FedFa (Xu et al., 2024): the global model is the mean of the last ``queue_size`` client models.

    Knobs: :class:`FedFaConfig`.
    """

    run_config_name = "fedfa"
    config_class = FedFaConfig
    state_attributes = ("_queue", "_sum", "_arrivals")

    def __init__(self, queue_size: int = 0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedFaConfig.from_arguments(locals())
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

    @property
    def queue_size(self) -> int:
        """``Q`` in use: the configured one, or ``ceil(K / 2)`` (``10`` before a run tells ``K``)."""
        if self.config.queue_size:
            return self.config.queue_size
        return -(-self.concurrency // 2) if self.concurrency else 10

    def summary(self) -> dict[str, float | int | str]:
        return {"queue-length": len(self._queue), "queue-size": self.queue_size}
