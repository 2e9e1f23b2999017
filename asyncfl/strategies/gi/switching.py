"""Switching back to plain aggregation late in training (gradient-inversion paper, Sec. 3.2).

Late in training the global model moves little, so the raw stale update
becomes closer to the truth than the estimate. The server learns this when a
delayed client's next update arrives: that update was computed on the model of
the version the earlier estimate was made at, so it is the true unstale update
the estimate stood for. With ``E1 = |estimate - true|_1`` and
``E2 = |stale - true|_1``, the first time ``E1 > E2`` fixes the switching point;
from then on the aggregated update is ``gamma * estimate + (1 - gamma) * stale``
with ``gamma`` decaying linearly from 1 to 0 over a window of
``window_fraction`` times the training time before the switch (Table 3: 10% is best).

Rule ``"first"`` is the paper's (the first comparison with ``E1 > E2``). ``margin`` asks
for ``E2 < margin * E1`` instead: the paper's text is ``margin = 1``; its reference code
switches on ``e2 < 0.9 * e1``, so an estimate only slightly worse than the stale update does
not end the compensation (with no margin the switch fired early on few comparisons and GI
compensated for a short stretch of the run; measured: benchmarks/gi/README.md, "Dirichlet 0.1").
Single comparisons are noisy (one client, one version), so rule ``"mean"``
(ours) switches only once at least ``min_comparisons`` comparisons exist and
the mean ``E1`` of the most recent ``min_comparisons`` exceeds their mean ``E2``.
"""

from __future__ import annotations

import math

import numpy as np

SWITCH_RULES = ("first", "mean")


def l1_disparity(a: np.ndarray, b: np.ndarray) -> float:
    """``sum |a - b|`` in float64."""
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).sum())


class SwitchBack:
    """Tracks ``E1`` vs ``E2`` and gives the blending weight ``gamma`` of each version.

    Parameters
    ----------
    window_fraction : float
        Length of the decay window as a fraction of the switching version (>= 0; 0 = switch at once).
    rule : {"first", "mean"}
        Switch at the first ``E1 > E2`` (the paper) or when the mean over the last ``min_comparisons`` says so.
    min_comparisons : int
        Window of the ``"mean"`` rule (>= 1).
    margin : float
        Switch when ``E2 < margin * E1`` (in ``(0, 1]``; 1 = the paper's ``E1 > E2``, 0.9 = its reference code).
    """

    state_attributes = ("switched_at", "comparisons")

    def __init__(self, window_fraction: float = 0.1, rule: str = "first", min_comparisons: int = 3,
                 margin: float = 1.0) -> None:
        # the values are checked by GICompensationConfig, where users set them
        self.window_fraction = window_fraction
        self.rule = rule
        self.min_comparisons = min_comparisons
        self.margin = margin
        self.switched_at: int | None = None
        self.comparisons: list[tuple[int, float, float]] = []  # (version, E1, E2)

    @property
    def window(self) -> int:
        """Decay window in versions (0 before the switch)."""
        if self.switched_at is None:
            return 0
        return math.ceil(self.window_fraction * self.switched_at)

    def observe(self, version: int, estimate: np.ndarray, stale: np.ndarray, true: np.ndarray) -> None:
        """Compare an earlier estimate and the stale update it replaced with the true update, at ``version``."""
        e1, e2 = l1_disparity(estimate, true), l1_disparity(stale, true)
        self.comparisons.append((version, e1, e2))
        if self.switched_at is None and self._says_switch():
            self.switched_at = version

    def _says_switch(self) -> bool:
        window = 1 if self.rule == "first" else self.min_comparisons  # "first" is the mean over one comparison
        if len(self.comparisons) < window:
            return False
        recent = self.comparisons[-window:]
        return sum(c[2] for c in recent) < self.margin * sum(c[1] for c in recent)

    def gamma(self, version: int) -> float:
        """Weight of the estimate at ``version``: 1 before the switch, then a linear decay to 0."""
        if self.switched_at is None or version < self.switched_at:
            return 1.0
        if self.window == 0:
            return 0.0
        return max(0.0, 1.0 - (version - self.switched_at) / self.window)
