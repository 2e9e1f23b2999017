"""Baselines for stale updates in semi-asynchronous FedAvg (gradient-inversion paper, Sec. 4).

All aggregate a round's updates with FedAvg; they differ in what a stale
update (``tau > 0``) contributes:

* ``stale-weighted`` (Shi et al., 2020): weight ``1 / (1 + exp(a (tau - b)))`` times ``n_i``
  (``a = 0.25``, ``b = 10`` in the paper);
* ``dc-asgd`` (1st-Order; Zheng et al., 2017, Eq. 1-2 of the paper): with the update seen as
  ``Delta = -g``, ``g(w^t) ~ g + lambda g*g*(w^t - w^{t-tau})`` gives
  ``Delta_c = Delta - lambda Delta*Delta*(w^t - w^{t-tau})`` (element-wise; the authors' code uses
  ``lambda = 4`` and this sign);
* ``w-pred`` (Hakimi et al., 2019, as the paper describes it: "assuming staleness as pre-known, the
  future global model is predicted by the first-order method and used to compensate stale updates"):
  a client whose last update was ``tau`` versions stale is sent the look-ahead
  ``w^t + tau * s`` (``s`` a bias-corrected moving average of the per-round global steps, factor
  ``beta``) instead of ``w^t``; its update is then compensated first-order from the model it was sent
  to the model it is applied to;
* ``asyn-tiers`` (Chai et al., 2021, as the paper specifies it): two tiers by staleness
  (``tau <= boundary`` and later), FedAvg inside each tier, and the tier means combined with
  weights proportional to the number of clients in each tier.

The unweighted baseline is plain ``fedavg`` under a round deadline.
"""

from __future__ import annotations

from typing import Any

import math

import numpy as np

from asyncfl.strategies.base import Arrival
from asyncfl.strategies.fedavg import FedAvg, weighted_mean_delta


def sigmoid_staleness_weight(tau: int, a: float, b: float) -> float:
    """``1 / (1 + exp(a (tau - b)))`` (Shi et al., 2020)."""
    z = a * (tau - b)
    if z > 700:  # exp overflow: the weight is 0 to double precision
        return 0.0
    return 1.0 / (1.0 + math.exp(z))


def dc_asgd_compensation(delta: np.ndarray, current: np.ndarray, base: np.ndarray, lam: float) -> np.ndarray:
    """First-order delay compensation of a stale update: ``Delta - lam * Delta * Delta * (current - base)``."""
    return delta - np.float32(lam) * delta * delta * (current - base)


class StaleWeighted(FedAvg):
    """FedAvg whose stale updates carry an extra sigmoid staleness weight (the paper's "Weighted")."""

    def __init__(self, server_lr: float = 1.0, a: float = 0.25, b: float = 10.0, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        if a < 0:
            raise ValueError(f"stale-weighted.a must be >= 0, got {a}")
        self.a, self.b = a, b

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        weights = [a.num_examples * sigmoid_staleness_weight(a.staleness, self.a, self.b) for a in arrivals]
        return [a.delta for a in arrivals], weights


class DCASGD(FedAvg):
    """FedAvg with first-order (DC-ASGD) compensation of stale updates (the paper's "1st-Order")."""

    def __init__(self, server_lr: float = 1.0, lam: float = 4.0, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        if lam < 0:
            raise ValueError(f"dc-asgd.lambda must be >= 0, got {lam}")
        self.lam = lam

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        # ``a.base`` is the model the job was sent (W-Pred's look-ahead, or the global model of its version)
        deltas = [dc_asgd_compensation(a.delta, current, a.base, self.lam) if a.staleness > 0 else a.delta
                  for a in arrivals]
        return deltas, [float(a.num_examples) for a in arrivals]


class AsynTiers(FedAvg):
    """Two staleness tiers, FedAvg inside each, tiers weighted by their client counts (the paper's "Asyn-Tiers")."""

    def __init__(self, server_lr: float = 1.0, boundary: int = 0, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        if boundary < 0:
            raise ValueError(f"asyn-tiers.boundary must be >= 0, got {boundary}")
        self.boundary = boundary

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        tiers = [[a for a in arrivals if a.staleness <= self.boundary], [a for a in arrivals if a.staleness > self.boundary]]
        deltas, weights = [], []
        for tier in tiers:
            if tier:
                deltas.append(weighted_mean_delta([a.delta for a in tier], [a.num_examples for a in tier]))
                weights.append(float(len(tier)))
        return deltas, weights


class WPred(DCASGD):
    """Look-ahead dispatch for clients known to be late, plus first-order compensation (the paper's "W-Pred")."""

    def __init__(self, server_lr: float = 1.0, lam: float = 4.0, beta: float = 0.9, **flower_options: Any) -> None:
        super().__init__(server_lr, lam, **flower_options)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"w-pred.beta must be in [0, 1), got {beta}")
        self.beta = beta
        self._expected_staleness: dict[int, int] = {}
        self._step_average: np.ndarray | None = None
        self._steps_seen = 0
        self.predicted_dispatches = 0

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        tau = self._expected_staleness.get(client, 0)
        if tau == 0 or self._step_average is None:
            return None
        self.predicted_dispatches += 1
        corrected = self._step_average / np.float32(1.0 - self.beta ** self._steps_seen)
        return current + np.float32(tau) * corrected

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        for arrival in arrivals:
            self._expected_staleness[arrival.client_index] = arrival.staleness
        return super().round_updates(arrivals, current)

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        new = super().on_round_end(current)
        if new is not None:
            step = new - current
            if self._step_average is None:
                self._step_average = np.zeros_like(step)
            self._step_average = np.float32(self.beta) * self._step_average + np.float32(1.0 - self.beta) * step
            self._steps_seen += 1
        return new

    def summary(self) -> dict[str, float | int | str]:
        return {**super().summary(), "predicted-dispatches": self.predicted_dispatches}
