"""Step 3b of the reply path: the bounds each participant's arrival passes before a strategy sees it.

A node may be faulty or hostile (``docs/security.md``): an arrival whose update overflows float32 is
rejected, its example count is capped (:class:`ExampleCountCeiling`), its update's norm is
bounded per participant (:class:`UpdateNormBound`, below), and a node over its share of the
recent updates gets no new job while others are out (the dispatcher's slots ask :meth:`over_share`).
All of it is on with ``update-norm-bound`` (default 3) and off at 0, except the overflow check. With a
``trusted_train_fn`` the update first loses any component against the server's own descent on its trusted
data (:mod:`~asyncfl.server_app.trusted_direction`), and the norm bound holds what remains of such an update to
the median movement.

The update-norm bound
---------------------
A bound on each arriving update's norm, per participant: no single node moves the model far, however fast it is.

The update of an arrival is ``Delta = weights - base``, taken apart in groups bounded each on its
own: the trained entries, the BatchNorm running statistics (computed from client data too, on
another scale) and the integer entries (counters such as ``num_batches_tracked``). Each group's
L2 norm, times the strategy's weight for the update, is compared with a reference, the median of the
*participants'* latest such products:

* **One entry per client.** The window holds each of the last ``window`` distinct clients'
  latest norm, as bounded: a fast node, however many updates it sends, fills one entry of it,
  and a clipped update enters at the bound's ceiling, so the median moves only when more than half of the
  recent participants move it.
* **A bound per participant, not per update.** A client that sent ``r`` times as many of the last
  ``rate_window`` accepted updates as the median participant (``r > 1``) has its bound divided by
  ``r^2``: its movement of the model per unit of time is at most ``multiple / r`` x an honest
  client's, less the faster it replies (asynchrony gives a fast node more updates, and fresher
  ones, which a strategy weighting by staleness trusts more; a node that skips training is easily
  several times faster). The window is 16 updates per client (256 at least), so that an honest
  client's count is a steady estimate of its rate.
* **A bound on movement, not on size.** What is compared is ``weight x norm``, where ``weight`` is how
  much the strategy lets the update move the model next to a fresh update: FedAsync's ``s(tau)`` and
  FedBuff's staleness weight over a fresh update's (1 for a strategy without such a weight). A fast
  node's updates are fresh, and a staleness-weighted rule trusts a fresh update several times more
  than the stale honest ones; bounded by norm alone, each of its updates moved the model up to
  ``multiple`` x further than the median client's does. A weight below ``1 / multiple^2`` counts at
  that floor, so that no update's norm is unbounded (a stale update's small weight is the server's
  reckoning, not the sender's claim).
* **A bound from the first arrival.** While fewer than ``MIN_HISTORY`` clients are known, the
  reference is ``WARMUP_FRACTION`` x the norm of the first model an update was trained from (an
  honest local program moves a model by a fraction of its own norm; an attacker's first update of
  ``-3 x0`` would otherwise replace the model), and a client's k-th update in that phase gets
  ``1/k^2`` of the bound (a fast node that arrives first cannot compound its steps). An all-zero
  model gives no reference: its first updates pass unbounded, said in a warning at the first update
  (``docs/security.md``).

A zero median (honest updates that no longer move the model) bounds every update at zero. An
update whose norm exceeds its bound is

* ``"clip"`` (default): that group scaled back to the bound along its own direction, and
  aggregated; or
* ``"reject"``: rejected with the reason ``update-norm`` (counted, never aggregated).

This is norm bounding as studied against model poisoning by Sun et al. (2019), "Can you really
backdoor federated learning?", with the adaptive median reference of centred-clipping methods
(Karimireddy et al., 2021, "Learning from history for Byzantine robust optimization") taken over
participants rather than updates, so the same ``multiple`` suits any model, learning rate, local
program and speed. It bounds a faulty update's influence; it does not detect one that stays within
the bound, and it does not stop one party that runs many nodes (``docs/security.md``).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import replace

import numpy as np

from asyncfl.errors import ConfigError
from asyncfl.options import UPDATE_NORM_ACTIONS, RunOptions
from asyncfl.server_app.codec import RejectedReply
from asyncfl.server_app.trusted_direction import TrustedDirection
from asyncfl.strategies.arrival import Arrival

log = logging.getLogger("asyncfl.engine")

#: Distinct clients needed before the median of their norms is the reference (before: a fraction of the model's).
MIN_HISTORY = 3
#: The rate window's length per client of the federation (set_clients).
RATE_PER_CLIENT = 16
#: The reference before MIN_HISTORY clients are known, as a share of the base model's norm.
WARMUP_FRACTION = 0.1


def l2_norm(vector: np.ndarray) -> float:
    """L2 norm of a float32 vector, scaled by its largest magnitude first so that no square overflows."""
    largest = float(np.abs(vector).max()) if vector.size else 0.0
    if largest == 0.0:
        return 0.0
    scaled = vector / np.float32(largest)
    return largest * math.sqrt(float(np.dot(scaled, scaled)))


class UpdateNormBound:
    """Clips (or rejects) an arrival whose update norm exceeds its client's bound (module docstring).

    Parameters
    ----------
    multiple : float
        The bound as a multiple of the reference norm (> 1; the engine builds none for 0 = off).
    action : {"clip", "reject"}
        What happens to an update beyond the bound.
    groups : sequence of (numpy.ndarray of bool or None)
        The entries bounded together, each group against its own history (the codec's trained entries,
        BatchNorm statistics and integer entries); ``None`` in it: every entry. Default: one group of every entry.
    window : int
        How many distinct clients' latest norms the median is taken over: short enough to follow honest norms
        when they grow (updates grow several-fold as a model leaves its initial plateau), long enough that a
        minority of faulty nodes cannot make half of it.
    rate_window : int
        How many recent accepted updates a client's rate is counted over.
    by_rate : bool
        Whether a client's bound shrinks with its share of the recent updates (:meth:`rate_ratio`, the warm-up's
        ``1/k²`` included); False where the server, not the node, decides how often a node trains (a synchronous
        strategy's rounds, a Flower app's own loop).
    """

    state_attributes = ("latest", "recent_clients", "first_norms", "clipped", "rejected", "largest_ratio",
                        "rate_limited")

    def __init__(self, multiple: float, action: str = RunOptions.update_norm_action, groups=(None,), window: int = 16,
                 rate_window: int = 256, by_rate: bool = True) -> None:
        if action not in UPDATE_NORM_ACTIONS:
            raise ConfigError(f"update-norm action {action!r} is not valid; choose one of: "
                              f"{', '.join(UPDATE_NORM_ACTIONS)}")
        self.multiple = float(multiple)
        self.action = action
        self.groups = list(groups)
        self.window = window
        self.by_rate = by_rate
        self.min_history = MIN_HISTORY  # the engine lowers it for a federation of fewer clients (set_clients)
        self.latest: list[dict[int, float]] = [{} for _ in self.groups]  # client -> latest bounded norm, oldest first
        self.first_norms: list[float | None] = [None for _ in self.groups]  # each group's norm in the first base
        self.recent_clients: deque[int] = deque(maxlen=rate_window)
        self._counts: dict[int, int] = {}  # client -> its updates in recent_clients
        self._clients_with: dict[int, int] = {}  # count -> how many clients have it (the median's histogram)
        self._median: float | None = None  # the median count, until the window changes
        self.clipped = 0  # updates with at least one group clipped
        self.rejected = 0
        self.rate_limited = 0  # bounded updates whose bound was lowered because their client sent more than its share
        self.largest_ratio = 0.0  # the largest norm / reference seen: how close honest updates came to the bound

    @property
    def norms(self) -> list[float]:
        """The first group's (the trained entries') latest norm of each recent client."""
        return list(self.latest[0].values())

    def reference(self, base: np.ndarray, group: int = 0) -> float:
        """The norm a group's update is compared with: the median of the recent clients' latest norms, or, while
        fewer than ``MIN_HISTORY`` clients are known, ``WARMUP_FRACTION`` x the base model's own."""
        latest = self.latest[group]
        if len(latest) >= self.min_history:
            return float(statistics.median(latest.values()))
        if self.first_norms[group] is None:  # anchored to the first model seen: warm-up steps cannot compound
            mask = self.groups[group]
            self.first_norms[group] = l2_norm(base if mask is None else base[mask])
            if group == 0 and not self.first_norms[0]:
                log.warning("the model's trained entries start at all zeros: the update bound has no reference until "
                            "%d clients have sent updates, and their updates pass unbounded (one hostile update "
                            "among them can replace the model); a small random initialisation gives the bound its "
                            "reference from the start", self.min_history)
        return WARMUP_FRACTION * self.first_norms[group]

    def rate_ratio(self, client: int) -> float:
        """How many times the median recent client's count of the last ``rate_window`` updates ``client`` sent
        (1 at least: a client at or below the median rate keeps the full bound)."""
        if self.recent_clients and not self._counts:
            self._recount()
        own = self._counts.get(client, 0)
        if not own:
            return 1.0
        if len(self._counts) < self.min_history:  # warm-up: a client's further updates share its first's bound
            return 1.0 + own
        # the median of the recent clients' counts, from how many clients have each count (asked at every dispatch
        # check: a walk over the few distinct counts, not a sort of every client's), kept until the window changes
        if self._median is None:
            n = len(self._counts)
            lower, upper = (n - 1) // 2, n // 2  # the middle positions in the sorted counts (equal when n is odd)
            at_lower = at_upper = None
            seen = 0
            for count in sorted(self._clients_with):
                seen += self._clients_with[count]
                if at_lower is None and seen > lower:
                    at_lower = count
                if seen > upper:
                    at_upper = count
                    break
            self._median = (at_lower + at_upper) / 2.0
        return max(1.0, own / self._median)

    def over_share(self, client: int) -> bool:
        """``client`` sent more than ``multiple`` x the median client's count of the recent updates: the engine
        gives it no new job while others are out, so its share of the run's updates stays near an honest one's
        (judged once ``min_history`` clients have sent updates)."""
        return len(self._counts) >= self.min_history and self.rate_ratio(client) > self.multiple

    def _add(self, client: int, step: int) -> None:
        """``client``'s count in the rate window moves by ``step``, and the number of clients with each count."""
        before = self._counts.get(client, 0)
        after = before + step
        for count, change in ((before, -1), (after, 1)):
            if count:
                self._clients_with[count] = self._clients_with.get(count, 0) + change
                if not self._clients_with[count]:
                    del self._clients_with[count]
        if after:
            self._counts[client] = after
        else:
            del self._counts[client]
        self._median = None

    def set_clients(self, clients: int) -> None:
        """The federation has ``clients`` clients: with fewer than ``MIN_HISTORY``, all of them is enough history;
        the rate window holds ``RATE_PER_CLIENT`` updates per client (its initial length at least)."""
        self.min_history = max(1, min(MIN_HISTORY, clients))
        length = max(self.recent_clients.maxlen, RATE_PER_CLIENT * clients)
        if length != self.recent_clients.maxlen:
            self.recent_clients = deque(self.recent_clients, maxlen=length)

    def _recount(self) -> None:
        """The rate window's counts from ``recent_clients`` (after a checkpoint restored it: counts are not saved)."""
        self._counts, self._clients_with = {}, {}
        for client in self.recent_clients:
            self._add(client, 1)

    def apply(self, arrival: Arrival, weight: float = 1.0, multiple: float | None = None,
              delta: np.ndarray | None = None) -> Arrival | RejectedReply:
        """``arrival`` as it may be aggregated (a group beyond its bound clipped), or the rejection.

        ``weight``: how much the strategy lets this update move the model next to a fresh update
        (:func:`asyncfl.server_app.participants.relative_weight`); what is bounded is ``weight x norm``.
        ``multiple``: a tighter multiple for this update's trained entries than the run's (one that pointed against
        the server's trusted descent is held to the median: :mod:`~asyncfl.server_app.trusted_direction`).
        ``delta``: ``arrival.delta`` when the caller has it."""
        delta, client = arrival.delta if delta is None else delta, arrival.client_index
        trained_multiple = self.multiple if multiple is None else min(float(multiple), self.multiple)
        rate = self.rate_ratio(client) if self.by_rate else 1.0
        weight = max(float(weight), 1.0 / self.multiple**2)  # a light update still has a finite norm bound
        scales = []
        for g, mask in enumerate(self.groups):
            norm = l2_norm(delta if mask is None else delta[mask])
            movement = weight * norm
            known = len(self.latest[g]) >= self.min_history
            reference = self.reference(arrival.base, g)
            unjudged = reference <= 0 and not known  # an all-zero model and no history yet: nothing to judge by
            # the client's latest movement, the newest of the window (its oldest client leaves beyond ``window``),
            # at most the run's ceiling: honest updates held tighter must not drag the median down
            latest = self.latest[g]
            latest.pop(client, None)
            latest[client] = movement if unjudged else min(movement, self.multiple * reference)
            if len(latest) > self.window:
                del latest[next(iter(latest))]
            if unjudged:
                continue
            multiple = trained_multiple if g == 0 else self.multiple  # group 0: the trained entries
            ceiling = multiple * reference  # a zero median (updates that no longer move) bounds at zero
            if reference > 0:
                self.largest_ratio = max(self.largest_ratio, movement / reference)
            bound = ceiling / rate**2  # r x the updates, each at 1/r^2: 1/r of the movement per unit of time
            if movement > bound:
                scales.append((mask, bound / movement, norm, reference, multiple))
        # ``client`` sent the newest update; the oldest leaves the rate window (rate_ratio recounted a restored one)
        if len(self.recent_clients) == self.recent_clients.maxlen:
            self._add(self.recent_clients[0], -1)
        self.recent_clients.append(client)
        self._add(client, 1)
        if not scales:
            return arrival
        self.rate_limited += rate > 1
        if self.action == "reject":
            self.rejected += 1
            _, _, norm, reference, multiple = scales[0]
            return RejectedReply("update-norm", f"update norm {norm:.4g} x weight {weight:.3g} exceeds "
                                                f"{multiple:g} x the reference {reference:.4g} (the recent "
                                                f"clients' median of norm x weight)"
                                                + (f" / {rate:.3g}^2 (the client's share of recent updates)"
                                                   if rate > 1 else ""))
        self.clipped += 1
        weights = arrival.weights.copy()
        for mask, scale, *_ in scales:
            entries = slice(None) if mask is None else mask
            weights[entries] = arrival.base[entries] + np.float32(scale) * delta[entries]
        return replace(arrival, weights=weights)

    def summary(self) -> dict:
        """The bound's figures for ``summary.json``."""
        norms = self.norms
        return {"update-norm-bound": self.multiple, "update-norm-action": self.action,
                "update-norm-clipped": self.clipped, "update-norm-rejected": self.rejected,
                "update-norm-rate-limited": self.rate_limited,
                "update-norm-largest-ratio": round(self.largest_ratio, 4),
                "update-norm-median": round(float(np.median(norms)), 6) if norms else None,
                "update-norm-groups": len(self.groups)}


