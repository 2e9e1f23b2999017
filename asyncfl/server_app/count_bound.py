"""A ceiling on the example count a reply reports: no node takes over an example-weighted step by claiming more.

FedAvg (McMahan et al., 2017) and the rules built on it weight each update by the ``num-examples``
its client reports, and nothing on the server can check that figure: a node that reports 1e9 is
the whole step, every round. A reply's count is therefore capped at ``multiple`` x the median of
the last ``window`` distinct clients' latest counts (one entry per client, as capped, so a fast
or lying node fills one entry); while fewer than ``MIN_HISTORY`` clients have reported, at
``multiple`` x the median size the nodes reported when they were identified (when they were).
An honest client larger than ``multiple`` x the median is capped too: its weight is then that of a
client ``multiple`` times the median's size (``docs/security.md``). Counts that are not whole
numbers >= 0 never get here: the reply is rejected (:func:`asyncfl.server_app.replies.reported_count`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from asyncfl.server_app.update_bound import MIN_HISTORY
from asyncfl.strategies.arrival import Arrival


class ExampleCountCeiling:
    """Caps each arrival's ``num_examples`` at ``multiple`` x the recent clients' median (module docstring).

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
