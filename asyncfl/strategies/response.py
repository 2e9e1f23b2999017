"""How strongly the clients' updates respond to the model they start from, measured from arrivals.

The stable pace (:mod:`asyncfl.strategies.pace`) assumes the worst client: one whose update
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
difference correlates with ``x_a - x_b``. The former pairing (each arrival with the latest one
from another model) under-read the response with equal speeds, so AFL-DW, which steps per arrival,
took too large a step and fell far behind the stable step; the same client's jobs read a response near 1
there and kept the stable step (measured in the drop-in study: docs/methods.md).
Summing numerator and denominator over recent pairs (each decayed by ``decay`` per pair)
weights a pair by ``||x_a - x_b||^2``, so pairs from nearby models, whose secant is mostly
client noise, count little. When the server starts to oscillate, its moves line up with the
direction that oscillates and ``lambda_hat`` rises, so a pace set from it slows down on its own.
A client's own minibatch noise in ``Delta_b``, which the server's move carries, biases the
reading up: toward the safe side.
"""

from __future__ import annotations

import numpy as np

from asyncfl.strategies.arrival import Arrival

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
            raise ValueError(f"decay={decay} must be in (0, 1)")
        if tracked_clients < 1:
            raise ValueError(f"tracked_clients={tracked_clients} must be >= 1")
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
        base, delta = self._copy_in(arrival, entries)
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

    def _copy_in(self, arrival: Arrival, entries: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The arrival's start model and delta on the measured entries, written into spare arrays when there are."""
        known = self._chosen
        chosen = (known[2] if known is not None and known[0] == arrival.base.size and known[1] is entries
                  else self._chosen_entries(arrival.base.size, entries))
        size = arrival.base.size if chosen is None else chosen.size
        spare = self._spare
        if spare is not None and spare[0].size == size:
            base, delta = spare
        else:
            base, delta = np.empty(size, np.float32), np.empty(size, np.float32)
        self._spare = None
        if chosen is None:
            np.copyto(base, arrival.base)
            np.subtract(arrival.weights, arrival.base, out=delta)
        else:
            np.take(arrival.base, chosen, out=base)
            np.take(arrival.weights, chosen, out=delta)
            delta -= base
        return base, delta

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
