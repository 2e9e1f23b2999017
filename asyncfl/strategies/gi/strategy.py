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

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import torch

from asyncfl.strategies.base import Arrival
from asyncfl.strategies.fedavg import FedAvg, FedAvgConfig
from asyncfl.strategies.gi.inversion import InversionConfig, InversionResult, RecoveredSet, invert_update, replay_update
from asyncfl.strategies.gi.switching import SWITCH_RULES, SwitchBack
from asyncfl.strategies.gi.uniqueness import adaptive_threshold, is_unique
from asyncfl.strategies.gi.unrolled import FlatLayout, LocalProgram, Tensors
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
    switch_margin : float
        Switch only when ``E2 < switch_margin * E1`` (default 0.9, the reference code's ``e2 < 0.9 * e1``;
        1 = the paper's text, which switched early in our mnist5k study: benchmarks/gi/README.md).
    uniqueness : bool
        Apply the Eq. 7-8 test (False: invert every stale update).
    inversion_workers : int
        Inversions of one round run this many at once, on threads (ours, not the paper's: its
        inversions are independent given the round's decisions); give it the cores the server can
        spare. Above 1, every inversion runs on one torch thread, and results are the same bits
        for every value (those of one at a time on one torch thread, the built-in server's default).
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
    switch_margin: float = knob(0.9, above=0, maximum=1)
    uniqueness: bool = knob(True)
    inversion_workers: int = knob(1, minimum=1)

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

    run_config_name = "gi-compensation"
    config_class = GICompensationConfig
    # the replicas and the layout's network are scratch space, loaded afresh for every inversion
    state_attributes = FedAvg.state_attributes + (
        "switch", "_recovered", "_thresholds", "_pending", "inversions", "warm_starts", "not_unique", "after_switch",
        "no_sample_count", "inversion_seconds", "inversion_wall_seconds", "disparity_ratios")

    def __init__(self, model_fn: Callable[[], torch.nn.Module], input_shape: tuple[int, ...], num_classes: int,
                 local_program: LocalProgram, *, server_lr: float = 1.0, reconstruction_fraction: float = 0.5,
                 max_reconstruction: int = 64, inversion_iterations: int = 100, warm_iterations: int = 40,
                 inversion_lr: float = 0.1, keep_fraction: float = 0.05, switch_window: float = 0.1,
                 switch_rule: str = "first", switch_comparisons: int = 3, switch_margin: float = 0.9,
                 uniqueness: bool = True, inversion_workers: int = 1, seed: int = 0,
                 **flower_options: Any) -> None:
        super().__init__(server_lr, **flower_options)
        self.config = GICompensationConfig.from_arguments(locals())
        if not isinstance(local_program, LocalProgram):
            raise ConfigError("GICompensation needs local_program: a LocalProgram describing the clients' SGD "
                             f"(steps or epochs, batch size, lr, momentum), got {type(local_program).__name__}")
        self._model_fn = checked_model_fn(model_fn, "GICompensation")
        self.layout = FlatLayout(self._model_fn())
        self._replicas: list[torch.nn.Module] = []  # one network per concurrent inversion
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.program = local_program
        self.inversion = self.config.inversion
        self.seed = seed
        self.switch = SwitchBack(switch_window, switch_rule, switch_comparisons, switch_margin)
        self._recovered: dict[int, RecoveredSet] = {}
        self._thresholds: dict[int, float] = {}
        self._pending: dict[int, list[_Estimate]] = {}  # client -> estimates not yet compared with the truth
        self.inversions = 0
        self.warm_starts = 0
        self.not_unique = 0
        self.after_switch = 0
        self.no_sample_count = 0
        self.inversion_seconds = 0.0
        self.inversion_wall_seconds = 0.0
        self.disparity_ratios: list[float] = []

    @classmethod
    def from_config(cls, config: GICompensationConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "GICompensation":
        """Built-in app: replays the run-config's local-training program on the zoo model."""
        if resources is None or resources.train_config is None:
            raise ConfigError("GICompensation needs the built-in app's model, data shape and local-training config")
        return cls(resources.make_model, resources.input_shape, resources.num_classes,
                   LocalProgram.from_message_config(resources.train_config), seed=resources.seed,
                   **config.keywords(), **flower_options)

    def round_updates(self, arrivals: list[Arrival], current: np.ndarray) -> tuple[list[np.ndarray], list[float]]:
        """Each arrival's update for the round's average; the round's inversions run ``inversion_workers`` at once.

        The decisions (switching, uniqueness) are taken in arrival order exactly as one at a time;
        only the inversions themselves, which are independent given those decisions, run
        concurrently. A client's second arrival in the same round waits for its first one's
        inversion (its warm start and its switching comparison need it).
        """
        version = arrivals[0].base_version + arrivals[0].staleness
        fresh = [a.delta for a in arrivals if a.staleness == 0]
        threshold = adaptive_threshold(fresh)
        if threshold is not None:
            self._thresholds[version] = threshold
        current_state: list[Tensors] = []  # w^t as (params, buffers), split once a round needs it

        def run(jobs: list[_Inversion]) -> None:
            if not jobs:
                return
            if not current_state:
                current_state.extend(self.layout.split(current))
            self._run_inversions(jobs, *current_state)

        updates: list[np.ndarray | _Inversion] = []
        queued: list[_Inversion] = []
        for arrival in arrivals:
            if any(job.arrival.client_index == arrival.client_index for job in queued):
                run(queued)
                queued = []
            self._compare_with_estimate(arrival, version)
            job = None if arrival.staleness == 0 else self._plan(arrival, version, fresh)
            if job is not None:
                queued.append(job)
            updates.append(arrival.delta if job is None else job)
        run(queued)
        deltas = [u if isinstance(u, np.ndarray) else u.compensated(self.layout.param_index) for u in updates]
        return deltas, [float(a.num_examples) for a in arrivals]

    def _plan(self, arrival: Arrival, version: int, fresh: list[np.ndarray]) -> _Inversion | None:
        """The inversion a stale ``arrival`` needs, or None when its raw update is averaged as it is."""
        gamma = self.switch.gamma(version)
        if gamma == 0.0:
            self.after_switch += 1
            return None
        if arrival.num_examples <= 0:
            self.no_sample_count += 1  # a client that does not report its sample count cannot be replayed
            return None
        if self.config.uniqueness and not is_unique(arrival.delta, fresh, self._thresholds.get(arrival.base_version)):
            self.not_unique += 1
            return None
        base_params, base_buffers = self.layout.split(arrival.base)
        seed = int(np.random.SeedSequence([self.seed, arrival.client_index, version]).generate_state(1)[0])
        job = _Inversion(arrival, gamma, self.layout.param_vector(arrival.delta), base_params, base_buffers,
                         torch.Generator().manual_seed(seed), self._recovered.get(arrival.client_index))
        if self.switch.switched_at is None:
            job.estimate = _Estimate(version, job.stale)
            self._pending.setdefault(arrival.client_index, []).append(job.estimate)
        return job

    def _run_inversions(self, jobs: list[_Inversion], params: Tensors, buffers: Tensors) -> None:
        """Invert each job's stale update and replay its ``D_rec`` from ``w^t`` (``params``, ``buffers``); then
        record them in arrival order."""
        started = time.perf_counter()
        if self.config.inversion_workers == 1:
            for job in jobs:
                self._invert(job, self.layout.model, params, buffers)
        else:
            # One torch thread per inversion, also when a round has a single one, so results never depend on
            # how many ran side by side; single-threaded workers were also the fastest (measured:
            # benchmarks/server_methods/README.md, "GI compensation: inversions side by side").
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                self._invert_concurrently(jobs, params, buffers)
            finally:
                torch.set_num_threads(threads)
        self.inversion_wall_seconds += time.perf_counter() - started
        for job in jobs:
            result = job.result
            self._recovered[job.arrival.client_index] = result.recovered
            self.inversions += 1
            self.warm_starts += result.iterations == self.inversion.warm_iterations and job.warm is not None
            self.inversion_seconds += result.seconds
            if result.initial_disparity > 0:
                self.disparity_ratios.append(result.disparity / result.initial_disparity)

    def _invert_concurrently(self, jobs: list[_Inversion], params: Tensors, buffers: Tensors) -> None:
        workers = min(self.config.inversion_workers, len(jobs))
        while len(self._replicas) < workers:
            self._replicas.append(self._model_fn())
        free: queue.SimpleQueue[torch.nn.Module] = queue.SimpleQueue()
        for replica in self._replicas[:workers]:
            free.put(replica)

        def invert_on_a_free_replica(job: _Inversion) -> None:
            model = free.get()  # torch.func.functional_call swaps a module's tensors: one thread per module
            try:
                self._invert(job, model, params, buffers)
            finally:
                free.put(model)

        # Longest first, so that no worker is left with a long inversion at the end (results are recorded
        # in arrival order regardless).
        with ThreadPoolExecutor(workers, thread_name_prefix="gi-inversion") as pool:
            list(pool.map(invert_on_a_free_replica, sorted(jobs, key=self._inversion_cost, reverse=True)))

    def _inversion_cost(self, job: _Inversion) -> float:
        """Samples passed through the network in one inversion, up to a constant: iterations x replayed steps
        x the recovered batch size."""
        n = job.arrival.num_examples
        size = self.inversion.rec_size(n)
        warm = job.warm is not None and len(job.warm) == size
        iterations = self.inversion.warm_iterations if warm else self.inversion.iterations
        return iterations * self.program.total_steps(n) * size / min(size, self.program.batches_per_epoch(n))

    def _invert(self, job: _Inversion, model: torch.nn.Module, params: Tensors, buffers: Tensors) -> None:
        """``D_rec`` from ``w^{t-tau}``, then ``LocalUpdate(w^t; D_rec) - w^t`` (Fig. 2), into ``job``."""
        job.result = invert_update(model, job.base_params, job.base_buffers, torch.from_numpy(job.stale),
                                   self.program, job.arrival.num_examples, self.input_shape, self.num_classes,
                                   self.inversion, job.generator, warm_start=job.warm)
        job.estimate_params = replay_update(model, params, buffers, job.result.recovered, self.program,
                                            job.arrival.num_examples).numpy()
        if job.estimate is not None:
            job.estimate.params = job.estimate_params

    def _compare_with_estimate(self, arrival: Arrival, version: int) -> None:
        """E1 vs E2 (Sec. 3.2) when ``arrival`` is the true update an earlier estimate stood for.

        A delayed client is free again only after its stale reply is aggregated,
        so its next job starts one version after the estimate was made: the
        newest estimate at or before ``arrival.base_version`` is compared.
        """
        pending = self._pending.get(arrival.client_index)
        if not pending:
            return
        earlier = [entry for entry in pending if entry.version <= arrival.base_version]
        if not earlier:
            return
        entry = earlier[-1]
        self.switch.observe(version, entry.params, entry.stale, self.layout.param_vector(arrival.delta))
        self._pending[arrival.client_index] = [entry for entry in pending if entry.version > arrival.base_version]
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
            "gi-inversion-workers": self.config.inversion_workers,
            "gi-inversion-wall-seconds": round(self.inversion_wall_seconds, 3),
            "gi-disparity-ratio-mean": round(float(np.mean(self.disparity_ratios)), 4) if self.disparity_ratios else None,
            "gi-switch-version": self.switch.switched_at,
            "gi-error-comparisons": len(self.switch.comparisons),
        })
        if self.switch.comparisons:
            e1 = [c[1] for c in self.switch.comparisons]
            e2 = [c[2] for c in self.switch.comparisons]
            out["gi-e1-mean"], out["gi-e2-mean"] = round(float(np.mean(e1)), 6), round(float(np.mean(e2)), 6)
        return out


@dataclass
class _Estimate:
    """An estimate waiting for the client's next, true update (the switching comparison, Sec. 3.2)."""

    version: int
    stale: np.ndarray
    params: np.ndarray | None = None  # filled in once the inversion has run


@dataclass
class _Inversion:
    """One stale update to invert, with everything the round decided for it beforehand."""

    arrival: Arrival
    gamma: float
    stale: np.ndarray
    base_params: Tensors
    base_buffers: Tensors
    generator: torch.Generator
    warm: RecoveredSet | None
    estimate: _Estimate | None = None
    result: InversionResult | None = None
    estimate_params: np.ndarray | None = None

    def compensated(self, param_index: np.ndarray) -> np.ndarray:
        """``gamma * estimate + (1 - gamma) * stale``; non-trainable entries (BatchNorm statistics) stay stale."""
        estimate = self.arrival.delta.copy()
        estimate[param_index] = self.estimate_params
        return np.float32(self.gamma) * estimate + np.float32(1.0 - self.gamma) * self.arrival.delta
