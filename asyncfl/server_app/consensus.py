"""No update moves the model against the recent consensus: its component opposite to it is taken out.

A norm bound limits how far one update moves the model, not where to. A participant that sends the
negative of an honest update (a sign flip of honest size) passes any norm bound and undoes its share
of the run's progress at every arrival; fast, it arrives a few times per honest update. The
consensus is the exponential moving average of the recent accepted updates' directions (trained
entries, as bounded and projected), ``m <- beta m + (1 - beta) Delta / |Delta|``; an arrival whose
update points against it
(``Delta . m < 0``) has that component removed,

    ``Delta' = Delta - (Delta . m / |m|^2) m``,

and is aggregated as ``base + Delta'``. An update in the consensus' half-space passes as it came, so
honest updates, which share the task's gradient, are rarely touched; one that opposes it keeps only
its directions orthogonal to the consensus, which the norm bound holds to its size. Each update is one
vote of unit length: a large update does not steer the consensus further than a small one (the
average of raw updates let a sender at the bound's ceiling, three times an honest norm, pull the
consensus toward its own earlier updates, so that its next ones passed as agreeing).

The rule is the projection onto a half-space of Zeno-style (Xie, Koyejo and Gupta, 2019, "Zeno:
Distributed Stochastic Gradient Descent with Suspicion-based Fault-tolerance") and FLTrust-style
(Cao et al., 2021, "FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping") direction
checks, with the server's own recent history as the reference instead of server-held data. What it
does not stop: an attacker that sends directions orthogonal to the consensus (bounded in norm, as
noise), or a majority that moves the consensus itself (``docs/security.md``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from asyncfl.server_app.update_bound import l2_norm
from asyncfl.strategies.arrival import Arrival

#: The average's decay per accepted update: about the last ten updates make the consensus.
DECAY = 0.9


class ConsensusProjection:
    """Removes from each update its component opposite to the recent updates' average (module docstring).

    Parameters
    ----------
    mask : numpy.ndarray of bool or None
        The trained entries (the codec's first bound group); ``None``: every entry.
    decay : float
        ``beta``: how much of the average each accepted update keeps.
    """

    state_attributes = ("mean", "projected", "arrivals")

    def __init__(self, mask: np.ndarray | None = None, decay: float = DECAY) -> None:
        self.mask = mask
        self.decay = decay
        self.mean: np.ndarray | None = None
        self.projected = 0  # updates whose opposing component was removed
        self.arrivals = 0

    def apply(self, arrival: Arrival) -> Arrival:
        """``arrival`` with its update's component against the consensus removed; the consensus then takes in its
        direction."""
        entries = slice(None) if self.mask is None else self.mask
        delta = arrival.delta[entries].astype(np.float32, copy=False)
        self.arrivals += 1
        if self.mean is not None:
            length = float(np.dot(self.mean, self.mean))
            along = float(np.dot(delta, self.mean))
            if along < 0 and length > 0:
                delta = delta - np.float32(along / length) * self.mean
                weights = arrival.weights.copy()
                weights[entries] = arrival.base[entries] + delta
                arrival = replace(arrival, weights=weights)
                self.projected += 1
        size = l2_norm(delta)
        vote = delta / np.float32(size) if size > 0 else delta  # one vote per update, whatever its norm
        if self.mean is None:
            self.mean = (np.float32(1.0 - self.decay) * vote).astype(np.float32)
        else:
            self.mean = np.float32(self.decay) * self.mean + np.float32(1.0 - self.decay) * vote
        return arrival

    def summary(self) -> dict:
        """The projection's figure for ``summary.json``."""
        return {"update-against-consensus": self.projected}
