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

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import torch

from asyncfl.strategies.base import Arrival
from asyncfl.strategies.fedavg import FedAvg, FedAvgConfig
from asyncfl.strategies.gi.inversion import InversionConfig, RecoveredSet, invert_update, replay_update
from asyncfl.strategies.gi.switching import SWITCH_RULES, SwitchBack
from asyncfl.strategies.gi.uniqueness import adaptive_threshold, is_unique
from asyncfl.strategies.gi.unrolled import FlatLayout, LocalProgram
from asyncfl.strategies.resources import StrategyResources
from asyncfl.strategies.settings import ConfigError, knob
from asyncfl.strategies.user_inputs import checked_model_fn


@dataclass(frozen=True)
class GICompensationConfig(FedAvgConfig):
    """Gradient-inversion compensation's knobs (run-config ``gi.*`` and ``fedavg.server-lr``).

    Parameters
    ----------
    reconstruction_fraction, max_reconstruction : float, int
        ``|D_rec| / |D_i|`` (the paper settles at 1/2, App. D) and its cap (compute grows with it).
    inversion_iterations, warm_iterations : int
        Adam iterations from a random ``D_rec``, and warm-started from the client's previous one.
    inversion_lr : float
        Adam learning rate on ``D_rec``'s inputs and label logits.
    keep_fraction : float
        Top-K share of the update's coordinates in the disparity (0.05 = the paper's 95 % sparsification).
    switch_window : float
        Decay window of ``gamma`` as a fraction of the switching version (Table 3: 0.1).
    switch_rule, switch_comparisons : str, int
        Switch back at the first ``E1 > E2`` (the paper) or when the mean over the last comparisons says so.
    uniqueness : bool
        Apply the Eq. 7-8 test (False: invert every stale update).
    """

    label: ClassVar[str] = "GICompensation"
    prefix: ClassVar[str] = "gi"

    reconstruction_fraction: float = knob(0.5, above=0, maximum=10)
    max_reconstruction: int = knob(64, minimum=1)
    inversion_iterations: int = knob(100, minimum=1)
    warm_iterations: int = knob(40, minimum=1)
    inversion_lr: float = knob(0.1, above=0)
    keep_fraction: float = knob(0.05, above=0, maximum=1)
    switch_window: float = knob(0.1, minimum=0)
    switch_rule: str = knob("first", choices=SWITCH_RULES)
    switch_comparisons: int = knob(3, minimum=1)
    uniqueness: bool = knob(True)

    @property
    def inversion(self) -> InversionConfig:
        """The knobs of one inversion."""
        return InversionConfig(rec_fraction=self.reconstruction_fraction, max_rec=self.max_reconstruction,
                               iterations=self.inversion_iterations, warm_iterations=self.warm_iterations,
                               lr=self.inversion_lr, keep_fraction=self.keep_fraction)

    def check_run_config(self, run_config: Mapping[str, Any]) -> None:
        if str(run_config["optimizer"]) != "sgd":
            raise ConfigError("gi-compensation replays the clients' SGD program (the paper: inversion fails under "
                              f"Adam); set optimizer = 'sgd' (got {run_config['optimizer']!r})")


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
    server_lr, reconstruction_fraction, ..., uniqueness
        The method's knobs: see :class:`GICompensationConfig`.
    seed : int
        Seeds the random initial ``D_rec``.
    """

    config_class = GICompensationConfig

    def __init__(self, model_fn: Callable[[], torch.nn.Module], input_shape: tuple[int, ...], num_classes: int,
                 local_program: LocalProgram, *, server_lr: float = 1.0, reconstruction_fraction: float = 0.5,
                 max_reconstruction: int = 64, inversion_iterations: int = 100, warm_iterations: int = 40,
                 inversion_lr: float = 0.1, keep_fraction: float = 0.05, switch_window: float = 0.1,
                 switch_rule: str = "first", switch_comparisons: int = 3, uniqueness: bool = True, seed: int = 0,
                 **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        self.config = GICompensationConfig(
            server_lr=server_lr, reconstruction_fraction=reconstruction_fraction, max_reconstruction=max_reconstruction,
            inversion_iterations=inversion_iterations, warm_iterations=warm_iterations, inversion_lr=inversion_lr,
            keep_fraction=keep_fraction, switch_window=switch_window, switch_rule=switch_rule,
            switch_comparisons=switch_comparisons, uniqueness=uniqueness)
        if not isinstance(local_program, LocalProgram):
            raise ValueError("GICompensation needs local_program: a LocalProgram describing the clients' SGD "
                             f"(steps or epochs, batch size, lr, momentum), got {type(local_program).__name__}")
        self.layout = FlatLayout(checked_model_fn(model_fn, "GICompensation")())
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.program = local_program
        self.inversion = self.config.inversion
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

    @classmethod
    def from_config(cls, config: GICompensationConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "GICompensation":
        """Built-in app: replays the run-config's local-training program on the zoo model."""
        if resources is None or resources.train_config is None:
            raise ValueError("GICompensation needs the built-in app's model, data shape and local-training config")
        return cls(resources.make_model, resources.input_shape, resources.num_classes,
                   LocalProgram.from_message_config(resources.train_config), seed=resources.seed,
                   **config.keywords(), **flower_options)

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
        if self.config.uniqueness and not is_unique(arrival.delta, fresh, self._thresholds.get(arrival.base_version)):
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
