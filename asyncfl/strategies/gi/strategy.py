"""Gradient-inversion compensation of stale updates ("gradient-inversion-stale-updates").

Semi-asynchronous FedAvg in which a stale update from client ``i`` (trained
from ``w^{t-tau}``) is replaced, before averaging, by an estimate of the update
the client would have sent from the current model ``w^t`` (Fig. 2):

1. Uniqueness (Sec. 3.4, Eq. 7-8): only updates whose mean cosine distance to
   this round's unstale updates exceeds the average pairwise distance among the
   unstale updates of version ``t - tau`` are compensated; others are averaged as they are.
2. Inversion (Sec. 3.1, 3.3): ``D_rec`` (about half the client's sample count,
   soft labels) is fitted so that replaying the client's own SGD program from
   ``w^{t-tau}`` reproduces the top-K coordinates of the stale update (L1), warm
   started from the client's previous ``D_rec``.
3. Estimate: ``LocalUpdate(w^t; D_rec) - w^t`` replaces the trainable part of the
   update (BatchNorm statistics, if any, keep the stale values).
4. Switching back (Sec. 3.2): once a later update of the same client shows the
   estimate further from the truth than the raw stale update, the estimate is
   blended out with a linearly decaying ``gamma``.

The authors' public script overwrites the estimate with the raw stale update
before the switching point (a condition bug); this implements the paper's text.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from asyncfl.strategies.base import Arrival
from asyncfl.strategies.fedavg import FedAvg
from asyncfl.strategies.gi.inversion import InversionConfig, RecoveredSet, invert_update, replay_update
from asyncfl.strategies.gi.switching import SwitchBack
from asyncfl.strategies.gi.uniqueness import adaptive_threshold, is_unique
from asyncfl.strategies.gi.unrolled import FlatLayout, LocalProgram
from asyncfl.strategies.user_inputs import checked_model_fn


class GICompensation(FedAvg):
    """FedAvg whose unique stale updates are converted to estimated unstale ones by gradient inversion.

    Parameters
    ----------
    model_fn : callable
        Builds the run's architecture (your ``Net``).
    input_shape : tuple of int
        One sample's ``(C, H, W)``.
    num_classes : int
        Classes of the soft labels.
    local_program : LocalProgram
        The clients' local training (optimizer, learning rate, batches), replayed exactly.
    inversion : InversionConfig
        Size of ``D_rec``, iterations, learning rate, top-K share.
    switch_window : float
        Decay window of ``gamma`` as a fraction of the switching version (Table 3: 0.1).
    switch_rule, switch_comparisons : str, int
        When to switch back (see :class:`SwitchBack`): the paper's first ``E1 > E2``, or a running mean.
    uniqueness : bool
        Apply the Eq. 7-8 test (False: invert every stale update).
    server_lr : float
        FedAvg's server learning rate.
    seed : int
        Seeds the random initial ``D_rec``.
    """

    def __init__(self, model_fn: Callable[[], torch.nn.Module], input_shape: tuple[int, ...], num_classes: int,
                 local_program: LocalProgram, inversion: InversionConfig = InversionConfig(), switch_window: float = 0.1,
                 uniqueness: bool = True, server_lr: float = 1.0, seed: int = 0, switch_rule: str = "first",
                 switch_comparisons: int = 3, **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        if not isinstance(local_program, LocalProgram):
            raise ValueError("GICompensation needs local_program: a LocalProgram describing the clients' SGD "
                             f"(steps or epochs, batch size, lr, momentum), got {type(local_program).__name__}")
        self.layout = FlatLayout(checked_model_fn(model_fn, "GICompensation")())
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.program = local_program
        self.inversion = inversion
        self.uniqueness = uniqueness
        self.seed = seed
        self.switch = SwitchBack(switch_window, switch_rule, switch_comparisons)
        self._recovered: dict[int, RecoveredSet] = {}
        self._thresholds: dict[int, float] = {}
        # client -> [(version the estimate was made at, estimated param update, stale param update)]
        self._pending: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        self.inversions = 0
        self.warm_starts = 0
        self.not_unique = 0
        self.after_switch = 0
        self.no_sample_count = 0
        self.inversion_seconds = 0.0
        self.disparity_ratios: list[float] = []

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        version = arrivals[0].base_version + arrivals[0].staleness
        fresh = [a.delta for a in arrivals if a.staleness == 0]
        threshold = adaptive_threshold(fresh)
        if threshold is not None:
            self._thresholds[version] = threshold
        deltas = []
        for arrival in arrivals:
            self._compare_with_estimate(arrival, version)
            deltas.append(arrival.delta if arrival.staleness == 0 else self._compensate(arrival, current, version, fresh))
        return deltas, [float(a.num_examples) for a in arrivals]

    def _compensate(self, arrival: Arrival, current: np.ndarray, version: int, fresh: list[np.ndarray]) -> np.ndarray:
        gamma = self.switch.gamma(version)
        if gamma == 0.0:
            self.after_switch += 1
            return arrival.delta
        if arrival.num_examples <= 0:
            self.no_sample_count += 1  # a client that does not report its sample count cannot be replayed
            return arrival.delta
        if self.uniqueness and not is_unique(arrival.delta, fresh, self._thresholds.get(arrival.base_version)):
            self.not_unique += 1
            return arrival.delta
        stale = self.layout.param_vector(arrival.delta)
        estimate_params = self._estimate(arrival, current, stale, version)
        estimate = arrival.delta.copy()
        estimate[self.layout.param_index] = estimate_params
        if self.switch.switched_at is None:
            self._pending.setdefault(arrival.client_index, []).append((version, estimate_params, stale))
        return np.float32(gamma) * estimate + np.float32(1.0 - gamma) * arrival.delta

    def _estimate(self, arrival: Arrival, current: np.ndarray, stale: np.ndarray, version: int) -> np.ndarray:
        base_params, base_buffers = self.layout.split(arrival.base)
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, arrival.client_index, version])
                                                      .generate_state(1)[0]))
        warm = self._recovered.get(arrival.client_index)
        result = invert_update(self.layout.model, base_params, base_buffers, torch.from_numpy(stale), self.program,
                               arrival.num_examples, self.input_shape, self.num_classes, self.inversion, generator,
                               warm_start=warm)
        self._recovered[arrival.client_index] = result.recovered
        self.inversions += 1
        self.warm_starts += result.iterations == self.inversion.warm_iterations and warm is not None
        self.inversion_seconds += result.seconds
        if result.initial_disparity > 0:
            self.disparity_ratios.append(result.disparity / result.initial_disparity)
        params, buffers = self.layout.split(current)
        return replay_update(self.layout.model, params, buffers, result.recovered, self.program,
                             arrival.num_examples).numpy()

    def _compare_with_estimate(self, arrival: Arrival, version: int) -> None:
        """E1 vs E2 (Sec. 3.2) when ``arrival`` is the true update an earlier estimate stood for.

        A delayed client is free again only after its stale reply is aggregated,
        so its next job starts one version after the estimate was made: the
        newest estimate at or before ``arrival.base_version`` is compared.
        """
        pending = self._pending.get(arrival.client_index)
        if not pending:
            return
        earlier = [entry for entry in pending if entry[0] <= arrival.base_version]
        if not earlier:
            return
        _, estimate, stale = earlier[-1]
        self.switch.observe(version, estimate, stale, self.layout.param_vector(arrival.delta))
        self._pending[arrival.client_index] = [entry for entry in pending if entry[0] > arrival.base_version]
        if self.switch.switched_at is not None:
            self._pending.clear()

    def summary(self) -> dict[str, float | int | str]:
        out = dict(super().summary())
        out.update({
            "gi-inversions": self.inversions,
            "gi-warm-starts": self.warm_starts,
            "gi-not-unique": self.not_unique,
            "gi-after-switch": self.after_switch,
            "gi-no-sample-count": self.no_sample_count,
            "gi-seconds-per-inversion": round(self.inversion_seconds / self.inversions, 4) if self.inversions else 0.0,
            "gi-disparity-ratio-mean": round(float(np.mean(self.disparity_ratios)), 4) if self.disparity_ratios else None,
            "gi-switch-version": self.switch.switched_at,
            "gi-error-comparisons": len(self.switch.comparisons),
        })
        if self.switch.comparisons:
            e1 = [c[1] for c in self.switch.comparisons]
            e2 = [c[2] for c in self.switch.comparisons]
            out["gi-e1-mean"], out["gi-e2-mean"] = round(float(np.mean(e1)), 6), round(float(np.mean(e2)), 6)
        return out
