"""How strongly the clients' updates respond to the model they start from, measured from arrivals.

The stable pace (:mod:`asyncfl.strategies.pace`) assumes the worst client: one whose update
moves the model ``lambda = 2`` times its distance to the minimum (a momentum optimizer that
overshoots). Most apps are far from it, and where learning is slow (small client learning
rates) that bound costs rounds: on Flower's quickstart app with SGD momentum at lr 0.01,
FedBuff at the stable pace ended 31 points under FedAvg after 40 rounds.

Two updates that started from different global models ``x_a`` and ``x_b`` measure the
response along the server's own moves (a secant, as in Barzilai and Borwein, 1988):
with ``Delta(x) ~ -A (x - x*) + noise``,

    ``lambda_hat = -<Delta_a - Delta_b, x_a - x_b> / ||x_a - x_b||^2``

is the Rayleigh quotient of ``A`` along ``x_a - x_b``. Summing numerator and denominator over
recent pairs (each decayed by ``decay`` per pair) weights a pair by ``||x_a - x_b||^2``, so
pairs from nearby models, whose secant is mostly client noise, count little. When the server
starts to oscillate, its moves line up with the direction that oscillates and ``lambda_hat``
rises, so a pace set from it slows down on its own.
"""

from __future__ import annotations

import numpy as np

from asyncfl.strategies.arrival import Arrival

#: The bound trusts ``lambda_hat`` up to this factor: the secant along the server's moves under-reads
#: the largest response (FedBuff at FedAvg's pace oscillated with equal speeds while its ``lambda_hat``
#: read 0.5-0.9, so the response that oscillated was at least 1.3).
RESPONSE_SAFETY = 3.0
#: The smallest bound, 1: a client that moves the model to its own optimum without overshooting, so the step
#: grows to at most twice the stable pace. A floor of 0.5 (four times) let AFL-DW, which steps per arrival,
#: fall from 0.92 to 0.81 late in one run with Adam clients (``benchmarks/dropin``).
RESPONSE_FLOOR = 1.0
#: Per pair the bound falls by at most this factor (it rises at once): a brief low reading, such as the
#: first rounds' plateau where updates grow along the server's moves, cannot enlarge the step much.
BOUND_EASING = 1.02


class ResponseMeter:
    """Running secant estimate ``lambda_hat`` of the clients' response (see the module docstring).

    Keeps the latest arrival's start model and delta, and the latest one that started from
    another version, so a new arrival always has a partner from a different model when one
    exists: six flat copies of the model in all (with two scratch vectors), reused from
    arrival to arrival.

    Parameters
    ----------
    decay : float
        Weight of the running sums kept per new pair (0.9: about the last 10 pairs).
    min_pairs : int
        Pairs needed before :attr:`response` is reported.
    """

    state_attributes = ("numerator", "denominator", "pairs", "bound", "_latest", "_other")

    def __init__(self, decay: float = 0.9, min_pairs: int = 5) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay={decay} must be in (0, 1)")
        self.decay = decay
        self.min_pairs = min_pairs
        self.numerator = 0.0
        self.denominator = 0.0
        self.pairs = 0
        self.bound = 2.0  # the response the pace guards against; 2 = any client (the stable pace)
        self._latest: tuple[int, np.ndarray, np.ndarray] | None = None  # (version, base, delta)
        self._other: tuple[int, np.ndarray, np.ndarray] | None = None  # latest one from another version
        self._moved: np.ndarray | None = None  # scratch for x_a - x_b
        self._changed: np.ndarray | None = None  # scratch for Delta_a - Delta_b

    def observe(self, arrival: Arrival, entries: np.ndarray | None = None) -> None:
        """Pair ``arrival`` with the latest arrival from another start model and update the sums.

        ``entries`` (a boolean mask over the flat model) restricts the measurement to trained entries:
        a BatchNorm counter moves by a constant whatever the model, and its large moves would read
        as no response at all.
        """
        version = arrival.base_version
        latest, other = self._latest, self._other
        if latest is not None and latest[0] != version:
            partner, dropped = latest, other
        else:  # the latest started from the same model (or there is none): it is replaced, ``other`` kept
            partner, dropped = other, latest
        base, delta = self._copy_in(arrival, entries, dropped)  # into the dropped slot's buffers: no allocation
        if partner is not None:
            if self._moved is None or self._moved.shape != base.shape:
                self._moved, self._changed = np.empty_like(base), np.empty_like(base)
            moved = np.subtract(base, partner[1], out=self._moved)
            squared = float(np.dot(moved, moved))
            if squared > 0.0:
                changed = np.subtract(delta, partner[2], out=self._changed)
                self.numerator = self.decay * self.numerator - float(np.dot(changed, moved))
                self.denominator = self.decay * self.denominator + squared
                self.pairs += 1
                self._update_bound()
        if latest is not None and latest[0] != version:
            self._other = latest
        self._latest = (version, base, delta)

    @staticmethod
    def _copy_in(arrival: Arrival, entries: np.ndarray | None,
                 slot: tuple[int, np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """The arrival's start model and delta (on ``entries``), written into ``slot``'s arrays when given."""
        size = arrival.base.size if entries is None else int(np.count_nonzero(entries))
        if slot is not None and slot[1].size == size:
            base, delta = slot[1], slot[2]
        else:
            base, delta = np.empty(size, np.float32), np.empty(size, np.float32)
        if entries is None:
            np.copyto(base, arrival.base)
            np.subtract(arrival.weights, arrival.base, out=delta)
        else:
            np.compress(entries, arrival.base, out=base)
            np.compress(entries, arrival.weights, out=delta)
            delta -= base
        return base, delta

    def _update_bound(self) -> None:
        response = self.response
        if response is None:
            return
        target = min(2.0, max(RESPONSE_FLOOR, RESPONSE_SAFETY * response))
        self.bound = max(target, self.bound / BOUND_EASING)

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
