"""Step 3b of the reply path: the bounds each participant's arrival passes before a strategy sees it.

A node may be faulty or hostile (``docs/security.md``): an arrival whose update overflows float32 is
rejected, its example count is capped (:class:`ExampleCountCeiling`), its update's norm is
bounded per participant (:mod:`~asyncfl.server_app.update_bound`), and a node over its share of the
recent updates gets no new job while others are out (the dispatcher's slots ask :meth:`over_share`).
All of it is on with ``update-norm-bound`` (default 3) and off at 0, except the overflow check. With a
``trusted_train_fn`` the update first loses any component against the server's own descent on its trusted
data (:mod:`~asyncfl.server_app.trusted_direction`), and the norm bound holds what remains of such an update to
the median movement.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from asyncfl.server_app.replies import RejectedReply
from asyncfl.server_app.trusted_direction import TrustedDirection
from asyncfl.server_app.update_bound import MIN_HISTORY, UpdateNormBound
from asyncfl.strategies.arrival import Arrival

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
    numbers >= 0 never get here: the reply is rejected (:func:`asyncfl.server_app.replies.reported_count`).

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
    """

    def __init__(self, multiple: float, action: str, groups, slots, strategy,
                 direction: TrustedDirection | None = None) -> None:
        self.multiple = multiple
        self.direction = direction
        self.strategy = strategy
        asynchronous = not strategy.synchronous
        self.norm = UpdateNormBound(multiple, action, groups) if multiple else None
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
