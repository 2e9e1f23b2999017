"""Synchronous FedAvg as a preset of the async engine.

McMahan et al., 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data". The server waits for every job of the round, so a round
lasts as long as its slowest client (the straggler effect the async methods
avoid). With a server learning rate ``eta_s`` (FedRevive, Table 4 uses 1.4) the
step is ``x <- x + eta_s * sum_i n_i Delta_i / sum_i n_i``.

Under a ``round-deadline`` (semi-asynchronous rounds) late jobs arrive in a
later round and their updates are averaged in as they are: this is the
gradient-inversion paper's "Unweighted" baseline. Subclasses change what each
arrival contributes through :meth:`FedAvg.round_updates`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import StrategyConfig, knob


def weighted_mean_delta(deltas: list[np.ndarray], num_examples: list[float]) -> np.ndarray:
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


@dataclass(frozen=True)
class FedAvgConfig(StrategyConfig):
    """FedAvg's knob (run-config ``fedavg.server-lr``, shared by the FedAvg-based baselines).

    Parameters
    ----------
    server_lr : float
        ``eta_s`` on the round's weighted mean update.
    """

    label: ClassVar[str] = "FedAvg"
    prefix: ClassVar[str] = "fedavg"

    server_lr: float = knob(1.0, above=0, key="fedavg.server-lr")


class FedAvg(Strategy):
    """Synchronous FedAvg (McMahan et al., 2017) with a server learning rate. Knobs: :class:`FedAvgConfig`."""

    synchronous = True
    run_config_name = "fedavg"
    config_class = FedAvgConfig
    state_attributes = ("_arrivals", "rounds", "stale_arrivals")
    honours_aggregate_train = True  # at each round's end (asyncfl.strategies.train_hook)

    def __init__(self, server_lr: float = 1.0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedAvgConfig.from_arguments(locals())
        self._arrivals: list[Arrival] = []
        self.rounds = 0
        self.stale_arrivals = 0

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        self._arrivals.append(arrival)
        self.stale_arrivals += arrival.staleness > 0
        return None

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        """Each arrival's update and aggregation weight; FedAvg: ``Delta_i`` (relative to its own base), ``n_i``."""
        return [a.delta for a in arrivals], [float(a.num_examples) for a in arrivals]

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        if not self._arrivals:
            return None
        arrivals, hook = self._arrivals, self.aggregation_hook
        if hook is not None:  # an aggregate_train override makes the round's model; None keeps it, as Flower
            new = hook.step(self, arrivals, lambda chosen: self._step(current, [arrival for _, arrival in chosen]))
            new = current.copy() if new is None else new
        else:
            new = self._step(current, arrivals)
        self._arrivals = []
        self.rounds += 1
        return new

    def _step(self, current: np.ndarray, arrivals: list[Arrival]) -> np.ndarray:
        """``current + eta_s * the weighted mean of the arrivals' updates`` (:meth:`round_updates`)."""
        deltas, weights = self.round_updates(arrivals, current)
        return current + np.float32(self.config.server_lr) * weighted_mean_delta(deltas, weights)

    def summary(self) -> dict[str, float | int | str]:
        return {"rounds": self.rounds, "stale-arrivals": self.stale_arrivals}
