"""FedBuff: buffered asynchronous aggregation.

Nguyen et al., 2022, "Federated Learning with Buffered Asynchronous
Aggregation"; FedRevive paper Eq. (2): updates are buffered and, when exactly
``B`` have arrived, ``x <- x + eta_s / B * sum_{Delta in buffer} Delta``.
Optionally each update is scaled by ``1 / sqrt(1 + tau)`` as in Nguyen et al.

Defaults: ``B = K // 4`` within ``[2, 10]`` for ``K`` jobs in flight
(:func:`asyncfl.strategies.pace.auto_buffer_size`), and ``eta_s = min(1, B * g)`` with ``g`` the
largest per-update share that the staleness of ``K`` jobs leaves stable, up to twice that where the
clients' measured response allows (:mod:`asyncfl.strategies.pace`).
Under ``start()`` a freed slot waits up to a tenth of a job for the buffer's step (run option
``dispatch_hold``; docs/methods.md, "Dispatch hold"). The paper's setting is ``buffer_size=10,
server_lr=1.0`` with ``dispatch_hold=0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from asyncfl.errors import ConfigError
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.pace import PACES
from asyncfl.strategies.settings import StrategyConfig, knob

STALENESS_WEIGHTINGS = ("none", "sqrt")
AGGREGATIONS = ("mean", "median", "trimmed-mean")
COMPENSATIONS = ("none", "response")
#: The share of the buffer's updates "trimmed-mean" drops from each side, per entry (Flower's FedTrimmedAvg's beta).
TRIM_FRACTION = 0.2


def fedbuff_step(current: np.ndarray, buffered_sum: np.ndarray, buffer_size: int, server_lr: float) -> np.ndarray:
    """``current + server_lr / buffer_size * buffered_sum``."""
    return current + np.float32(server_lr / buffer_size) * buffered_sum


def compensated_delta(delta: np.ndarray, base: np.ndarray, current: np.ndarray, response: float) -> np.ndarray:
    """``Delta - lambda (x_now - x_base)``: to first order, the update the client would have sent had it started
    from the model in use now, with ``lambda`` the clients' response along the server's moves.

    A client's update depends on its start model, ``Delta(x) ~ -A (x - x*)``; between its dispatch
    (``x_base``) and its arrival the server moved to ``x_now``, so ``Delta(x_now) ~ Delta(x_base) - A (x_now -
    x_base)``. The secant ``lambda`` of :class:`~asyncfl.strategies.pace.ResponseMeter` is ``A``'s Rayleigh
    quotient along exactly those moves (a scalar stand-in for the matrix, as Zheng et al., 2017, "Asynchronous
    stochastic gradient descent with delay compensation", use a diagonal one). Where a client's update carries it
    most of the way to its own optimum (``lambda`` near 1) the stale start is then almost forgotten, as in
    FedAsync's mixing of models; where it is a small step (``lambda`` near 0), the delta is left as it is.
    """
    return delta - np.float32(response) * (current - base)


def robust_combine(rows: np.ndarray, rule: str) -> np.ndarray:
    """The buffer's updates (``rows``, one per update) combined entry by entry: their ``mean``, ``median``
    (Yin et al., 2018, "Byzantine-robust distributed learning", coordinate-wise median) or ``trimmed-mean``
    (the same paper's coordinate-wise trimmed mean: ``floor(0.2 B)`` largest and smallest values dropped)."""
    if rule == "mean":
        return rows.mean(axis=0)
    if rule == "median":
        return np.median(rows, axis=0).astype(rows.dtype, copy=False)
    if rule == "trimmed-mean":
        cut = int(TRIM_FRACTION * len(rows))
        kept = np.sort(rows, axis=0)[cut:len(rows) - cut]
        return kept.mean(axis=0)
    raise ConfigError(f"unknown FedBuff aggregation {rule!r}; valid: {', '.join(AGGREGATIONS)}")


def fedbuff_weight(tau: int, weighting: str) -> float:
    """Scale of a ``tau``-stale update: 1, or ``1 / sqrt(1 + tau)``."""
    if weighting == "none":
        return 1.0
    if weighting == "sqrt":
        return 1.0 / math.sqrt(1.0 + tau)
    raise ConfigError(f"unknown FedBuff staleness weighting {weighting!r}; valid: {', '.join(STALENESS_WEIGHTINGS)}")


@dataclass(frozen=True)
class FedBuffConfig(StrategyConfig):
    """FedBuff's knobs (run-config ``fedbuff.*``).

    Parameters
    ----------
    buffer_size : int
        ``B``: updates per aggregation; 0 (default) = ``K // 4`` within ``[2, 10]`` for ``K`` jobs in
        flight (:func:`asyncfl.strategies.pace.auto_buffer_size`: a buffer close to ``K`` resonates at
        equal speeds).
    server_lr : float
        ``eta_s``; 0 (default) = ``min(1, B * g(K, B))``, the stable pace of
        :mod:`asyncfl.strategies.pace` (0.41 for ``B = 5, K = 8``), scaled by the measured response
        (``pace``). The paper's ``eta_s = 1`` (a keyword) oscillates at ``B = 5, K = 8`` with equal
        speeds (measured in the drop-in study: docs/methods.md, "Default server steps").
    compensation : {"none", "response"}
        ``"response"``: each update corrected for its staleness with the clients' measured response,
        ``Delta - lambda_hat (x_now - x_base)`` (:func:`compensated_delta`; ``lambda_hat`` clipped to ``[0, 1]``,
        none before the meter has its first readings). Needs the measured pace (its meter).
    staleness_weighting : {"none", "sqrt"}
        Scale each update by 1, or by ``1 / sqrt(1 + tau)``.
    aggregation : {"mean", "median", "trimmed-mean"}
        How the buffer's updates combine: their mean (FedBuff; the buffer is a running sum, one model of
        memory), or, robust to a minority of faulty updates, their coordinate-wise median or trimmed mean
        (:func:`robust_combine`; the buffer then holds its ``B`` updates). Under non-IID data the robust
        rules also discard honest minority directions, so they learn slower where clients differ.
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows. ``"measured"`` (default): the stable step scaled by
        ``2 / lambda_bound``, ``lambda_bound`` from the clients' response measured on each client's
        consecutive jobs (:class:`~asyncfl.strategies.pace.ResponseMeter`; at most twice the stable step). ``"stable"``:
        the bound for any client, which lags FedAvg where client steps are small (docs/methods.md).
    """

    label: ClassVar[str] = "FedBuff"
    prefix: ClassVar[str] = "fedbuff"

    buffer_size: int = knob(0, minimum=0)
    server_lr: float = knob(0.0, minimum=0)
    staleness_weighting: str = knob("none", choices=STALENESS_WEIGHTINGS)
    pace: str = knob("measured", choices=PACES)
    aggregation: str = knob("mean", choices=AGGREGATIONS)
    compensation: str = knob("none", choices=COMPENSATIONS)

    def check(self) -> None:
        if self.compensation == "response" and (self.pace != "measured" or self.server_lr > 0):
            self.fail("compensation", "= 'response' reads the clients' measured response: it needs pace='measured' "
                      "and the automatic server_lr (0)")


class FedBuff(Strategy):
    """FedBuff (Nguyen et al., 2022): aggregate exactly ``buffer_size`` updates at a time.

    The buffer holds a running sum, so memory is one model whatever ``B`` is.
    With ``buffer_size=1`` and ``server_lr=1`` it is plain asynchronous FedAvg; the defaults
    ``buffer_size=0, server_lr=0`` set ``B`` and ``eta_s`` from the concurrency ``K``
    (:func:`asyncfl.strategies.pace.auto_buffer_size`, :func:`asyncfl.strategies.pace.paced_server_lr`).
    Knobs: :class:`FedBuffConfig`.
    """

    run_config_name = "fedbuff"
    config_class = FedBuffConfig
    state_attributes = ("_sum", "_count", "aggregations", "response_meter")
    honours_aggregate_train = True  # at each buffer step (asyncfl.strategies.train_hook)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.overrides_aggregate_train() and "_held" not in cls.state_attributes:  # its buffer's arrivals too
            cls.state_attributes = (*cls.state_attributes, "_held")

    def __init__(self, buffer_size: int = 0, server_lr: float = 0.0, staleness_weighting: str = "none",
                 pace: str = "measured", aggregation: str = "mean", compensation: str = "none",
                 **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedBuffConfig.from_arguments(locals())
        self._measure_response(pace, server_lr)
        self._sum: np.ndarray | None = None
        self._count = 0
        self._held: list[Arrival] = []  # the buffer's arrivals, kept for an aggregate_train override only
        self.aggregations = 0

    @property
    def buffered(self) -> int:
        """Updates waiting in the buffer."""
        return self._count

    #: A freed slot waits up to a tenth of a job for the buffer's step (``dispatch_hold=None``; docs/methods.md,
    #: "Dispatch hold"): the buffer's arrivals come together at equal speeds, so its next job starts from the
    #: model with its own update in it; with mixed speeds a longer wait idles the fast clients.
    auto_dispatch_hold = 0.1

    def arrivals_to_next_version(self) -> int:
        return self.buffer_size - self._count

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        self._observe_response(arrival)
        scale = np.float32(fedbuff_weight(arrival.staleness, self.config.staleness_weighting))
        hooked = self.aggregation_hook is not None  # an aggregate_train override takes the buffer's step
        robust = self.config.aggregation != "mean" or hooked
        response = self._compensating_response() if self.config.compensation == "response" else 0.0
        if hooked:
            self._check_held()
            self._held.append(arrival)
        if robust:  # robust rules (and an override's super()) need every update: _sum holds them as rows
            row = (scale * self._update(arrival, current, response))[None, :]
            self._sum = row if self._sum is None else np.concatenate([self._sum, row])
        else:
            if self._sum is None:
                self._sum = np.zeros_like(arrival.weights)
            if scale == 1.0 and not response:  # in place, no temporary: the hot path for the default setting
                self._sum += arrival.weights
                self._sum -= arrival.base
            else:
                self._sum += scale * self._update(arrival, current, response)
        self._count += 1
        if self._count < self.buffer_size:
            return None
        if hooked:
            rows, held = self._sum, self._held
            new = self.aggregation_hook.step(self, held, lambda chosen: self._rows_step(
                current, self._rows_as_held_now(rows, held, chosen)))
        elif robust:
            new = self._rows_step(current, self._sum)
        else:
            new = fedbuff_step(current, self._sum, self.buffer_size, self.server_lr)
        self._sum, self._count, self._held = None, 0, []
        self.aggregations += 1
        return new

    def _check_held(self) -> None:
        """Refuse a buffer whose kept arrivals are not its updates' (a resumed subclass whose own state_dict left
        ``_held`` out): an aggregate_train override would be handed other replies than the rows it aggregates."""
        rows = 0 if self._sum is None else len(self._sum)
        if len(self._held) != self._count or rows != self._count:
            from asyncfl.state import StateError

            name = type(self).__name__
            raise StateError(f"{name}'s buffer holds {self._count} updates but {len(self._held)} of their arrivals "
                             f"(_held) and {rows} rows (_sum): {name} overrides aggregate_train, so its state must "
                             "keep FedBuff's _held and _sum with _count (a custom state_dict/load_state_dict must "
                             "save and restore them, as FedBuff.state_attributes does)")

    def _rows_as_held_now(self, rows: np.ndarray, held: list[Arrival],
                          chosen: list[tuple[int, Arrival]]) -> np.ndarray:
        """The buffer's rows at the chosen positions; a row whose reply an aggregate_train override changed is moved
        by its scaled change of weights, ``w(tau) (Delta' - Delta)``: the reply's model as an update against its
        job's base, corrected as the row was (:meth:`_update`)."""
        out = rows[[i for i, _ in chosen]]
        for k, (i, arrival) in enumerate(chosen):
            if arrival.weights is not held[i].weights:
                scale = np.float32(fedbuff_weight(arrival.staleness, self.config.staleness_weighting))
                out[k] += scale * (arrival.weights - held[i].weights)
        return out

    def _rows_step(self, current: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The step from the buffer's updates kept as rows: ``current + eta_s * combine(rows)``."""
        return current + np.float32(self.server_lr) * robust_combine(rows, self.config.aggregation)

    @staticmethod
    def _update(arrival: Arrival, current: np.ndarray, response: float) -> np.ndarray:
        """The arrival's delta, corrected for its staleness when ``response`` > 0 (:func:`compensated_delta`)."""
        return compensated_delta(arrival.delta, arrival.base, current, response) if response else arrival.delta

    def _compensating_response(self) -> float:
        """``lambda_hat`` clipped to ``[0, 1]`` when the meter reads one (``compensation="response"``), else 0."""
        if self.response_meter is None:
            return 0.0
        response = self.response_meter.response
        return 0.0 if response is None else min(1.0, max(0.0, response))

    def update_coefficient(self, arrival: Arrival) -> float:
        """``eta_s w(tau) / B``: the share of ``arrival.delta`` in the aggregation it joins (None for a robust
        rule: its step is no weighted sum)."""
        if self.config.aggregation != "mean":
            return None
        scale = fedbuff_weight(arrival.staleness, self.config.staleness_weighting)
        return self.server_lr * scale / self.buffer_size

    @property
    def server_lr(self) -> float:
        """``eta_s`` in use now (the configured one, or the paced ``min(1, B * g(K, B) * 2 / lambda_bound)``)."""
        return self._paced_lr(self.config.server_lr, self.buffer_size)

    def summary(self) -> dict[str, float | int | str]:
        return {"aggregations": self.aggregations, "buffer-size": self.buffer_size, "buffered-at-end": self._count,
                "server-lr": round(self.server_lr, 6), **self._pace_summary()}
