"""AFL-DW: asynchronous FL with staleness down-weighting.

The ablation of the FedRevive paper (Sec. 3.1, "AFL-DW"): Eq. (3) without the
distilled term, ``x <- x + eta_s * (1 - beta(tau)) * Delta``, with the same
``beta`` schedule as FedRevive (1-cosine by default, Appendix I.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.pace import PACES
from asyncfl.strategies.revive.mixing import MixingTally
from asyncfl.strategies.settings import StrategyConfig, knob
from asyncfl.strategies.staleness import BETA_SCHEDULES, beta_schedule, staleness_cutoff


def afl_dw_step(current: np.ndarray, delta: np.ndarray, server_lr: float, beta: float) -> np.ndarray:
    """``current + server_lr * (1 - beta) * delta``."""
    return current + np.float32(server_lr * (1.0 - beta)) * delta


@dataclass(frozen=True)
class AFLDWConfig(StrategyConfig):
    """AFL-DW's knobs (run-config ``afl-dw.*``).

    Parameters
    ----------
    server_lr : float
        ``eta_s``; 0 (default) = ``g(K) = sin(pi / (2 (2K - 1)))`` for ``K`` jobs in flight, the
        largest step that staleness ``K - 1`` leaves stable, about FedAvg's pace per update
        (:mod:`asyncfl.strategies.pace`; a fixed 0.1 lagged FedAvg where client steps are small).
    beta : {"cosine", "linear", "step", "constant"}
        The ``beta(tau)`` family (FedRevive App. I.1; 1-cosine is the paper's).
    max_staleness : float
        ``tau_max``: the staleness at which ``beta`` reaches 1; 0 = 1.5 x the jobs in flight
        (:func:`asyncfl.strategies.staleness.staleness_cutoff`).
    beta_constant : float
        ``beta`` of the constant family.
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows. ``"measured"`` (default): the stable step scaled by ``2 / lambda_bound``
        from the clients' response measured on each client's consecutive jobs
        (:class:`~asyncfl.strategies.pace.ResponseMeter`); it closes the stable step's lag where client steps are
        small (measured in the drop-in study: docs/methods.md, "Default server steps"). ``"stable"``: the
        bound for any client.
    """

    label: ClassVar[str] = "AFLDW"
    prefix: ClassVar[str] = "afl-dw"

    server_lr: float = knob(0.0, minimum=0)
    beta: str = knob("cosine", choices=BETA_SCHEDULES)
    max_staleness: float = knob(150.0, minimum=0)
    beta_constant: float = knob(0.5, minimum=0, maximum=1)
    pace: str = knob("measured", choices=PACES)


class AFLDW(Strategy):
    """AFL-DW (FedRevive paper, Sec. 3.1): down-weight each update by ``1 - beta(tau)``. Knobs: :class:`AFLDWConfig`."""

    run_config_name = "afl-dw"
    config_class = AFLDWConfig
    # the tally of beta(tau) is for the summary; the response meter (pace="measured") sets the step
    state_attributes = ("mixing", "response_meter")

    def __init__(self, server_lr: float = 0.0, beta: str = "cosine", max_staleness: float = 150.0,
                 beta_constant: float = 0.5, pace: str = "measured", **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = AFLDWConfig.from_arguments(locals())
        self._measure_response(pace, server_lr)
        self.mixing = MixingTally()

    def beta_of(self, tau: int) -> float:
        """``beta(tau)`` of the configured schedule."""
        return beta_schedule(self.config.beta, tau, staleness_cutoff(self.config.max_staleness, self.concurrency),
                             self.config.beta_constant)

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        self._observe_response(arrival)
        beta = self.beta_of(arrival.staleness)
        self.mixing.observe_beta(beta)
        return afl_dw_step(current, arrival.delta, self.server_lr, beta)

    @property
    def server_lr(self) -> float:
        """``eta_s`` in use now (the configured one, or the paced ``g(K) * 2 / lambda_bound``)."""
        return self._paced_lr(self.config.server_lr)

    def summary(self) -> dict[str, float | int | str]:
        return {"server-lr": round(self.server_lr, 6), **self.mixing.summary(), **self._pace_summary()}
