"""The default server step of methods that add client deltas: as large as staleness allows.

With ``K`` jobs in flight and equal speeds, an update is ``K - 1`` accepted updates stale
when it lands, and waits ``(B - 1) / 2`` more on average in a buffer of ``B`` before it is
applied: a delay of ``d = K - 1 + (B - 1) / 2`` updates. If every update adds ``g`` times
its delta, a direction on which a client's update moves the model by ``lambda`` times its
distance to the minimum follows ``x[t+1] = x[t] - g * lambda * x[t-d]``; that recursion is
stable exactly when ``g * lambda < 2 sin(pi / (2 (2d + 1)))``. A local optimizer that
converges on its own has ``lambda < 2``, so

    ``g = sin(pi / (2 (2d + 1)))``  (about ``0.8 / K`` for large ``K``)

is the largest step that stays stable for every such client, whatever the app. It is close
to FedAvg's pace (one mean update per ``K`` updates, ``g = 1 / K``), which sits on the edge:
a FedBuff step of ``B / K`` oscillates at equal speeds where ``B * g`` does not, and the papers'
fixed steps (FedBuff's ``eta_s = 1``: 1.6 mean updates per job at ``B = 5, K = 8``) diverge
(measured in the drop-in study: docs/methods.md, "Default server steps"). With heterogeneous
speeds the delays spread out and the system is more forgiving; equal speeds (e.g. Ray running
same-sized jobs in turn) are the worst case. A method's paper setting stays a keyword away.

That bound is paid in rounds where learning is slow (small client steps: SGD at a small lr).
With ``pace="measured"`` (the default of FedBuff, CA2FL, AFL-DW, FedEcho and FedRevive) a method
measures the clients' response from each client's consecutive jobs
(:class:`ResponseMeter`, below) and guards against
``lambda_bound = min(2, max(1, 3 * lambda_hat))`` instead of 2: up to twice the stable step
for clients that do not overshoot.

The buffer matters as much as the step. With ``B`` close to ``K`` (FedBuff's former ``B = 5`` at
``K = 6``) every update of an aggregation started from the previous version: at equal speeds all
of them are one version stale, and the measured pace oscillated in short runs.
:func:`auto_buffer_size` keeps ``B`` near ``K / 4``, where neither pace does.

The measured response
---------------------
How strongly the clients' updates respond to the model they start from, measured from arrivals.

The stable pace (above) assumes the worst client: one whose update
moves the model ``lambda = 2`` times its distance to the minimum (a momentum optimizer that
overshoots). Most apps are far from it, and where learning is slow (small client learning
rates) that bound costs rounds (measured in the drop-in study: docs/methods.md).

Two updates of the same client that started from different global models ``x_a`` and ``x_b``
measure its response along the server's own moves (a secant, as in Barzilai and Borwein, 1988):
with ``Delta_c(x) ~ -A_c (x - x_c*) + noise``,

    ``lambda_hat = -<Delta_a - Delta_b, x_a - x_b> / ||x_a - x_b||^2``

is the Rayleigh quotient of ``A_c`` along ``x_a - x_b``. The pair is one client's consecutive
jobs. Two different clients' updates also differ by their own optima (non-IID data, or only
minibatch luck), and since the server's recent moves are made of those same updates, that
difference correlates with ``x_a - x_b``: pairing each arrival with the latest one from another model
under-reads the response when speeds are equal, and a method that steps per arrival (AFL-DW) then takes too
large a step; the same client's consecutive jobs do not share that bias (the drop-in study's figures:
docs/methods.md).
Summing numerator and denominator over recent pairs (each decayed by ``decay`` per pair)
weights a pair by ``||x_a - x_b||^2``, so pairs from nearby models, whose secant is mostly
client noise, count little. When the server starts to oscillate, its moves line up with the
direction that oscillates and ``lambda_hat`` rises, so a pace set from it slows down on its own.
A client's own minibatch noise in ``Delta_b``, which the server's move carries, biases the
reading up: toward the safe side.

A strategy gets both through :class:`PacedSteps` (mixed into :class:`~asyncfl.strategies.base.Strategy`).
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from asyncfl.errors import ConfigError
from asyncfl.strategies.arrival import Arrival

#: What a server step of 0 (automatic) follows: the clients' measured response, or the bound for any client.
PACES = ("measured", "stable")
#: The automatic buffer's bounds: two updates at least (one would let the measured pace read a client's response
#: to its own previous update, see :func:`auto_buffer_size`), ten at most (the FedBuff paper's buffer).
BUFFER_BOUNDS = (2, 10)


def auto_buffer_size(concurrency: int) -> int:
    """A buffered method's default ``B`` for ``K`` jobs in flight: ``K // 4`` within ``[2, 10]``, at most ``K``.

    With ``B`` close to ``K`` nearly every update of a step started from the previous version: at
    equal speeds the staleness is one version for all of them, a single sharp delay on which the
    step resonates, where ``K / B >= 4`` spreads the delays over several versions (measured in the
    drop-in study: docs/methods.md). ``B >= 2`` because with ``B = 1`` and the measured pace a client
    re-dispatched from the model its own update made reads its own delta back as no response.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency={concurrency} must be >= 1")
    low, high = BUFFER_BOUNDS
    return min(concurrency, high, max(low, concurrency // 4))


def update_delay(concurrency: int, updates_per_step: int = 1) -> float:
    """``d = K - 1 + (B - 1) / 2``: accepted updates between a job's dispatch and its update's application."""
    if concurrency < 1 or updates_per_step < 1:
        raise ConfigError(f"concurrency={concurrency} and updates_per_step={updates_per_step} must be >= 1")
    return (concurrency - 1) + (updates_per_step - 1) / 2


def cache_lag(concurrency: int, updates_per_step: int) -> float:
    """``K / 2 - B / 4``: the delay, in updates, that re-applying cached updates adds (CA2FL).

    CA2FL adds the mean of every client's cached update at each step until the client's next
    update replaces it, about ``K`` arrivals later, so an update's weight is spread over those
    arrivals instead of landing once. On the scalar recursion with equal speeds the largest
    stable step then is close to the stable pace of a delay ``d + K / 2 - B / 4`` at ``B = K / 4``,
    and below it for larger buffers (how close, measured on the recursion for ``K`` from 6 to 100:
    docs/methods.md, "Default server steps"; ``tests/strategies/test_pace.py`` runs the recursion through
    :class:`~asyncfl.strategies.ca2fl.CA2FL`). At ``K = 8, B = 2`` the formula gives 0.69 times FedBuff's
    step; docs/methods.md shows what FedBuff's own step does to CA2FL.
    """
    return max(0.0, concurrency / 2 - updates_per_step / 4)


def per_update_share(concurrency: int, updates_per_step: int = 1, extra_delay: float = 0.0) -> float:
    """``g = sin(pi / (2 (2d + 1)))``: the share of its delta one update adds to the global model
    (``extra_delay`` updates added to ``d``, e.g. :func:`cache_lag`)."""
    return math.sin(math.pi / (2 * (2 * (update_delay(concurrency, updates_per_step) + extra_delay) + 1)))


def paced_server_lr(updates_per_step: int, concurrency: int, response_bound: float = 2.0,
                    extra_delay: float = 0.0) -> float:
    """A method's server learning rate when it averages ``updates_per_step`` updates per step:
    ``min(1, B * g * 2 / lambda_bound)``; ``lambda_bound = 2`` (any client) is the stable pace, a smaller
    measured bound (:class:`ResponseMeter`) a proportionally larger step."""
    share = per_update_share(concurrency, updates_per_step, extra_delay) * 2.0 / response_bound
    return min(1.0, updates_per_step * share)



#: The bound trusts ``lambda_hat`` up to this factor: the secant along the server's moves under-reads
#: the largest response (measured: docs/methods.md, "Default server steps").
RESPONSE_SAFETY = 3.0
#: The smallest bound, 1: a client that moves the model to its own optimum without overshooting, so the step
#: grows to at most twice the stable pace. A floor of 0.5 (four times) let AFL-DW, which steps per arrival,
#: lose accuracy late in a run with Adam clients (the drop-in study).
RESPONSE_FLOOR = 1.0
#: Per pair the bound falls by at most this factor (it rises at once): a brief low reading, such as the
#: first rounds' plateau where updates grow along the server's moves, cannot enlarge the step much.
BOUND_EASING = 1.02


#: Clients whose latest job the meter keeps (least recently seen dropped first): with ``K`` jobs in flight a
#: client comes back after about ``K`` arrivals, so 64 pairs every client of runs up to 64 in flight.
TRACKED_CLIENTS = 64
#: Entries of the model the secant reads: all trained ones up to this many, else a fixed random subset of them
#: (the ratio of two inner products over the same entries; 2 x 64 x 65,536 floats at most, 32 MiB).
MEASURED_ENTRIES = 65_536


class ResponseMeter:
    """Running secant estimate ``lambda_hat`` of the clients' response (see the module docstring).

    Keeps each recently seen client's latest start model and delta (on the measured entries) and
    pairs a new arrival with its own client's previous one when that started from another model.
    A client seen for the first time, or again from the same model, adds no pair: in runs with
    more clients than :data:`TRACKED_CLIENTS` that return rarely the bound stays at the stable pace.

    Parameters
    ----------
    decay : float
        Weight of the running sums kept per new pair (0.9: about the last 10 pairs).
    min_pairs : int
        Pairs needed before :attr:`response` is reported.
    tracked_clients : int
        Clients whose latest job is kept (:data:`TRACKED_CLIENTS`).
    """

    state_attributes = ("numerator", "denominator", "pairs", "bound", "_jobs")

    def __init__(self, decay: float = 0.9, min_pairs: int = 5, tracked_clients: int = TRACKED_CLIENTS) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"decay={decay} must be in (0, 1)")
        if tracked_clients < 1:
            raise ConfigError(f"tracked_clients={tracked_clients} must be >= 1")
        self.decay = decay
        self.min_pairs = min_pairs
        self.tracked_clients = tracked_clients
        self.numerator = 0.0
        self.denominator = 0.0
        self.pairs = 0
        self.bound = 2.0  # the response the pace guards against; 2 = any client (the stable pace)
        self._jobs: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}  # client -> (version, base, delta), by recency
        self._chosen: tuple[int, np.ndarray | None, np.ndarray | None] | None = None  # (size, mask, indices)
        self._spare: tuple[np.ndarray, np.ndarray] | None = None  # a forgotten job's arrays, for the next one

    def observe(self, arrival: Arrival, entries: np.ndarray | None = None) -> None:
        """Pair ``arrival`` with its client's previous job when that started from another model; update the sums.

        ``entries`` (a boolean mask over the flat model) restricts the measurement to trained entries:
        a BatchNorm counter moves by a constant whatever the model, and its large moves would read
        as no response at all.
        """
        client, version = arrival.client_index, arrival.base_version
        # the arrival's start model and delta on the measured entries, written into a forgotten job's arrays if any
        known = self._chosen
        chosen = (known[2] if known is not None and known[0] == arrival.base.size and known[1] is entries
                  else self._chosen_entries(arrival.base.size, entries))
        size = arrival.base.size if chosen is None else chosen.size
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].size == size:
            base, delta = spare
        else:
            base, delta = np.empty(size, np.float32), np.empty(size, np.float32)
        if chosen is None:
            np.copyto(base, arrival.base)
            np.subtract(arrival.weights, arrival.base, out=delta)
        else:
            np.take(arrival.base, chosen, out=base)
            np.take(arrival.weights, chosen, out=delta)
            delta -= base
        previous = self._jobs.pop(client, None)
        if previous is not None and previous[0] != version:
            # the previous job's arrays are freed by this one: the differences are written over them
            moved = np.subtract(base, previous[1], out=previous[1])
            squared = float(np.dot(moved, moved))
            if squared > 0.0:
                changed = np.subtract(delta, previous[2], out=previous[2])
                self.numerator = self.decay * self.numerator - float(np.dot(changed, moved))
                self.denominator = self.decay * self.denominator + squared
                self.pairs += 1
                if self.pairs >= self.min_pairs:  # the bound follows lambda_hat (response) once it is reported
                    target = min(2.0, max(RESPONSE_FLOOR, RESPONSE_SAFETY * (self.numerator / self.denominator)))
                    self.bound = max(target, self.bound / BOUND_EASING)
        if previous is None and len(self._jobs) >= self.tracked_clients:
            previous = self._jobs.pop(next(iter(self._jobs)))  # forget the least recently seen client
        self._spare = None if previous is None else (previous[1], previous[2])
        self._jobs[client] = (version, base, delta)

    def _chosen_entries(self, size: int, entries: np.ndarray | None) -> np.ndarray | None:
        """Indices of the measured entries (``None``: all of them): the trained ones, at most
        :data:`MEASURED_ENTRIES` of them drawn once with a fixed seed (kept for the next arrival of that size)."""
        if entries is None and size <= MEASURED_ENTRIES:
            chosen = None
        else:
            chosen = np.arange(size) if entries is None else np.flatnonzero(entries)
            if chosen.size > MEASURED_ENTRIES:
                chosen = np.sort(np.random.default_rng(0).choice(chosen, MEASURED_ENTRIES, replace=False))
        self._chosen = (size, entries, chosen)
        return chosen

    def summary(self) -> dict[str, float | int | None]:
        """``summary.json``'s figures: the last ``lambda_hat`` (``None`` before ``min_pairs``), the bound, the pairs."""
        response = self.response
        return {"pace-response": round(response, 4) if response is not None else None,
                "pace-bound": round(self.bound, 4), "pace-pairs": self.pairs}

    @property
    def response(self) -> float | None:
        """``lambda_hat``, or ``None`` before ``min_pairs`` informative pairs."""
        if self.pairs < self.min_pairs or self.denominator <= 0.0:
            return None
        return self.numerator / self.denominator




