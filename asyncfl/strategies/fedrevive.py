"""FedRevive: data-free knowledge distillation revives stale updates (FedRevive paper, Eq. 3, Sec. 2.2).

On an arrival with staleness ``tau`` (client model ``x_i``, update ``Delta``):

``x <- x + eta_s [ (1 - beta(tau)) Delta + beta(tau) Delta_KD ]``

with ``Delta_KD = KD-Revive(x_i, x)``:

1. the client model joins a FIFO buffer of the ``c`` most recent client models (teachers);
   its first ``T_est`` uploads also update the client's class-proportion proxy;
2. every ``T_gen`` server updates (from ``synth-start`` on) a synthesis round trains
   ``(z, theta')`` for ``K_synth`` steps on Eq. 4, the lowest-loss batch joins the KD pool
   and the generator takes the Reptile step;
3. (from ``kd-start`` on, with a non-empty pool) ``K_KD`` Adam steps distil all buffered
   teachers into a student initialised at the global model: for each teacher a minibatch
   drawn from the pool by its proxy class proportions, KL at temperature ``T``;
   ``Delta_KD = student - x``.

Before ``kd-start`` there is no KD half. ``warmup="damped"`` (default, ours) takes
AFL-DW's step ``x + eta_s (1 - beta(tau)) Delta`` there; ``warmup="raw"`` is what the
authors' reference server does: the undamped ``x + eta_s Delta`` for the updates before
``synthesis-start`` (its ``freeze_rounds``: CIFAR-10 50, FEMNIST 400), then the damped
step until KD starts. ``beta`` is AFL-DW's family (1-cosine over ``tau_max`` by default;
linear, step, constant).

DD-FedRevive (``data = "holdout"``): the pool is the server's labeled hold-out
split instead of synthetic samples, teachers are weighted by the clients' true
label proportions, and ``beta`` is a constant 0.5 (the paper's upper-bound ablation).

The student runs in eval mode, so the global model's BatchNorm statistics are not
moved by synthetic inputs. Teachers are run one after the other (not batched).
``server_device="cuda"`` runs the probes, the synthesis and the distillation on a GPU
(:mod:`asyncfl.models.device`); the random draws stay on the CPU.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from asyncfl.data.holdout import holdout_rows
from asyncfl.models.device import SERVER_DEVICES, device_problem, torch_device
from asyncfl.models.flat import load_flat, model_to_flat, parameter_mask
from asyncfl.strategies.afl_dw import afl_dw_step
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.pace import PACES
from asyncfl.strategies.resources import StrategyResources
from asyncfl.strategies.settings import ConfigError, StrategyConfig, knob
from asyncfl.strategies.user_inputs import checked_model_fn, labeled_arrays
from asyncfl.strategies.revive.generator import Generator
from asyncfl.strategies.revive.mixing import MixingTally
from asyncfl.strategies.revive.pool import KDPool
from asyncfl.strategies.revive.proxies import ClassProportionProxies, teacher_class_weights
from asyncfl.strategies.revive.synthesis import SynthesisConfig, synthesize
from asyncfl.strategies.staleness import BETA_SCHEDULES, beta_schedule, staleness_cutoff

#: The step before KD starts: AFL-DW's damped step, or the reference server's undamped one before synthesis.
WARMUPS = ("damped", "raw")
#: Where the built-in app's teacher class weights come from: probed proxies, or the real label histograms.
REVIVE_PROPORTIONS = ("proxy", "true")


@dataclass(frozen=True)
class FedReviveConfig(StrategyConfig):
    """FedRevive's knobs (run-config ``fedrevive.*``; paper defaults, FEMNIST column of its Table 6).

    Parameters
    ----------
    server_lr : float
        ``eta_s``; 0 (default) = ``g(K) = sin(pi / (2 (2K - 1)))`` for ``K`` jobs in flight (0.040
        at ``K = 20``), the largest step that staleness leaves stable
        (:mod:`asyncfl.strategies.pace`), scaled by the clients' measured response (``pace``).
        The paper's FEMNIST setting (20 in flight) is ``0.05``.
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows, as for AFL-DW, FedRevive's parameter-space step
        (:class:`asyncfl.strategies.afl_dw.AFLDWConfig`): ``"measured"`` (default) scales the stable
        step by ``2 / lambda_bound`` from each client's consecutive jobs
        (:class:`~asyncfl.strategies.pace.ResponseMeter`); ``"stable"`` keeps the bound for any client, which lags
        FedAvg where client steps are small (measured in the drop-in study: docs/methods.md).
    beta, max_staleness, beta_constant : str, float, float
        The ``beta(tau)`` family, ``tau_max`` and the constant family's value (as AFL-DW). ``tau_max`` 0 = 1.5 x
        the jobs in flight, the reference code's ratio of ``tau_max`` to the jobs in flight; the default 150
        keeps ``beta`` small at a few dozen jobs in flight, where KD barely enters the step.
    teacher_buffer_size : int
        ``c``: the most recent client models kept as teachers.
    probe_uploads, probe_temperature : int, float
        ``T_est`` (a client's first uploads that shape its class-proportion proxy) and ``T_probe``.
    synthesis_every, synthesis_start : int
        ``T_gen`` (server updates between synthesis rounds) and the update synthesis starts at.
    synthesis_batch_size, synthesis_steps : int
        Synthetic samples per round and ``K_synth`` Adam steps on ``(z, theta')``.
    generator_lr, latent_lr : float
        Adam learning rates of ``theta'`` and ``z``.
    alpha_target, alpha_feature, alpha_adversarial : float
        Weights of Eq. 4's three losses.
    reptile_step : float
        ``lambda`` of the Reptile meta-update ``theta <- (1 - lambda) theta + lambda theta'``.
    warmup : {"damped", "raw"}
        The step before KD starts: AFL-DW's ``(1 - beta)``-damped step throughout (ours), or the
        reference server's undamped ``eta_s Delta`` before ``synthesis_start`` (its ``freeze_rounds``).
    kd_start, kd_steps, kd_batch_size, kd_lr, temperature : int, int, int, float, float
        The update KD starts at, ``K_KD`` Adam steps, per-teacher minibatch, learning rate, ``T``.
    pool_capacity : int
        Synthetic samples the KD pool keeps (FIFO).
    overlap_teachers : bool
        Run the teachers' passes of a KD update on a background thread while the student trains on
        the same minibatches (ours; the teachers' outputs do not depend on the student, and the
        minibatches are drawn as before: the same bits). Uses a second core when the server has one.
    latent_dim : int
        The generator's latent size.
    server_device : {"cpu", "cuda"}
        Where the server's networks run (probes, generator, teachers, student). ``"cuda"`` needs a
        GPU that torch sees; ours (the paper does not say where its server runs).
    proportions : {"proxy", "true"}
        Built-in app only: ``true`` weights teachers by the clients' real label histograms (the
        paper's ablation). A library user passes ``true_proportions``.
    """

    label: ClassVar[str] = "FedRevive"
    prefix: ClassVar[str] = "fedrevive"

    server_lr: float = knob(0.0, minimum=0)
    pace: str = knob("measured", choices=PACES)
    beta: str = knob("cosine", choices=BETA_SCHEDULES)
    max_staleness: float = knob(150.0, minimum=0)
    beta_constant: float = knob(0.5, minimum=0, maximum=1)
    teacher_buffer_size: int = knob(8, minimum=1)
    probe_uploads: int = knob(2, minimum=1)
    probe_temperature: float = knob(1.4, above=0)
    synthesis_every: int = knob(10, minimum=1)
    synthesis_start: int = knob(50, minimum=0)
    warmup: str = knob("damped", choices=WARMUPS)
    kd_start: int = knob(100, minimum=0)
    kd_steps: int = knob(10, minimum=1)
    kd_batch_size: int = knob(32, minimum=1)
    kd_lr: float = knob(1e-4, above=0)
    temperature: float = knob(1.0, above=0)
    pool_capacity: int = knob(2048, minimum=1)
    latent_dim: int = knob(100, minimum=1)
    synthesis_batch_size: int = knob(64, minimum=1)
    synthesis_steps: int = knob(2, minimum=1)
    generator_lr: float = knob(0.01, above=0)
    latent_lr: float = knob(0.003, above=0)
    alpha_target: float = knob(1.0, minimum=0)
    alpha_feature: float = knob(0.3, minimum=0)
    alpha_adversarial: float = knob(0.1, minimum=0)
    reptile_step: float = knob(0.5, above=0, maximum=1)
    overlap_teachers: bool = knob(True)
    server_device: str = knob("cpu", choices=SERVER_DEVICES)
    proportions: str = knob("proxy", choices=REVIVE_PROPORTIONS, builtin=True)

    @property
    def synthesis(self) -> SynthesisConfig:
        """The knobs of one synthesis round."""
        return SynthesisConfig(batch_size=self.synthesis_batch_size, steps=self.synthesis_steps,
                               generator_lr=self.generator_lr, latent_lr=self.latent_lr,
                               alpha_target=self.alpha_target, alpha_feature=self.alpha_feature,
                               alpha_adv=self.alpha_adversarial, meta_lambda=self.reptile_step)

    def check(self) -> None:
        problem = device_problem(self.server_device)
        if problem:
            self.fail("server_device", problem)


@dataclass(frozen=True)
class DDFedReviveConfig(FedReviveConfig):
    """DD-FedRevive's knobs: FedRevive's (run-config ``fedrevive.*``), on the server's labeled hold-out."""

    label: ClassVar[str] = "DDFedRevive"

    def check_run_config(self, run_config: Mapping[str, Any]) -> None:
        if not float(run_config["server-holdout"]) > 0.0:
            raise ConfigError("strategy 'dd-fedrevive' distils on real labeled server data: set server-holdout > 0")


def multi_teacher_kd_loss(student_logits: list[torch.Tensor], teacher_logits: list[torch.Tensor],
                          temperature: float) -> torch.Tensor:
    """``(1/c) sum_k mean_batch KL(softmax(t_k/T) || softmax(s/T))`` over the c teachers' minibatches."""
    terms = [F.kl_div(F.log_softmax(s / temperature, dim=1), F.log_softmax(t / temperature, dim=1),
                      reduction="batchmean", log_target=True) for s, t in zip(student_logits, teacher_logits)]
    return torch.stack(terms).mean()


def multi_teacher_kd_surrogate(student_logits: list[torch.Tensor], teacher_logits: list[torch.Tensor],
                               temperature: float) -> torch.Tensor:
    """A loss with exactly the gradient of :func:`multi_teacher_kd_loss` w.r.t. the student logits.

    ``d KL / d s = (softmax(s/T) - softmax(t/T)) / (T * batch)`` per teacher, averaged over
    teachers. Written this way the gradient is exactly zero where student and teacher logits
    are equal; through ``log_softmax`` it is ~1e-9 of float noise, which Adam's normalisation
    turns into lr-sized steps (Delta_KD would not vanish when every teacher is the student).
    Its value is not the KL; use :func:`multi_teacher_kd_loss` to report that.
    """
    terms = []
    for s, t in zip(student_logits, teacher_logits):
        residual = (F.softmax(s.detach() / temperature, dim=1) - F.softmax(t / temperature, dim=1)) / len(s)
        terms.append((residual * s).sum() / temperature)
    return torch.stack(terms).mean()


class FedRevive(Strategy):
    """FedRevive (and DD-FedRevive with a real labeled ``holdout`` pool).

    Parameters
    ----------
    model_fn : callable
        Builds a fresh network of the global model's architecture (your ``Net``).
    num_classes, input_shape : int, tuple
        The task's label count and input shape (for the generator and the probes).
    server_lr, pace, beta, max_staleness, ..., reptile_step
        The method's knobs: see :class:`FedReviveConfig`.
    seed : int
        Seeds probes, synthesis and pool sampling.
    true_proportions : callable, optional
        ``(client index, number of clients) -> label histogram``; replaces the probing proxies
        (the paper's ablation). Client indices are partition ids when clients report them.
    """

    run_config_name = "fedrevive"
    config_class = FedReviveConfig
    # the student and probe network are loaded afresh for every use; the generator, pool, proxies, teachers and
    # random streams carry over (the buffer as (client, teacher network) pairs: see teacher_slots)
    state_attributes = ("_teacher_nets", "teacher_slots", "_next_slot", "proxies", "generator", "pool", "_torch_rng",
                        "_np_rng", "updates", "raw_updates", "synthesis_rounds", "kd_updates", "last_synthesis_loss", "seconds",
                        "mixing", "response_meter")

    def __init__(self, model_fn: Callable[[], nn.Module], num_classes: int, input_shape: tuple[int, int, int], *,
                 server_lr: float = 0.0, pace: str = "measured", beta: str = "cosine",
                 max_staleness: float = 150.0,
                 beta_constant: float = 0.5, teacher_buffer_size: int = 8, probe_uploads: int = 2,
                 probe_temperature: float = 1.4, synthesis_every: int = 10, synthesis_start: int = 50,
                 warmup: str = "damped", kd_start: int = 100, kd_steps: int = 10, kd_batch_size: int = 32, kd_lr: float = 1e-4,
                 temperature: float = 1.0, pool_capacity: int = 2048, latent_dim: int = 100,
                 synthesis_batch_size: int = 64, synthesis_steps: int = 2, generator_lr: float = 0.01,
                 latent_lr: float = 0.003, alpha_target: float = 1.0, alpha_feature: float = 0.3,
                 alpha_adversarial: float = 0.1, reptile_step: float = 0.5, overlap_teachers: bool = True,
                 server_device: str = "cpu", seed: int = 0,
                 true_proportions: Callable[[int, int], np.ndarray] | None = None, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        config = self.config_class.from_arguments(locals(), declared_by=FedReviveConfig)
        self.config = config
        self._measure_response(pace, server_lr)
        self.num_classes = num_classes
        make_model = checked_model_fn(model_fn, "FedRevive")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ConfigError(f"FedRevive: num_classes must be an integer >= 2, got {num_classes!r}")
        if len(tuple(input_shape)) != 3:
            raise ConfigError(f"FedRevive: input_shape must be (channels, height, width), got {input_shape!r}")
        self.make_model = make_model
        self.device = torch_device(config.server_device)
        self.student = make_model().to(self.device).eval()
        self.probe_net = make_model().to(self.device).eval()
        self._teacher_nets = [make_model().to(self.device).eval() for _ in range(config.teacher_buffer_size)]
        self._buffer: deque[tuple[int, nn.Module]] = deque()  # (client, loaded teacher), oldest first
        self._next_slot = 0
        self.true_proportions = true_proportions
        self.proxies = ClassProportionProxies(num_classes, input_shape, config.probe_uploads, config.probe_temperature,
                                              seed=seed, device=self.device)
        with torch.random.fork_rng(devices=[]):  # a seeded init on the CPU that leaves the global RNG alone
            torch.manual_seed(seed)
            self.generator = Generator(config.latent_dim, num_classes, input_shape).to(self.device)
        self.pool = KDPool(config.pool_capacity, self.device)
        self._teacher_thread = ThreadPoolExecutor(1, thread_name_prefix="fedrevive-teachers") \
            if config.overlap_teachers else None
        self.data_driven = False
        self._torch_rng = torch.Generator().manual_seed(seed)
        self._np_rng = np.random.default_rng([seed, 9])
        self.num_clients = 0
        self.updates = 0
        self.synthesis_rounds = 0
        self.kd_updates = 0
        self.raw_updates = 0
        self.last_synthesis_loss = float("nan")
        # beta(tau) and the KD half's share of each step (over the parameters), for the summary
        self.mixing = MixingTally(parameter_mask(self.student))
        # Wall seconds per phase (App. C's overhead split); never used in the math.
        self.seconds = {"probing": 0.0, "synthesis": 0.0, "distillation": 0.0}

    @classmethod
    def from_config(cls, config: FedReviveConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "FedRevive":
        """Built-in app: the zoo model, the dataset's classes and shape; ``proportions="true"`` reads the
        clients' label histograms (simulation only)."""
        if resources is None:
            raise ConfigError(f"{cls.__name__} needs the built-in app's model and training split (resources)")
        true_proportions = None
        if config.proportions == "true":
            if resources.label_histogram is None:
                raise ConfigError("FedRevive with true label proportions needs the clients' label histograms "
                                 "(simulation only)")
            true_proportions = resources.label_histogram
        return cls(resources.make_model, resources.num_classes, resources.input_shape, seed=resources.seed,
                   true_proportions=true_proportions, **config.keywords(), **flower_options)

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        super().on_start(num_clients, concurrency)
        self.num_clients = num_clients

    @property
    def teacher_slots(self) -> list[tuple[int, int]]:
        """The teacher buffer as ``(client, index into the teacher networks)``, oldest first."""
        return [(client, next(i for i, n in enumerate(self._teacher_nets) if n is net)) for client, net in self._buffer]

    @teacher_slots.setter
    def teacher_slots(self, slots: list[tuple[int, int]]) -> None:
        self._buffer = deque((int(client), self._teacher_nets[int(index)]) for client, index in slots)

    # ------------------------------------------------------------------ parts
    def _proportions(self, client: int) -> np.ndarray:
        if self.true_proportions is not None:
            histogram = np.asarray(self.true_proportions(client, self.num_clients), dtype=np.float64)
            return histogram / max(histogram.sum(), 1.0)
        return self.proxies.proportions(client)

    def _buffer_teacher(self, client: int, weights: np.ndarray) -> None:
        if len(self._buffer) == self.config.teacher_buffer_size:
            self._buffer.popleft()
        net = self._teacher_nets[self._next_slot]
        self._next_slot = (self._next_slot + 1) % self.config.teacher_buffer_size
        self._buffer.append((client, load_flat(net, weights).eval()))

    def _weights(self) -> torch.Tensor:
        weights = teacher_class_weights([self._proportions(c) for c, _ in self._buffer])
        return torch.from_numpy(weights).float().to(self.device)

    @property
    def server_lr(self) -> float:
        """``eta_s`` in use now: the configured one, or AFL-DW's paced step
        (:attr:`asyncfl.strategies.afl_dw.AFLDW.server_lr`)."""
        return self._paced_lr(self.config.server_lr)

    def beta(self, staleness: int) -> float:
        """``beta(tau)``; DD-FedRevive uses the constant 0.5."""
        if self.data_driven:
            return 0.5
        return beta_schedule(self.config.beta, staleness, staleness_cutoff(self.config.max_staleness, self.concurrency),
                             self.config.beta_constant)

    def distil(self, current: np.ndarray) -> np.ndarray:
        """``K_KD`` Adam steps of a student (from ``current``) towards all buffered teachers; returns ``Delta_KD``."""
        load_flat(self.student, current).eval()
        optimizer = torch.optim.Adam(self.student.parameters(), lr=self.config.kd_lr)
        teachers = [net for _, net in self._buffer]
        proportions = [self._proportions(c) for c, _ in self._buffer]
        # Every step's minibatches drawn up front, in the order the steps would draw them.
        steps = [[self.pool.sample(p, self.config.kd_batch_size, self._np_rng) for p in proportions]
                 for _ in range(self.config.kd_steps)]

        def teacher_passes(batches: list[torch.Tensor]) -> list[torch.Tensor]:
            with torch.no_grad():
                return [t(b) for t, b in zip(teachers, batches)]

        ahead: list[Future] = [] if self._teacher_thread is None else \
            [self._teacher_thread.submit(teacher_passes, batches) for batches in steps]
        try:
            for step, batches in enumerate(steps):
                teacher_logits = ahead[step].result() if ahead else teacher_passes(batches)
                # One student pass per teacher minibatch, computed exactly as the teacher's: a teacher equal to
                # the student then gives exactly zero gradient. (One batched pass differs in the last float
                # bits, and Adam scales such noise up to lr-sized steps.)
                student_logits = [self.student(b) for b in batches]
                loss = multi_teacher_kd_surrogate(student_logits, teacher_logits, self.config.temperature)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        finally:  # the teachers are reloaded by later arrivals: no pass may outlive this update
            for future in ahead:
                future.cancel()
            wait(ahead)
        return model_to_flat(self.student) - current

    # ---------------------------------------------------------------- arrival
    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        self._observe_response(arrival)
        started = time.perf_counter()
        if self.true_proportions is None:
            self.proxies.observe(arrival.client_index, load_flat(self.probe_net, arrival.weights))
        self._buffer_teacher(arrival.client_index, arrival.weights)
        self.seconds["probing"] += time.perf_counter() - started
        cfg = self.config
        if not self.data_driven and self.updates >= cfg.synthesis_start and self.updates % cfg.synthesis_every == 0:
            started = time.perf_counter()
            load_flat(self.student, current)
            batch, labels, loss = synthesize(self.generator, [n for _, n in self._buffer], self.student,
                                             self._weights(), self.num_classes, cfg.synthesis, self._torch_rng)
            self.pool.add(batch, labels)
            self.synthesis_rounds += 1
            self.last_synthesis_loss = loss
            self.seconds["synthesis"] += time.perf_counter() - started
        beta = self.beta(arrival.staleness)
        self.mixing.observe_beta(beta)
        with_kd = self.updates >= cfg.kd_start and len(self.pool) > 0 and beta > 0.0
        self.updates += 1
        if not with_kd:
            if cfg.warmup == "raw" and self.updates <= cfg.synthesis_start:
                self.raw_updates += 1
                return afl_dw_step(current, arrival.delta, self.server_lr, 0.0)
            # No KD half: bitwise AFL-DW's step, so FedRevive and AFL-DW runs of one seed part only where KD acts.
            return afl_dw_step(current, arrival.delta, self.server_lr, beta)
        started = time.perf_counter()
        delta_kd = self.distil(current)
        step = np.float32(1.0 - beta) * arrival.delta + np.float32(beta) * delta_kd
        self.mixing.observe_kd(beta, arrival.delta, delta_kd)
        self.kd_updates += 1
        self.seconds["distillation"] += time.perf_counter() - started
        return current + np.float32(self.server_lr) * step

    def summary(self) -> dict[str, float | int | str]:
        return {
            "variant": "dd-fedrevive" if self.data_driven else "fedrevive",
            "server-device": self.config.server_device,
            "server-lr": round(self.server_lr, 6),
            "kd-updates": self.kd_updates,
            "raw-warmup-updates": self.raw_updates,
            "synthesis-rounds": self.synthesis_rounds,
            "kd-pool-size": len(self.pool),
            "last-synthesis-loss": round(self.last_synthesis_loss, 4),
            "teacher-proportions": "true (ablation)" if self.true_proportions is not None else "probing proxy",
            **self.mixing.summary(),
            **self._pace_summary(),
            # Wall milliseconds per arrival (all arrivals, warm-up included), and per synthesis round / KD update.
            **{f"{phase}-ms-per-arrival": round(1000.0 * seconds / max(self.updates, 1), 2)
               for phase, seconds in self.seconds.items()},
            "ms-per-synthesis-round": round(1000.0 * self.seconds["synthesis"] / max(self.synthesis_rounds, 1), 1),
            "ms-per-kd-update": round(1000.0 * self.seconds["distillation"] / max(self.kd_updates, 1), 1),
        }


class DDFedRevive(FedRevive):
    """DD-FedRevive: the FedRevive paper's data-driven upper bound.

    As :class:`FedRevive`, but the KD pool is real labeled server data instead of
    synthesised samples, the teachers are weighted by the clients' true label
    proportions instead of the noise-probe proxies, and ``beta`` is the constant 0.5
    (the paper's setting for this upper bound); the synthesis knobs are unused.

    Parameters
    ----------
    model_fn, num_classes, input_shape, seed
        As for :class:`FedRevive`.
    server_data : (x, y) or Dataset
        The server's labeled distillation data.
    label_proportions : callable
        ``(client index, number of clients) -> label histogram``; client indices are the
        nodes' partition ids when their ClientApps answer the identity query.
    **options
        FedRevive's knobs (:class:`FedReviveConfig`) and Flower's ``FedAvg`` options.
    """

    run_config_name = "dd-fedrevive"
    config_class = DDFedReviveConfig

    def __init__(self, model_fn: Callable[[], nn.Module], num_classes: int, input_shape: tuple[int, int, int],
                 server_data: Any, label_proportions: Callable[[int, int], np.ndarray], seed: int = 0,
                 **options: Any) -> None:
        x, y = labeled_arrays(server_data, "DDFedRevive", "server_data")
        if not callable(label_proportions):
            raise ConfigError("DDFedRevive needs label_proportions: a callable (client index, number of clients) -> "
                             f"label histogram, got {type(label_proportions).__name__}")
        super().__init__(model_fn, num_classes, input_shape, seed=seed, true_proportions=label_proportions, **options)
        self.data_driven = True
        self.pool = KDPool(len(y), self.device)
        self.pool.add(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                      torch.from_numpy(np.asarray(y, dtype=np.int64)))

    @classmethod
    def from_config(cls, config: FedReviveConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "DDFedRevive":
        """Built-in app: the pool is the server's hold-out rows; teachers weighted by the true histograms."""
        if resources is None or resources.label_histogram is None:
            raise ConfigError("DDFedRevive needs the built-in app's training split and the clients' label "
                             "histograms (simulation only)")
        rows = holdout_rows(resources.y_train, resources.server_holdout, resources.seed)
        return cls(resources.make_model, resources.num_classes, resources.input_shape,
                   (resources.x_train[rows], resources.y_train[rows]), resources.label_histogram,
                   seed=resources.seed, **config.keywords(), **flower_options)
