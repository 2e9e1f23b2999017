"""FedAsync: mix every arrival into the global model at once.

Xie, Koyejo and Gupta, 2019, "Asynchronous Federated Optimization":
``x <- (1 - alpha_t) x + alpha_t x_client`` with ``alpha_t = alpha * s(tau)``
and ``s`` one of the staleness functions in :mod:`asyncfl.strategies.staleness`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import StrategyConfig, knob
from asyncfl.strategies.staleness import FEDASYNC_STALENESS_FUNCTIONS, fedasync_staleness


def fedasync_mix(current: np.ndarray, client: np.ndarray, alpha_t: float) -> np.ndarray:
    """``(1 - alpha_t) * current + alpha_t * client``."""
    return current + np.float32(alpha_t) * (client - current)


@dataclass(frozen=True)
class FedAsyncConfig(StrategyConfig):
    """FedAsync's knobs (run-config ``fedasync.*``).

    Parameters
    ----------
    alpha : float
        ``alpha``: the mixing weight of a fresh client model, in (0, 1]. Default 1: a stale model is
        mixed in by ``(1 + tau)^-1/2`` alone. Xie et al.'s 0.6 (a keyword) lags FedAvg where client
        steps are small and is level with 1 elsewhere (measured in the drop-in study: docs/methods.md).
    staleness : {"constant", "polynomial", "hinge"}
        The staleness function ``s(tau)`` (Xie et al., Sec. 5.2).
    staleness_decay : float
        ``a``: the exponent of ``(tau + 1)^-a`` (polynomial) or the slope of the hinge.
    staleness_cutoff : float
        ``b``: the hinge's staleness below which ``s = 1``.
    """

    label: ClassVar[str] = "FedAsync"
    prefix: ClassVar[str] = "fedasync"

    alpha: float = knob(1.0, above=0, maximum=1)
    staleness: str = knob("polynomial", choices=FEDASYNC_STALENESS_FUNCTIONS)
    staleness_decay: float = knob(0.5, minimum=0)
    staleness_cutoff: float = knob(4.0, minimum=0)


class FedAsync(Strategy):
    """FedAsync (Xie et al., 2019) with constant, polynomial or hinge staleness. Knobs: :class:`FedAsyncConfig`."""

    run_config_name = "fedasync"
    config_class = FedAsyncConfig
    state_attributes = ()  # each update depends on the arrival and the current model only

    def __init__(self, alpha: float = 1.0, staleness: str = "polynomial", staleness_decay: float = 0.5,
                 staleness_cutoff: float = 4.0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedAsyncConfig.from_arguments(locals())

    def mixing_weight(self, tau: int) -> float:
        """``alpha_t = alpha * s(tau)``."""
        cfg = self.config
        return cfg.alpha * fedasync_staleness(cfg.staleness, tau, cfg.staleness_decay, cfg.staleness_cutoff)

    def update_coefficient(self, arrival: Arrival) -> float:
        """``alpha_t``: the mix moves the model by ``alpha_t`` times the update (and by public models' difference)."""
        return self.mixing_weight(arrival.staleness)

    def arrivals_to_next_version(self) -> int:
        return 1

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        return fedasync_mix(current, arrival.weights, self.mixing_weight(arrival.staleness))
