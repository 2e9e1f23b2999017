"""A bound on each arriving update's norm, relative to the recent updates: no single reply moves the model far.

The update of an arrival is ``Delta = weights - base``, taken apart in groups bounded each on its
own: the trained entries, and the BatchNorm running statistics (computed from client data too,
on another scale; integer counters are left out). Each group's L2 norm is compared with a
reference: the median norm
of the last ``window`` updates that arrived (every arrival's raw norm enters the window, so
the median stays an honest one while fewer than half of the recent updates are faulty); while
fewer than ``MIN_HISTORY`` norms are known, the norm of the model the update was trained from
(an honest local program moves a model by a fraction of its own norm; noise or a scaled update
from a faulty node moves it by many times that; an all-zero initial model gives no reference, and
its first updates pass unbounded). A zero median (honest updates that no longer move the model)
bounds every update at zero. An update whose norm exceeds ``multiple`` times the reference is

* ``"clip"`` (default): that group scaled back to ``multiple x reference`` along its own
  direction, and aggregated; or
* ``"reject"``: rejected with the reason ``update-norm`` (counted, never aggregated).

This is norm bounding as studied against model poisoning by Sun et al. (2019), "Can you really
backdoor federated learning?", with the adaptive median reference of centred-clipping methods
(Karimireddy et al., 2021, "Learning from history for Byzantine robust optimization") instead of
a fixed threshold, so the same ``multiple`` suits any model, learning rate and local program.
It bounds a faulty update's influence; it does not detect one that stays within the bound
(``docs/security.md``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from asyncfl.server_app.replies import RejectedReply
from asyncfl.strategies.arrival import Arrival

ACTIONS = ("clip", "reject")
#: Norms needed before the running median is the reference (before: the base model's norm).
MIN_HISTORY = 3


def l2_norm(vector: np.ndarray) -> float:
    """L2 norm of a float32 vector, scaled by its largest magnitude first so that no square overflows."""
    largest = float(np.abs(vector).max()) if vector.size else 0.0
    if largest == 0.0:
        return 0.0
    scaled = vector / np.float32(largest)
    return largest * math.sqrt(float(np.dot(scaled, scaled)))


class UpdateNormBound:
    """Clips (or rejects) an arrival whose update norm exceeds ``multiple`` x the reference.

    Parameters
    ----------
    multiple : float
        The bound as a multiple of the reference norm (> 1; the engine builds none for 0 = off).
    action : {"clip", "reject"}
        What happens to an update beyond the bound.
    groups : sequence of (numpy.ndarray of bool or None)
        The entries bounded together, each group against its own history (the codec's trained entries and
        BatchNorm statistics); ``None`` in it: every entry. Default: one group of every entry.
    window : int
        How many recent norms the median is taken over: short enough to follow honest norms when they grow
        (updates grow several-fold as a model leaves its initial plateau; a median over 64 lagged that
        growth and clipped a tenth of the honest updates there), long enough that a minority of faulty
        nodes cannot make half of it.
    """

    state_attributes = ("group_norms", "clipped", "rejected", "largest_ratio")

    def __init__(self, multiple: float, action: str = "clip", groups=(None,), window: int = 16) -> None:
        if action not in ACTIONS:
            raise ValueError(f"update-norm action {action!r} is not valid; choose one of: {', '.join(ACTIONS)}")
        self.multiple = float(multiple)
        self.action = action
        self.groups = list(groups)
        self.group_norms: list[deque[float]] = [deque(maxlen=window) for _ in self.groups]
        self.clipped = 0  # updates with at least one group clipped
        self.rejected = 0
        self.largest_ratio = 0.0  # the largest norm / reference seen: how close honest updates came to the bound

    @property
    def norms(self) -> deque:
        """The first group's recent norms (the trained entries')."""
        return self.group_norms[0]

    def reference(self, base: np.ndarray, group: int = 0) -> float:
        """The norm a group's update is compared with: the median of its recent ones, or the base model's own."""
        norms = self.group_norms[group]
        if len(norms) >= MIN_HISTORY:
            return float(np.median(norms))
        return self._norm(base, self.groups[group])

    def apply(self, arrival: Arrival) -> Arrival | RejectedReply:
        """``arrival`` as it may be aggregated (a group beyond its bound clipped), or the rejection."""
        delta = arrival.delta
        scales = []
        for g, mask in enumerate(self.groups):
            norm = self._norm(delta, mask)
            known = len(self.group_norms[g]) >= MIN_HISTORY
            reference = self.reference(arrival.base, g)
            self.group_norms[g].append(norm)
            if reference <= 0 and not known:  # an all-zero model and no history yet: nothing to judge by
                continue
            bound = self.multiple * reference  # a zero median (updates that no longer move) bounds at zero
            if reference > 0:
                self.largest_ratio = max(self.largest_ratio, norm / reference)
            if norm > bound:
                scales.append((mask, bound / norm, norm, reference))
        if not scales:
            return arrival
        if self.action == "reject":
            self.rejected += 1
            _, _, norm, reference = scales[0]
            return RejectedReply("update-norm", f"update norm {norm:.4g} exceeds {self.multiple:g} x the reference "
                                                f"{reference:.4g} (the recent updates' median norm)")
        self.clipped += 1
        weights = arrival.weights.copy()
        for mask, scale, _, _ in scales:
            entries = slice(None) if mask is None else mask
            weights[entries] = arrival.base[entries] + np.float32(scale) * delta[entries]
        return replace(arrival, weights=weights)

    @staticmethod
    def _norm(vector: np.ndarray, mask: np.ndarray | None) -> float:
        return l2_norm(vector if mask is None else vector[mask])

    def summary(self) -> dict:
        """The bound's figures for ``summary.json``."""
        return {"update-norm-bound": self.multiple, "update-norm-action": self.action,
                "update-norm-clipped": self.clipped, "update-norm-rejected": self.rejected,
                "update-norm-largest-ratio": round(self.largest_ratio, 4),
                "update-norm-median": round(float(np.median(self.norms)), 6) if self.norms else None,
                "update-norm-groups": len(self.groups)}
