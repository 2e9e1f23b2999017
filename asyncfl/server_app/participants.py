"""Step 3b of the reply path: the bounds each participant's arrival passes before a strategy sees it.

A node may be faulty or hostile (``docs/security.md``): an arrival whose update overflows float32 is
rejected, its example count is capped (:mod:`~asyncfl.server_app.count_bound`), its update's norm is
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

from asyncfl.server_app.count_bound import ExampleCountCeiling
from asyncfl.server_app.replies import RejectedReply
from asyncfl.server_app.trusted_direction import TrustedDirection
from asyncfl.server_app.update_bound import UpdateNormBound
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
        if not np.isfinite(arrival.delta).all():  # finite weights whose difference from the base overflows float32
            return RejectedReply("non-finite", "the update (weights - base) overflows float32")
        against = False
        if self.direction is not None:
            arrival, against = self.direction.apply(arrival, shared_base)
            if isinstance(arrival, RejectedReply):
                return arrival
        if self.count is not None:
            arrival = self.count.apply(arrival)
        if self.norm is None:
            return arrival
        return self.norm.apply(arrival, relative_weight(self.strategy, arrival),
                               AGAINST_DESCENT_MULTIPLE if against else None)

    def summary(self) -> dict:
        """The bounds' figures for ``summary.json`` (none when they are off)."""
        out = self.direction.summary() if self.direction is not None else {}
        if self.norm is None:
            return out
        out.update(self.norm.summary(), **{"over-share-held-back": self.slots.held_back_checks})
        return {**out, **(self.count.summary() if self.count is not None else {})}
