"""How much of FedRevive's Eq. (3) step is distillation: ``beta(tau)`` and the KD half's size, per run.

``x <- x + eta_s [ (1 - beta) Delta + beta Delta_KD ]`` does what the paper says only where
``beta`` is large and ``Delta_KD`` is not negligible next to ``Delta`` (its Sec. 3.2 and App. G
read the two halves' effects apart). These are the two quantities that tell whether a run is
in that regime (a ``tau_max`` far above the jobs in flight keeps ``beta`` small and the KD half
negligible; measured: benchmarks/fedrevive-fmnist/README.md); both go into the run's summary.
"""

from __future__ import annotations

import math

import numpy as np


class MixingTally:
    """Running figures of ``beta(tau)`` over arrivals and of the KD half over KD updates.

    The KD half's share of a step is ``||beta Delta_KD|| / ||(1 - beta) Delta||`` over the model's
    parameters (``mask``; BatchNorm running statistics left out); its geometric
    mean is reported because the ratio spans orders of magnitude (and is infinite at ``beta = 1``,
    which is then counted apart).
    """

    state_attributes = ("arrivals", "beta_sum", "beta_above", "kd_updates", "log_share_sum", "log_norm_ratio_sum",
                        "share_infinite")

    #: ``beta`` thresholds whose exceedance shares are reported.
    THRESHOLDS = (0.25, 0.5, 0.75)

    def __init__(self, mask: np.ndarray | None = None) -> None:
        self.mask = mask  # the entries the norms are taken over (the model's parameters); None = all
        self.arrivals = 0
        self.beta_sum = 0.0
        self.beta_above = np.zeros(len(self.THRESHOLDS), dtype=np.int64)
        self.kd_updates = 0
        self.log_share_sum = 0.0
        self.log_norm_ratio_sum = 0.0
        self.share_infinite = 0

    def observe_beta(self, beta: float) -> None:
        """One arrival's ``beta(tau)``."""
        self.arrivals += 1
        self.beta_sum += beta
        self.beta_above += np.asarray([beta > t for t in self.THRESHOLDS], dtype=np.int64)

    def observe_kd(self, beta: float, delta: np.ndarray, delta_kd: np.ndarray) -> None:
        """One KD update's halves (``Delta`` the client's, ``Delta_KD`` the distilled one)."""
        if self.mask is not None:
            delta, delta_kd = delta[self.mask], delta_kd[self.mask]
        delta_norm = float(np.linalg.norm(delta))
        kd_norm = float(np.linalg.norm(delta_kd))
        self.kd_updates += 1
        tiny = np.finfo(np.float64).tiny  # an update of exactly zero (a teacher equal to the student) stays finite
        self.log_norm_ratio_sum += math.log10(max(kd_norm, tiny) / max(delta_norm, tiny))
        if beta >= 1.0:
            self.share_infinite += 1
            return
        self.log_share_sum += math.log10(max(beta * kd_norm, tiny) / max((1.0 - beta) * delta_norm, tiny))

    def summary(self) -> dict[str, float | int]:
        """``beta-mean``, ``beta-share-above-<t>``, ``kd-share-geomean`` and ``kd-norm-ratio-geomean``."""
        figures: dict[str, float | int] = {"beta-mean": round(self.beta_sum / max(self.arrivals, 1), 4)}
        for threshold, count in zip(self.THRESHOLDS, self.beta_above):
            figures[f"beta-share-above-{threshold}"] = round(int(count) / max(self.arrivals, 1), 4)
        finite = self.kd_updates - self.share_infinite
        if finite:
            figures["kd-share-geomean"] = float(f"{10 ** (self.log_share_sum / finite):.4g}")
        if self.kd_updates:
            figures["kd-norm-ratio-geomean"] = float(f"{10 ** (self.log_norm_ratio_sum / self.kd_updates):.4g}")
        if self.share_infinite:
            figures["kd-updates-at-beta-1"] = self.share_infinite
        return figures
