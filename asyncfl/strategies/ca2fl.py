"""CA2FL: buffered asynchronous FL with cached update calibration.

Wang, Cao, Wu, Chen and Chen, ICLR 2024, "Tackling the Data Heterogeneity in
Asynchronous Federated Learning with Cached Update Calibration". The server
caches each client's latest update ``h_i`` (zero before its first arrival) and
their mean ``h_bar`` over all N clients. On an arrival from client i:
``S += Delta_i - h_i`` and ``h_i <- Delta_i``. After M arrivals:
``x <- x + eta * (h_bar + S / M)``, then ``S <- 0`` and ``h_bar`` is refreshed.

The cache costs one model-sized vector per client that has reported:
:attr:`CA2FL.cache_bytes`. Default ``M``: ``K // 4`` within ``[2, 10]`` for ``K`` jobs in flight,
as FedBuff's (:func:`asyncfl.strategies.pace.auto_buffer_size`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.pace import PACES, cache_lag
from asyncfl.strategies.settings import StrategyConfig, knob


def ca2fl_step(current: np.ndarray, h_bar: np.ndarray, calibrated_sum: np.ndarray, buffer_size: int,
               server_lr: float) -> np.ndarray:
    """``current + server_lr * (h_bar + calibrated_sum / buffer_size)``."""
    return current + np.float32(server_lr) * (h_bar + calibrated_sum / np.float32(buffer_size))


@dataclass(frozen=True)
class CA2FLConfig(StrategyConfig):
    """CA2FL's knobs (run-config ``ca2fl.*``).

    Parameters
    ----------
    buffer_size : int
        ``M``: arrivals per global update; 0 (default) = ``K // 4`` within ``[2, 10]`` for ``K`` jobs in
        flight, as FedBuff's (the paper's ``M = 5`` is a keyword).
    server_lr : float
        ``eta``; 0 (default) = ``min(1, M * g)``, the stable pace per update for the delay of ``K`` jobs in
        flight plus the cache's lag (:func:`asyncfl.strategies.pace.cache_lag`: each cached update is
        re-applied at every step until its client returns, so CA2FL takes 0.69 times FedBuff's step at
        ``K = 8, M = 2``; at FedBuff's step it oscillated). The paper's setting is ``server_lr=1.0``, with
        which CA2FL diverged at equal speeds (measured in the drop-in study: docs/methods.md).
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows, as for FedBuff (:class:`asyncfl.strategies.fedbuff.FedBuffConfig`):
        the clients' measured response (default) or the bound for any client, which lags FedAvg where
        client steps are small. The cache's lag makes CA2FL start slower than FedBuff; short equal-speed
        runs show it (measured in the drop-in study: docs/methods.md).
    """

    label: ClassVar[str] = "CA2FL"
    prefix: ClassVar[str] = "ca2fl"

    buffer_size: int = knob(0, minimum=0)
    server_lr: float = knob(0.0, minimum=0)
    pace: str = knob("measured", choices=PACES)


class CA2FL(Strategy):
    """CA2FL (Wang et al., 2024): FedBuff whose step is calibrated by cached client updates. Knobs: :class:`CA2FLConfig`."""

    run_config_name = "ca2fl"
    config_class = CA2FLConfig
    state_attributes = ("_cache", "_cache_sum", "_h_bar", "_sum", "_count", "aggregations", "response_meter")

    def __init__(self, buffer_size: int = 0, server_lr: float = 0.0, pace: str = "measured",
                 **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = CA2FLConfig.from_arguments(locals())
        self._measure_response(pace, server_lr)
        self.num_clients = 0
        self._cache: dict[int, np.ndarray] = {}
        self._cache_sum: np.ndarray | None = None
        self._h_bar: np.ndarray | None = None
        self._sum: np.ndarray | None = None
        self._count = 0
        self.aggregations = 0

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        super().on_start(num_clients, concurrency)
        self.num_clients = num_clients

    @property
    def cache_bytes(self) -> int:
        """Memory held by the per-client cache."""
        return sum(h.nbytes for h in self._cache.values())

    @property
    def server_lr(self) -> float:
        """``eta`` in use now: the configured one, or the paced ``min(1, M * g * 2 / lambda_bound)`` with ``g`` the
        share for the delay ``d(K, M)`` plus the cache's lag ``K / 2 - M / 4`` (:func:`asyncfl.strategies.pace.cache_lag`)."""
        buffer_size = self.buffer_size
        return self._paced_lr(self.config.server_lr, buffer_size, cache_lag(self.concurrency or buffer_size, buffer_size))

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        self._observe_response(arrival)
        delta = arrival.delta
        if self._sum is None:
            self._sum = np.zeros_like(delta)
            self._cache_sum = np.zeros_like(delta)
            self._h_bar = np.zeros_like(delta)
        previous = self._cache.get(arrival.client_index)
        self._sum += delta
        self._cache_sum += delta
        if previous is not None:
            self._sum -= previous
            self._cache_sum -= previous
        self._cache[arrival.client_index] = delta
        self._count += 1
        if self._count < self.buffer_size:
            return None
        new = ca2fl_step(current, self._h_bar, self._sum, self.buffer_size, self.server_lr)
        self._sum[:] = 0.0
        self._count = 0
        self._h_bar = self._cache_sum / np.float32(max(self.num_clients, len(self._cache)))
        self.aggregations += 1
        return new

    def summary(self) -> dict[str, float | int | str]:
        return {"aggregations": self.aggregations, "buffer-size": self.buffer_size, "server-lr": round(self.server_lr, 6),
                "cache-clients": len(self._cache),
                "cache-mb": round(self.cache_bytes / 2**20, 2), **self._pace_summary()}
