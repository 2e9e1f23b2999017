"""AFL-DW: asynchronous FL with staleness down-weighting.

The ablation of the FedRevive paper (Sec. 3.1, "AFL-DW"): Eq. (3) without the
distilled term, ``x <- x + eta_s * (1 - beta(tau)) * Delta``, with the same
``beta`` schedule as FedRevive (1-cosine by default, Appendix I.1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.staleness import beta_schedule


def afl_dw_step(current: np.ndarray, delta: np.ndarray, server_lr: float, beta: float) -> np.ndarray:
    """``current + server_lr * (1 - beta) * delta``."""
    return current + np.float32(server_lr * (1.0 - beta)) * delta


class AFLDW(Strategy):
    """AFL-DW (FedRevive paper, Sec. 3.1): down-weight each update by ``1 - beta(tau)``."""

    def __init__(self, server_lr: float = 0.1, beta: str = "cosine", tau_max: float = 150.0, beta_constant: float = 0.5, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        if tau_max <= 0:
            raise ValueError(f"afl-dw.tau-max must be > 0, got {tau_max}")
        if not 0.0 <= beta_constant <= 1.0:
            raise ValueError(f"afl-dw.beta-constant must be in [0, 1], got {beta_constant}")
        beta_schedule(beta, 0, tau_max, beta_constant)
        self.server_lr = server_lr
        self.beta = beta
        self.tau_max = tau_max
        self.beta_constant = beta_constant

    def beta_of(self, tau: int) -> float:
        """``beta(tau)`` of the configured schedule."""
        return beta_schedule(self.beta, tau, self.tau_max, self.beta_constant)

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        return afl_dw_step(current, arrival.delta, self.server_lr, self.beta_of(arrival.staleness))