#: The norm bound's multiple for an update that pointed against the server's trusted descent (lost that component):
#: the participants' median movement itself (:mod:`~asyncfl.server_app.trusted_direction`; None: the run's multiple).
AGAINST_DESCENT_MULTIPLE: float | None = 1.0


def relative_weight(strategy, arrival: Arrival) -> float:
    """How much ``strategy`` lets ``arrival`` move the model next to a fresh update: its coefficient for the
    arrival over its coefficient for the same arrival at staleness 0 (FedAsync's ``s(tau)``, FedBuff's staleness
    weight, :meth:`~asyncfl.strategies.base.Strategy.update_coefficient`); 1 for a strategy without one."""
    coefficient = strategy.update_coefficient(arrival)
    if coefficient is None:
        return 1.0
    fresh = strategy.update_coefficient(replace(arrival, staleness=0))
    return coefficient / fresh if fresh else 1.0


class ExampleCountCeiling:
    """Caps each arrival's ``num_examples`` at ``multiple`` x the recent clients' median: no node takes over an
    example-weighted step by claiming more.

    FedAvg (McMahan et al., 2017) and the rules built on it weight each update by the ``num-examples``
    its client reports, and nothing on the server can check that figure: a node that reports 1e9 is
    the whole step, every round. A reply's count is therefore capped at ``multiple`` x the median of
    the last ``window`` distinct clients' latest counts (one entry per client, as capped, so a fast
    or lying node fills one entry); while fewer than ``MIN_HISTORY`` clients have reported, at
    ``multiple`` x the median size the nodes reported when they were identified (when they were).
    An honest client larger than ``multiple`` x the median is capped too: its weight is then that of a
    client ``multiple`` times the median's size (``docs/security.md``). Counts that are not whole
    numbers >= 0 never get here: the reply is rejected (:func:`asyncfl.server_app.codec.reported_count`).

    Parameters
    ----------
    multiple : float
        The ceiling as a multiple of the median count (the engine's ``update-norm-bound``).
    registered_sizes : sequence of int
        The sizes the nodes reported when identified (their median is the reference before any reply); empty:
        none reported, and the first ``MIN_HISTORY - 1`` replies' counts pass as they came.
    window : int
        How many distinct clients' latest counts the median is taken over.
    """

    state_attributes = ("latest", "capped")

    def __init__(self, multiple: float, registered_sizes=(), window: int = 64) -> None:
        self.multiple = float(multiple)
        self.clients = max(1, len(registered_sizes))
        positive = [s for s in registered_sizes if s > 0]
        self.prior = float(np.median(positive)) if positive else 0.0
        self.window = window
        self.latest: dict[int, int] = {}  # client -> its latest count as capped, oldest first
        self.capped = 0

    def apply(self, arrival: Arrival) -> Arrival:
        """``arrival`` with its count capped at the ceiling (``inf`` while nothing is known); its client's entry
        updated."""
        if len(self.latest) >= min(MIN_HISTORY, self.clients):
            ceiling = self.multiple * float(np.median(list(self.latest.values())))
        else:
            ceiling = self.multiple * self.prior if self.prior > 0 else float("inf")
        count = arrival.num_examples
        if count > ceiling:
            self.capped += 1
            count = int(ceiling)
            arrival = replace(arrival, num_examples=count)
        self.latest.pop(arrival.client_index, None)
        self.latest[arrival.client_index] = count
        if len(self.latest) > self.window:
            del self.latest[next(iter(self.latest))]
        return arrival

    def summary(self) -> dict:
        """The ceiling's figure for ``summary.json``."""
        return {"num-examples-capped": self.capped}


