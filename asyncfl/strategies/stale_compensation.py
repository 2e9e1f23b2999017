"""Baselines for stale updates in semi-asynchronous FedAvg (gradient-inversion paper, Sec. 4).

All aggregate a round's updates with FedAvg; they differ in what a stale
update (``tau > 0``) contributes:

* ``stale-weighted`` (Shi et al., 2020): weight ``1 / (1 + exp(a (tau - b)))`` times ``n_i``
  (steepness ``a = 0.25``, midpoint ``b = 10`` in the paper);
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

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival
from asyncfl.strategies.fedavg import FedAvg, FedAvgConfig, weighted_mean_delta
from asyncfl.strategies.settings import knob


def sigmoid_staleness_weight(tau: int, a: float, b: float) -> float:
    """``1 / (1 + exp(a (tau - b)))`` (Shi et al., 2020)."""
    z = a * (tau - b)
    if z > 700:  # exp overflow: the weight is 0 to double precision
        return 0.0
    return 1.0 / (1.0 + math.exp(z))


def dc_asgd_compensation(delta: np.ndarray, current: np.ndarray, base: np.ndarray, lam: float) -> np.ndarray:
    """First-order delay compensation of a stale update: ``Delta - lam * Delta * Delta * (current - base)``."""
    return delta - np.float32(lam) * delta * delta * (current - base)


@dataclass(frozen=True)
class StaleWeightedConfig(FedAvgConfig):
    """The "Weighted" baseline's knobs (run-config ``stale-weighted.*`` and ``fedavg.server-lr``).

    Parameters
    ----------
    steepness : float
        ``a`` of the sigmoid ``1 / (1 + exp(a (tau - b)))``.
    midpoint : float
        ``b``: the staleness at which the weight is 1/2.
    """

    label: ClassVar[str] = "StaleWeighted"
    prefix: ClassVar[str] = "stale-weighted"

    steepness: float = knob(0.25, minimum=0)
    midpoint: float = knob(10.0)


class StaleWeighted(FedAvg):
    """FedAvg whose stale updates carry an extra sigmoid staleness weight (the paper's "Weighted").

    Knobs: :class:`StaleWeightedConfig`.
    """

    run_config_name = "stale-weighted"
    config_class = StaleWeightedConfig

    def __init__(self, server_lr: float = 1.0, steepness: float = 0.25, midpoint: float = 10.0,
                 **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        self.config = StaleWeightedConfig.from_arguments(locals())

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        weights = [a.num_examples * sigmoid_staleness_weight(a.staleness, self.config.steepness, self.config.midpoint)
                   for a in arrivals]
        return [a.delta for a in arrivals], weights


@dataclass(frozen=True)
class DCASGDConfig(FedAvgConfig):
    """The "1st-Order" baseline's knobs (run-config ``dc-asgd.*`` and ``fedavg.server-lr``).

    Parameters
    ----------
    compensation_strength : float
        ``lambda`` of ``Delta - lambda Delta*Delta*(w^t - w^{t-tau})`` (DC-ASGD's variance-control parameter).
    """

    label: ClassVar[str] = "DCASGD"
    prefix: ClassVar[str] = "dc-asgd"

    compensation_strength: float = knob(4.0, minimum=0)


class DCASGD(FedAvg):
    """FedAvg with first-order (DC-ASGD) compensation of stale updates (the paper's "1st-Order").

    Knobs: :class:`DCASGDConfig`.
    """

    run_config_name = "dc-asgd"
    config_class = DCASGDConfig

    def __init__(self, server_lr: float = 1.0, compensation_strength: float = 4.0, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        self.config = DCASGDConfig.from_arguments(locals())

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        # ``a.base`` is the model the job was sent (W-Pred's look-ahead, or the global model of its version)
        strength = self.config.compensation_strength
        deltas = [dc_asgd_compensation(a.delta, current, a.base, strength) if a.staleness > 0 else a.delta
                  for a in arrivals]
        return deltas, [float(a.num_examples) for a in arrivals]


@dataclass(frozen=True)
class AsynTiersConfig(FedAvgConfig):
    """The "Asyn-Tiers" baseline's knobs (run-config ``asyn-tiers.*`` and ``fedavg.server-lr``).

    Parameters
    ----------
    boundary : int
        Updates with ``tau <= boundary`` form the first tier, later ones the second.
    """

    label: ClassVar[str] = "AsynTiers"
    prefix: ClassVar[str] = "asyn-tiers"

    boundary: int = knob(0, minimum=0)


class AsynTiers(FedAvg):
    """Two staleness tiers, FedAvg inside each, tiers weighted by their client counts (the paper's "Asyn-Tiers").

    Knobs: :class:`AsynTiersConfig`.
    """

    run_config_name = "asyn-tiers"
    config_class = AsynTiersConfig

    def __init__(self, server_lr: float = 1.0, boundary: int = 0, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        self.config = AsynTiersConfig.from_arguments(locals())

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        boundary = self.config.boundary
        tiers = [[a for a in arrivals if a.staleness <= boundary], [a for a in arrivals if a.staleness > boundary]]
        deltas, weights = [], []
        for tier in tiers:
            if tier:
                deltas.append(weighted_mean_delta([a.delta for a in tier], [a.num_examples for a in tier]))
                weights.append(float(len(tier)))
        return deltas, weights


@dataclass(frozen=True)
class WPredConfig(DCASGDConfig):
    """The "W-Pred" baseline's knobs (run-config ``w-pred.*`` and ``fedavg.server-lr``).

    Parameters
    ----------
    compensation_strength : float
        ``lambda`` of the first-order compensation from the model sent to the model applied to.
    step_average_decay : float
        ``beta`` of the bias-corrected moving average of the per-round global steps.
    """

    label: ClassVar[str] = "WPred"
    prefix: ClassVar[str] = "w-pred"

    step_average_decay: float = knob(0.9, minimum=0, below=1)


class WPred(DCASGD):
    """Look-ahead dispatch for clients known to be late, plus first-order compensation (the paper's "W-Pred").

    Knobs: :class:`WPredConfig`.
    """

    run_config_name = "w-pred"
    config_class = WPredConfig
    state_attributes = FedAvg.state_attributes + (
        "_expected_staleness", "_step_average", "_steps_seen", "predicted_dispatches")

    def __init__(self, server_lr: float = 1.0, compensation_strength: float = 4.0, step_average_decay: float = 0.9,
                 **flower_options: Any) -> None:
        super().__init__(server_lr, compensation_strength, **flower_options)
        self.config = WPredConfig.from_arguments(locals())
        self._expected_staleness: dict[int, int] = {}
        self._step_average: np.ndarray | None = None
        self._steps_seen = 0
        self.predicted_dispatches = 0

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        tau = self._expected_staleness.get(client, 0)
        if tau == 0 or self._step_average is None:
            return None
        self.predicted_dispatches += 1
        corrected = self._step_average / np.float32(1.0 - self.config.step_average_decay ** self._steps_seen)
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
            decay = self.config.step_average_decay
            self._step_average = np.float32(decay) * self._step_average + np.float32(1.0 - decay) * step
            self._steps_seen += 1
        return new

    def summary(self) -> dict[str, float | int | str]:
        return {**super().summary(), "predicted-dispatches": self.predicted_dispatches}
