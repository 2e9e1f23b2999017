"""A delta-adding strategy's automatic step and buffer: the stable pace, scaled by the clients' measured response.

One piece of :class:`asyncfl.strategies.base.Strategy`; the math is :mod:`asyncfl.strategies.pace`
and :mod:`asyncfl.strategies.response`.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from asyncfl.strategies.arrival import Arrival
from asyncfl.strategies.pace import BUFFER_BOUNDS, auto_buffer_size, per_update_share
from asyncfl.strategies.response import ResponseMeter


class PacedSteps:
    """The automatic server step and buffer size (mixed into :class:`~asyncfl.strategies.base.Strategy`)."""

    #: Jobs in flight (``K``), as the engine told :meth:`on_start`; ``None`` before a run.
    concurrency: int | None = None

    #: Entries of the flat model that are trained (BatchNorm statistics and integer counters excluded), as the
    #: engine sets it before :meth:`on_start`; ``None``: every entry (or not known).
    trained_entries: np.ndarray | None = None

    #: Set by a strategy whose automatic step follows the clients' measured response
    #: (:mod:`asyncfl.strategies.response`); ``None``: the stable pace for any client.
    response_meter: "ResponseMeter | None" = None

    #: ``dispatch_hold`` when the user leaves it unset (``None``): 0 unless the method sets its own.
    auto_dispatch_hold: float = 0.0

    def _start_pacing(self, concurrency: int) -> None:
        """The run's ``K`` is known (:meth:`~asyncfl.strategies.base.Strategy.on_start`): what was resolved from the
        previous one is forgotten (the automatic buffer, the stable shares), to be resolved again once."""
        self.concurrency = concurrency
        self.__dict__.pop("buffer_size", None)
        self.__dict__.pop("_stable_shares", None)

    def arrivals_to_next_version(self) -> int:
        """Accepted arrivals that make the next server version (a buffer's free places; 1 where every arrival
        steps); 0: not known ahead, so the engine never holds a freed slot for it (``dispatch-hold``)."""
        return 0

    @classmethod
    def says_when_it_steps(cls) -> bool:
        """Whether :meth:`arrivals_to_next_version` is known, so that ``dispatch-hold`` can act."""
        return (not getattr(cls, "synchronous", False)
                and cls.arrivals_to_next_version is not PacedSteps.arrivals_to_next_version)

    def _measure_response(self, pace: str, server_lr: float) -> None:
        """Keep a :class:`~asyncfl.strategies.response.ResponseMeter` when the automatic step (``server_lr=0``)
        follows the clients' measured response (``pace="measured"``)."""
        self.response_meter = ResponseMeter() if pace == "measured" and not server_lr else None

    def _observe_response(self, arrival: Arrival) -> None:
        """Feed ``arrival`` to the response meter, if any (on the trained entries only)."""
        if self.response_meter is not None:
            self.response_meter.observe(arrival, self.trained_entries)

    def _pace_summary(self) -> dict[str, float | int | None]:
        """The measured pace's figures for :meth:`summary` (none without a meter)."""
        return self.response_meter.summary() if self.response_meter is not None else {}

    def _paced_lr(self, configured: float, updates_per_step: int = 1, extra_delay: float = 0.0) -> float:
        """The server learning rate to use: ``configured``, or when it is 0 (auto) the stable pace for ``K`` jobs
        in flight, ``min(1, B * g(K, B))``, scaled by ``2 / lambda_bound`` when a response meter measures the
        clients (:func:`asyncfl.strategies.pace.paced_server_lr`), with ``extra_delay`` updates added to the delay
        ``d`` (CA2FL's :func:`~asyncfl.strategies.pace.cache_lag`). Before :meth:`on_start` (no ``K`` known) auto
        is 1. The share ``g`` depends on ``K`` and the step's size only: worked out once per run and step size."""
        if configured > 0:
            return configured
        shares = self.__dict__.setdefault("_stable_shares", {})
        share = shares.get((updates_per_step, extra_delay))
        if share is None:
            share = shares[updates_per_step, extra_delay] = per_update_share(
                self.concurrency or updates_per_step, updates_per_step, extra_delay)
        meter = self.response_meter
        bound = meter.bound if meter is not None else 2.0
        return min(1.0, updates_per_step * (share * 2.0 / bound))  # paced_server_lr's arithmetic, in its order

    @cached_property
    def buffer_size(self) -> int:
        """Updates per server step of a buffered method (FedBuff, CA2FL, FADAS, FedEcho: its ``config.buffer_size``),
        or when that is 0 (auto) ``K // 4`` within ``[2, 10]`` for ``K`` jobs in flight
        (:func:`asyncfl.strategies.pace.auto_buffer_size`). Before :meth:`on_start` auto is 2. Resolved once
        per run (:meth:`_start_pacing` forgets it)."""
        configured = getattr(self.config, "buffer_size", None)
        if configured is None:
            raise AttributeError(f"{type(self).__name__} does not buffer updates")
        if configured > 0:
            return configured
        return auto_buffer_size(self.concurrency) if self.concurrency else BUFFER_BOUNDS[0]