class ParticipantBounds:
    """The engine's per-participant bounds (module docstring).

    Parameters
    ----------
    multiple : float
        ``update-norm-bound``: the bounds' multiple of the median participant (0: no bound, no ceiling).
    action : {"clip", "reject"}
        What happens to an update beyond its norm bound.
    groups : list of (numpy.ndarray of bool or None)
        The entries bounded together (:meth:`~asyncfl.server_app.codec.ModelCodec.bound_groups`).
    slots : Slots
        The dispatcher's slots; told to hold back a node over its share (asynchronous strategies).
    strategy : Strategy
        The run's strategy: how much it weights each update (:func:`relative_weight`), and whether it is
        asynchronous (a synchronous round gives every node one job anyway: no hold-back).
    direction : TrustedDirection, optional
        The server's descent on its trusted data (``trusted_train_fn``), applied before the norm bound.
    by_rate : bool
        Whether a client's norm bound shrinks with its share of the recent updates (:class:`UpdateNormBound`);
        asynchronous strategies only: off for a synchronous one whatever is passed.
    """

    def __init__(self, multiple: float, action: str, groups, slots, strategy,
                 direction: TrustedDirection | None = None, by_rate: bool = True) -> None:
        self.multiple = multiple
        self.direction = direction
        self.strategy = strategy
        asynchronous = not strategy.synchronous
        # a synchronous round gives each node it samples one job: the server, not the node, sets how often it trains
        self.norm = UpdateNormBound(multiple, action, groups, by_rate=by_rate and asynchronous) if multiple else None
        self.count: ExampleCountCeiling | None = None  # built once the nodes' sizes are known (start)
        self.slots = slots
        if self.norm is not None and asynchronous:
            slots.over_share = self.norm.over_share

    def start(self, sizes: list[int]) -> None:
        """The clients are known, with the sizes they reported (one per client)."""
        if self.norm is not None:
            self.count = ExampleCountCeiling(self.multiple, sizes)
            self.norm.set_clients(len(sizes))

    def apply(self, arrival: Arrival, shared_base: bool = True) -> Arrival | RejectedReply:
        """``arrival`` as a strategy may take it (its count capped, its update bounded), or its rejection;
        ``shared_base``: its base is its version's global model (not one made for this job)."""
        delta = arrival.delta  # one model-sized difference for every check below
        if not np.isfinite(delta).all():  # finite weights whose difference from the base overflows float32
            return RejectedReply("non-finite", "the update (weights - base) overflows float32")
        against = False
        if self.direction is not None:
            arrival, against = self.direction.apply(arrival, shared_base, delta)
            if isinstance(arrival, RejectedReply):
                return arrival
            if against:  # the update lost its component against the trusted descent
                delta = arrival.delta
        if self.count is not None:
            arrival = self.count.apply(arrival)
        if self.norm is None:
            return arrival
        return self.norm.apply(arrival, relative_weight(self.strategy, arrival),
                               AGAINST_DESCENT_MULTIPLE if against else None, delta)

    def summary(self) -> dict:
        """The bounds' figures for ``summary.json`` (none when they are off)."""
        out = self.direction.summary() if self.direction is not None else {}
        if self.norm is None:
            return out
        out.update(self.norm.summary(), **{"over-share-held-back": self.slots.held_back_checks})
        return {**out, **(self.count.summary() if self.count is not None else {})}