class PacedSteps:
    """The automatic server step and buffer size (mixed into :class:`~asyncfl.strategies.base.Strategy`)."""

    #: Jobs in flight (``K``), as the engine told :meth:`on_start`; ``None`` before a run.
    concurrency: int | None = None

    #: Entries of the flat model that are trained (BatchNorm statistics and integer counters excluded), as the
    #: engine sets it before :meth:`on_start`; ``None``: every entry (or not known).
    trained_entries: np.ndarray | None = None

    #: Set by a strategy whose automatic step follows the clients' measured response
    #: (:class:`ResponseMeter`); ``None``: the stable pace for any client.
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
        """Keep a :class:`ResponseMeter` when the automatic step (``server_lr=0``)
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
        clients (:func:`paced_server_lr`), with ``extra_delay`` updates added to the delay
        ``d`` (CA2FL's :func:`cache_lag`). Before :meth:`on_start` (no ``K`` known) auto
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
        (:func:`auto_buffer_size`). Before :meth:`on_start` auto is 2. Resolved once
        per run (:meth:`_start_pacing` forgets it)."""
        configured = getattr(self.config, "buffer_size", None)
        if configured is None:
            raise AttributeError(f"{type(self).__name__} does not buffer updates")
        if configured > 0:
            return configured
        return auto_buffer_size(self.concurrency) if self.concurrency else BUFFER_BOUNDS[0]
