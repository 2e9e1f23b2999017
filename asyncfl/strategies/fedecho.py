"""FedEcho: uncertainty-aware server distillation from every client's latest logits.

Wang, Ma and Chen, "Stragglers Can Contribute More: Uncertainty-Aware
Distillation for Asynchronous Federated Learning", Algorithm 1. On an arrival
from client ``i`` the server rebuilds ``x^i = x_{t-tau} + Delta^i``, runs it on
the unlabeled set ``U`` and keeps its logits ``y^i`` (replacing the client's
previous ones); ``Delta`` accumulates. After ``M`` arrivals
``x_hat = x + eta * Delta / M``, then ``Q`` distillation steps on minibatches
``B`` of ``U`` against the mean of all stored client logits ``y_t``:

``x_hat <- x_hat - eta_d * Clip(grad f_d, nu)`` with
``f_d = alpha * KL(softmax(y_t) || softmax(y_hat)) + (1 - alpha) * CE(y_hat, argmax y_t)``

and ``alpha = H_hat * alpha_max + (1 - H_hat) * alpha_min``, ``H_hat`` the
teacher's mean predictive entropy over ``B`` divided by ``log C`` (Eq. 3-4).
``alpha_min = alpha_max`` gives the fixed-alpha ablations (their Table 7).

The paper names Adam for ``eta_d`` without saying whether its moments survive
across rounds; here they do (one optimizer over the global model for the whole
run). The student runs in eval mode, so BatchNorm statistics stay those the
clients computed on their own data rather than drifting to ``U``'s.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from asyncfl.data.unlabeled import DISTILL_SETS, distill_set_problem, distillation_inputs, distillation_labels
from asyncfl.errors import ConfigError
from asyncfl.models.device import SERVER_DEVICES, device_problem, torch_device
from asyncfl.models.flat import load_flat, model_to_flat
from asyncfl.models.inference import chunked_forward
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.fedbuff import fedbuff_step
from asyncfl.strategies.pace import PACES
from asyncfl.strategies.resources import StrategyResources
from asyncfl.strategies.settings import StrategyConfig, knob
from asyncfl.strategies.user_inputs import checked_model_fn, input_array


def normalised_batch_entropy(teacher_logits: torch.Tensor) -> torch.Tensor:
    """``H_hat = mean_u H(softmax(y^u)) / log C`` (FedEcho Eq. 4), in [0, 1]."""
    log_p = F.log_softmax(teacher_logits, dim=1)
    entropy = -(log_p.exp() * log_p).sum(dim=1)
    return entropy.mean() / math.log(teacher_logits.shape[1])


def uncertainty_weight(teacher_logits: torch.Tensor, alpha_min: float, alpha_max: float) -> float:
    """``alpha = H_hat * alpha_max + (1 - H_hat) * alpha_min``."""
    h_hat = float(normalised_batch_entropy(teacher_logits))
    return h_hat * alpha_max + (1.0 - h_hat) * alpha_min


def fedecho_distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                              alpha: float) -> torch.Tensor:
    """``alpha * KL(softmax(y_t) || softmax(y_hat)) + (1 - alpha) * CE(y_hat, argmax y_t)`` (Eq. 3), batch mean."""
    kl = F.kl_div(F.log_softmax(student_logits, dim=1), F.log_softmax(teacher_logits, dim=1),
                  reduction="batchmean", log_target=True)
    ce = F.cross_entropy(student_logits, teacher_logits.argmax(dim=1))
    return alpha * kl + (1.0 - alpha) * ce


class ClientLogitBank:
    """The latest logits of every client on ``U``, stored as float16, with a float64 running sum.

    Memory is ``clients x |U| x classes x 2`` bytes (:attr:`nbytes`). A client's logits beyond float16's
    range (a model whose local training diverged) are kept as float32 instead, so the teacher is the
    mean of the logits as computed (the paper's arithmetic) rather than of infinities; non-finite logits
    are refused and the client's previous ones stay. Both are counted (:attr:`wide`, :attr:`refused`).
    """

    state_attributes = ("_logits", "_sum", "wide", "refused")
    FLOAT16_MAX = float(np.finfo(np.float16).max)

    def __init__(self) -> None:
        self._logits: dict[int, np.ndarray] = {}
        self._sum: np.ndarray | None = None
        self.wide = 0  # logits stored as float32: beyond float16's range
        self.refused = 0  # non-finite logits not stored

    def __len__(self) -> int:
        return len(self._logits)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self._logits.values())

    def store(self, client: int, logits: np.ndarray) -> bool:
        """Replace ``client``'s logits; False (the bank unchanged) when they are not all finite."""
        if not np.isfinite(logits).all():
            self.refused += 1
            return False
        if np.abs(logits).max(initial=0.0) > self.FLOAT16_MAX:
            compact = logits.astype(np.float32)
            self.wide += 1
        else:
            compact = logits.astype(np.float16)
        if self._sum is None:
            self._sum = np.zeros(compact.shape, dtype=np.float64)
        previous = self._logits.get(client)
        if previous is not None:
            self._sum -= previous
        self._sum += compact
        self._logits[client] = compact
        return True

    def mean(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Average stored logits over all clients that have reported (the teacher ``y_t``)."""
        if self._sum is None:
            raise ValueError("no client logits stored yet")
        return (self._sum[rows] / len(self._logits)).astype(np.float32)


@dataclass(frozen=True)
class FedEchoConfig(StrategyConfig):
    """FedEcho's knobs (run-config ``fedecho.*``).

    Parameters
    ----------
    buffer_size : int
        ``M``, arrivals per global update; 0 (default) = ``K // 4`` within ``[2, 10]`` for ``K`` jobs in
        flight, as FedBuff's (:func:`asyncfl.strategies.pace.auto_buffer_size`), at the price of a
        distillation every ``M`` updates (every 2 at ``K = 8``; the paper's ``M = 5`` is a keyword).
    server_lr : float
        ``eta``; 0 (default) = ``min(1, M * g(K, M))``, the stable pace
        (:mod:`asyncfl.strategies.pace`), scaled by the measured response (``pace``). The paper's
        setting is ``server_lr=1.0``.
    distill_steps : int
        ``Q``; 0 turns FedEcho into FedBuff that still records logits.
    distill_batch_size, distill_lr, clip : int, float, float
        ``|B|``, ``eta_d`` (Adam) and ``nu`` (gradient-norm clip). ``eta_d`` defaults to the paper's 3e-6
        (its App. B). Adam moves every weight by about ``eta_d`` per step whatever the clients' update
        size, so a larger ``eta_d`` outweighs small client steps (1e-4, our former default, undid them
        at SGD lr 0.01: measured in the drop-in study: docs/methods.md, "Default server steps").
    distill_move : float
        0 (default): ``eta_d`` stays ``distill_lr``, as in the paper. Above 0 (ours): ``eta_d`` is set
        again after every distillation so that the next one changes the model by about this fraction
        of the buffered step it follows (parameter norms; the summary's ``distill-move-ratio``),
        starting from ``distill_lr`` and changing at most 4x per aggregation. A fixed ``eta_d`` that
        helps at one client step size outweighs smaller client steps and leaves larger ones
        untouched; a fraction of the step carries over.
    alpha_min, alpha_max : float
        Range of the uncertainty weight (equal values: a fixed ``alpha``).
    overlap_logits : bool
        Compute each arriving model's logits on ``U`` on a background thread, so the server
        answers the arrivals between aggregations without waiting for that pass (ours; the
        logits are waited for before each distillation, stored in arrival order: the same bits).
    distill_set, distill_size : str, int
        Built-in app only: which unlabeled set ``U`` is (``digits``, ``mnist5k`` for Fashion-MNIST
        clients, ``cifar10``, ``cifar100`` or the server's ``holdout`` rows) and how many of its inputs. A library user passes ``distill_inputs``.
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows: the clients' measured response (default) or the bound for any
        client, as for FedBuff (:class:`asyncfl.strategies.fedbuff.FedBuffConfig`).
    server_device : {"cpu", "cuda"}
        Where the server's networks run (each arrival's logit pass over ``U``, the distillation).
        ``"cuda"`` needs a GPU that torch sees; ours (the paper does not say where its server runs).
    """

    label: ClassVar[str] = "FedEcho"
    prefix: ClassVar[str] = "fedecho"

    buffer_size: int = knob(0, minimum=0)
    server_lr: float = knob(0.0, minimum=0)
    distill_steps: int = knob(10, minimum=0)
    distill_batch_size: int = knob(64, minimum=1)
    distill_lr: float = knob(3e-6, above=0)
    distill_move: float = knob(0.0, minimum=0)
    alpha_min: float = knob(0.2, minimum=0, maximum=1)
    alpha_max: float = knob(0.8, minimum=0, maximum=1)
    clip: float = knob(5.0, above=0)
    overlap_logits: bool = knob(True)
    distill_set: str = knob("digits", choices=DISTILL_SETS, builtin=True)
    distill_size: int = knob(1000, minimum=1, builtin=True)
    pace: str = knob("measured", choices=PACES)
    server_device: str = knob("cpu", choices=SERVER_DEVICES)

    def check(self) -> None:
        problem = device_problem(self.server_device)
        if problem:
            self.fail("server_device", problem)
        if self.distill_move > 0 and self.distill_steps == 0:
            self.fail("distill_move", "sets the distillation's step, and distill_steps = 0 turns the distillation "
                      "off: give distill_steps > 0 or leave distill_move at 0")
        if self.alpha_min > self.alpha_max:
            self.fail("alpha_min", f"must be <= alpha_max ({self.alpha_max}); equal values give a fixed alpha")

    def check_run_config(self, run_config: Mapping[str, Any]) -> None:
        problem = distill_set_problem(self.distill_set, str(run_config["dataset"]),
                                      float(run_config["server-holdout"]))
        if problem:
            self.fail("distill_set", problem)


class FedEcho(Strategy):
    """FedEcho (Algorithm 1): buffered aggregation, then uncertainty-aware distillation.

    Parameters
    ----------
    model_fn : callable
        Builds a fresh network of the global model's architecture (your ``Net``).
    distill_inputs : array, tensor or Dataset
        The unlabeled distillation inputs ``U``, shaped like the clients' inputs (labels, if any,
        are ignored).
    buffer_size, server_lr, distill_steps, distill_batch_size, distill_lr, distill_move, alpha_min, alpha_max, clip,
    overlap_logits, server_device
        See :class:`FedEchoConfig`.
    pace : {"measured", "stable"}
        What ``server_lr=0`` follows (:class:`FedEchoConfig`).
    seed : int
        Seeds the distillation minibatches.
    distill_labels : array, optional
        The task's labels of ``U`` where ``U`` is the task's own data: only to measure, at each
        aggregation, whether the stored-logit ensemble classifies ``U`` better than the global model
        it distils into (the summary's ``teacher-*`` figures); the method never reads them.
    """

    run_config_name = "fedecho"
    config_class = FedEchoConfig
    # the student is loaded from the candidate model at every distillation; its Adam moments carry over
    state_attributes = ("bank", "optimizer", "_generator", "_sum", "_count", "aggregations", "_alpha_sum",
                        "_alpha_count", "response_meter", "_teacher_figures")

    def __init__(self, model_fn: Callable[[], nn.Module], distill_inputs: Any, buffer_size: int = 0,
                 server_lr: float = 0.0, distill_steps: int = 10, distill_batch_size: int = 64,
                 distill_lr: float = 3e-6, distill_move: float = 0.0, alpha_min: float = 0.2, alpha_max: float = 0.8,
                 clip: float = 5.0, overlap_logits: bool = True, pace: str = "measured", server_device: str = "cpu",
                 seed: int = 0,
                 distill_labels: Any = None, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedEchoConfig.from_arguments(locals())
        self._measure_response(pace, server_lr)
        model_fn = checked_model_fn(model_fn, "FedEcho")
        unlabeled = input_array(distill_inputs, "FedEcho", "distill_inputs")
        self.device = torch_device(server_device)
        self.unlabeled = torch.from_numpy(unlabeled).to(self.device)
        self.client_net, self.student = model_fn().to(self.device).eval(), model_fn().to(self.device).eval()
        self.optimizer = torch.optim.Adam(self.student.parameters(), lr=distill_lr, betas=(0.9, 0.999), eps=1e-8)
        self.distill_source = "user inputs"
        self.bank = ClientLogitBank()
        self._logit_thread = ThreadPoolExecutor(1, thread_name_prefix="fedecho-logits") if overlap_logits else None
        self._logit_jobs: list[Future] = []
        self._generator = torch.Generator().manual_seed(seed)
        self._sum: np.ndarray | None = None
        self._count = 0
        self.aggregations = 0
        self._alpha_sum, self._alpha_count = 0.0, 0  # for the summary's mean alpha
        self.distill_labels = None if distill_labels is None else torch.as_tensor(np.asarray(distill_labels),
                                                                                   dtype=torch.int64)
        if self.distill_labels is not None and len(self.distill_labels) != len(self.unlabeled):
            raise ConfigError(f"FedEcho: distill_labels has {len(self.distill_labels)} labels for "
                             f"{len(self.unlabeled)} distill_inputs")
        # sums over aggregations: is the stored-logit ensemble (the teacher) better than the model it teaches?
        self._teacher_figures = {"aggregations": 0.0, "agreement": 0.0, "ensemble-correct": 0.0,
                                 "global-correct": 0.0, "ensemble-better": 0.0}

    @classmethod
    def from_config(cls, config: FedEchoConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "FedEcho":
        """Built-in app: ``U`` is ``distill_size`` inputs of ``distill_set`` (labels dropped)."""
        if resources is None:
            raise ConfigError("FedEcho needs the built-in app's model and training split (resources)")
        unlabeled = distillation_inputs(config.distill_set, resources.x_train, resources.y_train,
                                        config.distill_size, resources.seed, data_dir=resources.data_dir,
                                        holdout_fraction=resources.server_holdout)
        labels = distillation_labels(config.distill_set, resources.y_train, config.distill_size, resources.seed,
                                     holdout_fraction=resources.server_holdout)
        strategy = cls(resources.make_model, unlabeled, seed=resources.seed, distill_labels=labels,
                       **config.keywords(), **flower_options)
        strategy.distill_source = config.distill_set
        return strategy

    def client_logits(self, weights: np.ndarray) -> np.ndarray:
        """Logits of the client model ``weights`` on all of ``U`` (in cache-sized chunks: the same bits, faster)."""
        return chunked_forward(load_flat(self.client_net, weights).eval(), self.unlabeled).cpu().numpy()

    def distill(self, model: np.ndarray) -> np.ndarray:
        """``Q`` clipped Adam steps of the global model towards the averaged client logits."""
        cfg = self.config
        load_flat(self.student, model).eval()
        for _ in range(cfg.distill_steps):
            rows = torch.randint(len(self.unlabeled), (min(cfg.distill_batch_size, len(self.unlabeled)),),
                                 generator=self._generator)
            teacher = torch.from_numpy(self.bank.mean(rows.numpy())).to(self.device)
            alpha = uncertainty_weight(teacher, cfg.alpha_min, cfg.alpha_max)
            self._alpha_sum += alpha
            self._alpha_count += 1
            loss = fedecho_distillation_loss(self.student(self.unlabeled[rows.to(self.device)]), teacher, alpha)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), cfg.clip)
            self.optimizer.step()
        return model_to_flat(self.student)

    def record_logits(self, client: int, weights: np.ndarray) -> None:
        """Replace ``client``'s logits in the bank with those of ``weights``."""
        self.bank.store(client, self.client_logits(weights))

    def wait_for_logits(self) -> None:
        """Block until every arrival so far is in the bank (re-raising a failure of the background pass)."""
        jobs, self._logit_jobs = self._logit_jobs, []
        for job in jobs:
            job.result()

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        if self._logit_thread is None:
            self.record_logits(arrival.client_index, arrival.weights)
        else:  # one worker thread: the bank is filled in arrival order
            self._logit_jobs.append(self._logit_thread.submit(self.record_logits, arrival.client_index, arrival.weights))
        self._observe_response(arrival)
        if self._sum is None:
            self._sum = np.zeros_like(arrival.delta)
        self._sum += arrival.delta
        self._count += 1
        cfg = self.config
        buffer_size = self.buffer_size
        if self._count < buffer_size:
            return None
        candidate = fedbuff_step(current, self._sum, buffer_size, self._paced_lr(cfg.server_lr, buffer_size))
        self._sum[:] = 0.0
        self._count = 0
        self.aggregations += 1
        self.wait_for_logits()
        self._compare_teacher(candidate)
        if not cfg.distill_steps:
            return candidate
        distilled = self.distill(candidate)
        self._measure_move(current, candidate, distilled)
        return distilled

    def _measure_move(self, current: np.ndarray, candidate: np.ndarray, distilled: np.ndarray) -> None:
        """How far the distillation moved the model, against the buffered step it follows (parameter norms):
        the quantity that decides whether the teacher's lead can reach the model at all; with
        ``distill_move`` the next distillation's ``eta_d`` is scaled towards that fraction (Adam's change
        grows about in proportion to its learning rate)."""
        step = float(np.linalg.norm(candidate - current))
        if step <= 0.0:
            return
        ratio = float(np.linalg.norm(distilled - candidate)) / step
        figures = self._teacher_figures  # .get: checkpoints from before this figure lack its keys
        figures["distilled"] = figures.get("distilled", 0.0) + 1.0
        figures["move-ratio"] = figures.get("move-ratio", 0.0) + ratio
        target = self.config.distill_move
        if target > 0 and ratio > 0:
            group = self.optimizer.param_groups[0]
            group["lr"] *= min(4.0, max(0.25, target / ratio))

    def _compare_teacher(self, candidate: np.ndarray) -> None:
        """Score the teacher (the stored-logit ensemble) against the model it is about to teach, on all of ``U``:
        their argmax agreement, and, where ``U`` has the task's labels, each one's accuracy."""
        ensemble = torch.from_numpy(self.bank.mean()).argmax(dim=1)
        own = chunked_forward(load_flat(self.client_net, candidate).eval(), self.unlabeled).argmax(dim=1).cpu()
        figures = self._teacher_figures
        figures["aggregations"] += 1.0
        figures["agreement"] += float((ensemble == own).float().mean())
        if self.distill_labels is not None:
            ensemble_accuracy = float((ensemble == self.distill_labels).float().mean())
            global_accuracy = float((own == self.distill_labels).float().mean())
            figures["ensemble-correct"] += ensemble_accuracy
            figures["global-correct"] += global_accuracy
            figures["ensemble-better"] += float(ensemble_accuracy > global_accuracy)

    def _settle(self) -> None:
        self.wait_for_logits()

    def summary(self) -> dict[str, float | int | str]:
        self.wait_for_logits()
        return {
            "aggregations": self.aggregations,
            "buffer-size": self.buffer_size,
            "distill-set": self.distill_source,
            "distill-samples": int(len(self.unlabeled)),
            "server-device": self.config.server_device,
            "logit-clients": len(self.bank),
            "logits-mb": round(self.bank.nbytes / 2**20, 3),
            "logits-beyond-float16": self.bank.wide,
            "logits-non-finite": self.bank.refused,
            "mean-alpha": round(self._alpha_sum / self._alpha_count, 4) if self._alpha_count else float("nan"),
            "distill-lr": float(f"{self.optimizer.param_groups[0]['lr']:.4g}"),
            "server-lr": round(self._paced_lr(self.config.server_lr, self.buffer_size), 6),
            **self._pace_summary(),
            **self._teacher_summary(),
        }

    def _teacher_summary(self) -> dict[str, float]:
        """Means over aggregations: ``teacher-agreement`` (the ensemble's and the new global model's argmax on
        ``U``); with labeled ``U`` also each one's accuracy and the share of aggregations where the
        ensemble was the better (what the distillation relies on); with distillation,
        ``distill-move-ratio``: the norm of the distillation's change to the model over the norm of the
        buffered step before it."""
        figures = self._teacher_figures
        count = figures["aggregations"]
        if not count:
            return {}
        out = {"teacher-agreement": round(figures["agreement"] / count, 4)}
        if figures.get("distilled"):
            out["distill-move-ratio"] = round(figures["move-ratio"] / figures["distilled"], 5)
        if self.distill_labels is not None:
            out.update({"teacher-accuracy-on-u": round(figures["ensemble-correct"] / count, 4),
                        "global-accuracy-on-u": round(figures["global-correct"] / count, 4),
                        "teacher-better-share": round(figures["ensemble-better"] / count, 4)})
        return out
