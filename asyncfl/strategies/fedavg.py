"""Synchronous FedAvg as a preset of the async engine.

McMahan et al., 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data". The server waits for every job of the round, so a round
lasts as long as its slowest client (the straggler effect the async methods
avoid). With a server learning rate ``eta_s`` (FedRevive, Table 4 uses 1.4) the
step is ``x <- x + eta_s * sum_i n_i Delta_i / sum_i n_i``.
"""

from __future__ import annotations

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy


def weighted_mean_delta(deltas: list[np.ndarray], num_examples: list[int]) -> np.ndarray:
    """Average of ``deltas`` weighted by ``num_examples`` (equal weights if all are 0)."""
    if not deltas:
        raise ValueError("cannot average an empty list of updates")
    weights = np.asarray(num_examples, dtype=np.float64)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    weights = weights / weights.sum()
    out = np.zeros_like(deltas[0])
    for w, delta in zip(weights, deltas):
        out += np.float32(w) * delta
    return out


class FedAvg(Strategy):
    """Synchronous FedAvg (McMahan et al., 2017) with a server learning rate."""

    synchronous = True

    def __init__(self, server_lr: float = 1.0) -> None:
        self.server_lr = server_lr
        self._deltas: list[np.ndarray] = []
        self._counts: list[int] = []
        self.rounds = 0

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        # Every job of a round starts from the round's model, so delta is relative to it.
        self._deltas.append(arrival.delta)
        self._counts.append(arrival.num_examples)
        return None

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        if not self._deltas:
            return None
        step = weighted_mean_delta(self._deltas, self._counts)
        self._deltas, self._counts = [], []
        self.rounds += 1
        return current + np.float32(self.server_lr) * step

    def summary(self) -> dict[str, float | int | str]:
        return {"rounds": self.rounds}
