"""FADAS: federated adaptive asynchronous optimization.

Wang, Wang, Lu and Chen, ICML 2024, "FADAS: Towards Federated Adaptive
Asynchronous Optimization". Buffered like FedBuff; the mean of M buffered
updates ``Delta_t`` drives a server AMSGrad step:

``m <- b1 m + (1 - b1) Delta_t``; ``v <- b2 v + (1 - b2) Delta_t^2``;
``v_hat <- max(v_hat, v)``; ``x <- x + eta_t m / (sqrt(v_hat) + eps)``

with the delay-adaptive rate ``eta_t = eta`` while the largest staleness in the
buffer ``tau_max <= tau_c`` and ``eta_t = eta / tau_max`` beyond it.

Default ``M``: ``K // 4`` within ``[2, 10]`` for ``K`` jobs in flight, as FedBuff's
(:func:`asyncfl.strategies.pace.auto_buffer_size`); the paper's buffer is a keyword.

Default ``beta1 = 0.5`` (the paper's 0.9 is a keyword): the server momentum's lag adds
to the staleness. An average over ``1 / (1 - beta1)`` steps applies each buffered update
``beta1 / (1 - beta1)`` steps late on average, 9 steps (18 updates at ``M = 2``) at 0.9
on top of the ``K - 1`` updates an update is already stale; asynchrony itself acts as
momentum (Mitliagkas et al., 2016, "Asynchrony begets momentum"). The smaller lag brought
FADAS level with FedAvg where 0.9 left it behind (measured in the drop-in study: docs/methods.md,
"Default server steps"); ``tests/strategies/test_pace.py`` shows the lag on a stale quadratic.

AMSGrad steps the trained entries only. BatchNorm running statistics and counters are
not trained by gradients (the paper's models carry none); they take FedBuff's stable
step on the buffered mean update, as FedBuff moves them. Normalised, a statistic moved
by about ``eta`` per step whatever its value (0.06 in a 60-step run, from a running
variance of 1). On a BatchNorm CNN FedBuff's step on them did better than AMSGrad's
(measured: docs/methods.md, the ``fadas`` row; benchmarks/dropin/README.md, "FADAS: half
the server momentum, BatchNorm statistics at FedBuff's step").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.settings import StrategyConfig, knob


def delay_adaptive_lr(server_lr: float, tau_max: int, tau_c: int) -> float:
    """``server_lr`` if ``tau_max <= tau_c`` else ``server_lr / tau_max``."""
    return server_lr if tau_max <= tau_c else server_lr / tau_max


class AMSGrad:
    """Server-side AMSGrad state over flat vectors (FADAS, Algorithm 1)."""

    state_attributes = ("m", "v", "v_hat")

    def __init__(self, beta1: float, beta2: float, eps: float) -> None:
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.v_hat: np.ndarray | None = None

    def direction(self, update: np.ndarray) -> np.ndarray:
        """Fold ``update`` into the moments and return ``m / (sqrt(v_hat) + eps)``."""
        if self.m is None:
            self.m, self.v, self.v_hat = (np.zeros_like(update) for _ in range(3))
        self.m *= np.float32(self.beta1)
        self.m += np.float32(1.0 - self.beta1) * update
        self.v *= np.float32(self.beta2)
        self.v += np.float32(1.0 - self.beta2) * update * update
        np.maximum(self.v_hat, self.v, out=self.v_hat)
        return self.m / (np.sqrt(self.v_hat) + np.float32(self.eps))


@dataclass(frozen=True)
class FADASConfig(StrategyConfig):
    """FADAS's knobs (run-config ``fadas.*``).

    Parameters
    ----------
    buffer_size : int
        ``M``: arrivals per server step; 0 (default) = ``K // 4`` within ``[2, 10]`` for ``K`` jobs in
        flight. The AMSGrad step moves each coordinate by about ``eta`` whatever the updates' size, so
        ``M`` sets how fast FADAS moves per client update: a smaller ``M`` moves it more often.
    server_lr : float
        ``eta`` (the paper's 1e-3).
    beta1 : float
        AMSGrad's first-moment factor; default 0.5, the paper's 0.9 lags stale updates further (module
        docstring: its measurements).
    beta2, epsilon : float
        AMSGrad's second-moment factor (the paper's 0.99) and ``eps``.
    staleness_threshold : int
        ``tau_c``: above it the step is ``eta / tau_max`` (delay-adaptive rate).
    """

    label: ClassVar[str] = "FADAS"
    prefix: ClassVar[str] = "fadas"

    buffer_size: int = knob(0, minimum=0)
    server_lr: float = knob(1e-3, above=0)
    beta1: float = knob(0.5, minimum=0, below=1)
    beta2: float = knob(0.99, minimum=0, below=1)
    epsilon: float = knob(1e-8, above=0)
    staleness_threshold: int = knob(5, minimum=0)


class FADAS(Strategy):
    """FADAS (Wang et al., 2024): buffered updates, AMSGrad server step, delay-adaptive rate. Knobs: :class:`FADASConfig`."""

    run_config_name = "fadas"
    config_class = FADASConfig
    state_attributes = ("optimizer", "_sum", "_count", "_tau_max", "aggregations", "reduced_steps")

    def __init__(self, buffer_size: int = 0, server_lr: float = 1e-3, beta1: float = 0.5, beta2: float = 0.99,
                 epsilon: float = 1e-8, staleness_threshold: int = 5, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FADASConfig.from_arguments(locals())
        self.optimizer = AMSGrad(beta1, beta2, epsilon)
        self._sum: np.ndarray | None = None
        self._count = 0
        self._tau_max = 0
        self.aggregations = 0
        self.reduced_steps = 0

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        if self._sum is None:
            self._sum = np.zeros_like(arrival.weights)
        self._sum += arrival.weights
        self._sum -= arrival.base
        self._tau_max = max(self._tau_max, arrival.staleness)
        self._count += 1
        buffer_size = self.buffer_size
        if self._count < buffer_size:
            return None
        lr = delay_adaptive_lr(self.config.server_lr, self._tau_max, self.config.staleness_threshold)
        self.reduced_steps += lr < self.config.server_lr
        mean_update = self._sum / np.float32(buffer_size)
        trained = self.trained_entries
        if trained is None:
            new = current + np.float32(lr) * self.optimizer.direction(mean_update)
        else:
            new = current + np.float32(self._paced_lr(0.0, buffer_size)) * mean_update  # statistics: FedBuff's step
            new[trained] = current[trained] + np.float32(lr) * self.optimizer.direction(mean_update[trained])
        self._sum[:] = 0.0
        self._count, self._tau_max = 0, 0
        self.aggregations += 1
        return new

    def summary(self) -> dict[str, float | int | str]:
        return {"aggregations": self.aggregations, "buffer-size": self.buffer_size,
                "delay-reduced-steps": int(self.reduced_steps)}
