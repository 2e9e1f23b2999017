"""FedADT: the newest global model distils into stale client models before mixing.

FedADT paper, Algorithm 2 and Sec. IV. On an arrival with staleness ``tau > 1``
the current global model (teacher, logits ``z_S``) corrects the client model
(student, logits ``z_C``) by one pass of knowledge distillation over a small
labeled server set (0.5% of the training data in the paper):

``L = a(t) * s * KL(softmax(z_S / T) || softmax(z_C / T)) + (1 - a(t)) * CE(z_C, y)``

with ``T = 3``, ``s = 1`` as Eq. 7 is printed (``kl_scale="none"``) or ``s = T^2``
(``kl_scale="t-squared"``, Hinton et al.'s factor that keeps the soft targets' gradient
as large as the hard targets' whatever ``T``; the paper's code is not public), and the
adaptive weight
``a(t) = a_min + (a_max - a_min) * min(1, t / T_g)`` (0.2, 0.6, ``T_g = 1000``: ``ramp_arrivals``;
``t`` is the global timestamp, i.e. the number of arrivals). Then
``w <- (1 - beta) w + beta w_i`` with ``beta = 1 / sqrt(tau + 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from asyncfl.errors import ConfigError
from asyncfl.models.flat import load_flat, model_to_flat
from asyncfl.data.holdout import stratified_rows
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.resources import StrategyResources
from asyncfl.strategies.settings import StrategyConfig, knob
from asyncfl.strategies.user_inputs import checked_model_fn, labeled_arrays


def adaptive_kd_weight(t: int, alpha_min: float, alpha_max: float, t_g: int) -> float:
    """``a(t) = a_min + (a_max - a_min) * min(1, t / T_g)`` (FedADT, Sec. IV-B)."""
    return alpha_min + (alpha_max - alpha_min) * min(1.0, t / t_g)


def fedadt_beta(tau: int) -> float:
    """``beta = 1 / sqrt(tau + 1)``."""
    return 1.0 / math.sqrt(tau + 1.0)


KL_SCALES = ("none", "t-squared")


def fedadt_kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                   alpha: float, temperature: float, kl_scale: str = "none") -> torch.Tensor:
    """``alpha * s * KL(softmax(z_S/T) || softmax(z_C/T)) + (1 - alpha) * CE(z_C, y)``, batch mean.

    ``s`` is 1 for ``kl_scale="none"`` (Eq. 7 as printed) and ``T^2`` for ``"t-squared"``.
    """
    kl = F.kl_div(F.log_softmax(student_logits / temperature, dim=1), F.softmax(teacher_logits / temperature, dim=1),
                  reduction="batchmean")
    scale = temperature**2 if kl_scale == "t-squared" else 1.0
    return alpha * scale * kl + (1.0 - alpha) * F.cross_entropy(student_logits, labels)


@dataclass(frozen=True)
class FedADTConfig(StrategyConfig):
    """FedADT's knobs (run-config ``fedadt.*``).

    Parameters
    ----------
    temperature : float
        ``T`` of the distillation softmax.
    kl_scale : {"none", "t-squared"}
        Factor on the KL term: 1 as Eq. 7 is printed, or ``T^2`` (Hinton et al.), which
        keeps the teacher's gradient comparable to the labels' at ``T = 3``.
    alpha_min, alpha_max : float
        Range of the adaptive KD weight ``a(t)``.
    ramp_arrivals : int
        ``T_g``: arrivals over which ``a(t)`` rises from ``alpha_min`` to ``alpha_max``.
    kd_lr, kd_batch_size : float, int
        SGD learning rate and batch size of the one KD pass over the server set.
    server_fraction : float
        Built-in app only: the class-stratified share of the training split the server keeps
        (0.5 % in the paper). A library user passes ``server_data`` instead.
    """

    label: ClassVar[str] = "FedADT"
    prefix: ClassVar[str] = "fedadt"

    temperature: float = knob(3.0, above=0)
    kl_scale: str = knob("none", choices=KL_SCALES)
    alpha_min: float = knob(0.2, minimum=0, maximum=1)
    alpha_max: float = knob(0.6, minimum=0, maximum=1)
    ramp_arrivals: int = knob(1000, minimum=1)
    kd_lr: float = knob(0.01, above=0)
    kd_batch_size: int = knob(32, minimum=1)
    server_fraction: float = knob(0.005, above=0, below=1, builtin=True)

    def check(self) -> None:
        if self.alpha_min > self.alpha_max:
            self.fail("alpha_min", f"must be <= alpha_max ({self.alpha_max})")


def server_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The built-in app's FedADT server set: a seeded, class-stratified ``fraction`` of the training rows."""
    return stratified_rows(labels, fraction, seed, salt=5)


@dataclass(frozen=True)
class ServerSet:
    """A small labeled set held by the server (FedADT's distillation data)."""

    x: np.ndarray
    y: np.ndarray


class FedADT(Strategy):
    """FedADT: KD version correction of stale client models, then staleness-weighted mixing.

    Parameters
    ----------
    model_fn : callable
        Builds a fresh network of the global model's architecture (your ``Net``).
    server_data : ServerSet, (x, y) or Dataset
        Labeled distillation data on the server (0.5 % of the training data in the paper).
    temperature, kl_scale, alpha_min, alpha_max, ramp_arrivals, kd_lr, kd_batch_size
        See :class:`FedADTConfig`.
    seed : int
        Seeds the order of the server set in each KD pass.
    """

    run_config_name = "fedadt"
    config_class = FedADTConfig
    # the teacher and student are loaded afresh for every correction: only the order stream and counters persist
    state_attributes = ("_generator", "timestamp", "corrected", "_figures")

    def __init__(self, model_fn: Callable[[], nn.Module], server_data: Any, temperature: float = 3.0,
                 kl_scale: str = "none", alpha_min: float = 0.2, alpha_max: float = 0.6, ramp_arrivals: int = 1000,
                 kd_lr: float = 0.01, kd_batch_size: int = 32, seed: int = 0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedADTConfig.from_arguments(locals())
        model_fn = checked_model_fn(model_fn, "FedADT")
        if isinstance(server_data, ServerSet):
            server_data = (server_data.x, server_data.y)
        if isinstance(server_data, (tuple, list)) and len(server_data) == 2 and len(server_data[1]) == 0:
            raise ConfigError("FedADT needs a non-empty server set (fedadt.server-fraction too small?)")
        server_set = ServerSet(*labeled_arrays(server_data, "FedADT", "server_data"))
        self.teacher, self.student = model_fn(), model_fn()
        self.server_set = server_set
        self._x = torch.from_numpy(server_set.x)
        self._y = torch.from_numpy(server_set.y)
        self._generator = torch.Generator().manual_seed(seed)
        self.timestamp = 0
        self.corrected = 0
        # sums over every KD batch: the teacher's and the (stale) student's accuracy on the server set, and the
        # KL term's share of the pull on the student's logits (what the correction's two terms weigh, measured)
        self._figures = {"batches": 0.0, "teacher-correct": 0.0, "student-correct": 0.0, "examples": 0.0,
                         "kl-share": 0.0}

    @classmethod
    def from_config(cls, config: FedADTConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "FedADT":
        """Built-in app: the server set is a class-stratified ``server_fraction`` of the training split."""
        if resources is None:
            raise ConfigError("FedADT needs the built-in app's model and training split (resources)")
        rows = server_rows(resources.y_train, config.server_fraction, resources.seed)
        return cls(resources.make_model, ServerSet(resources.x_train[rows], resources.y_train[rows]),
                   seed=resources.seed, **config.keywords(), **flower_options)

    def correct(self, client: np.ndarray, global_model: np.ndarray) -> np.ndarray:
        """One KD pass over the server set: the global model teaches the client model."""
        cfg = self.config
        load_flat(self.teacher, global_model).eval()
        load_flat(self.student, client).train()
        alpha = adaptive_kd_weight(self.timestamp, cfg.alpha_min, cfg.alpha_max, cfg.ramp_arrivals)
        optimizer = torch.optim.SGD(self.student.parameters(), lr=cfg.kd_lr)
        order = torch.randperm(len(self._y), generator=self._generator)
        for start in range(0, len(order), cfg.kd_batch_size):
            index = order[start : start + cfg.kd_batch_size]
            with torch.no_grad():
                teacher_logits = self.teacher(self._x[index])
            student_logits = self.student(self._x[index])
            self._record(student_logits.detach(), teacher_logits, self._y[index], alpha)
            loss = fedadt_kd_loss(student_logits, teacher_logits, self._y[index], alpha, cfg.temperature, cfg.kl_scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return model_to_flat(self.student)

    def _record(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                alpha: float) -> None:
        """Add one batch to the mechanism's figures.

        Each term's pull is the norm of its gradient with respect to the student's logits (closed
        form: ``(1 - a) (softmax(z_C) - onehot)`` for the labels, ``a s (softmax(z_C / T) -
        softmax(z_S / T)) / T`` for the teacher), so the share costs no extra backward pass.
        """
        cfg = self.config
        scale = cfg.temperature**2 if cfg.kl_scale == "t-squared" else 1.0
        hard = F.softmax(student_logits, dim=1) - F.one_hot(labels, student_logits.shape[1]).to(student_logits.dtype)
        soft = F.softmax(student_logits / cfg.temperature, dim=1) - F.softmax(teacher_logits / cfg.temperature, dim=1)
        pull_labels = (1.0 - alpha) * float(hard.norm())
        pull_teacher = alpha * scale / cfg.temperature * float(soft.norm())
        figures = self._figures
        figures["batches"] += 1.0
        figures["kl-share"] += pull_teacher / (pull_teacher + pull_labels) if pull_teacher + pull_labels > 0 else 0.0
        figures["examples"] += float(len(labels))
        figures["teacher-correct"] += float((teacher_logits.argmax(1) == labels).sum())
        figures["student-correct"] += float((student_logits.argmax(1) == labels).sum())

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        client = arrival.weights
        if arrival.staleness > 1:
            client = self.correct(client, current)
            self.corrected += 1
        beta = np.float32(fedadt_beta(arrival.staleness))
        self.timestamp += 1
        return (1.0 - beta) * current + beta * client

    def summary(self) -> dict[str, float | int | str]:
        """KD corrections made and, over every KD batch, what the correction's terms saw.

        ``kd-teacher-accuracy`` and ``kd-student-accuracy``: the global model's and the stale client
        models' accuracy on the server set's batches (before each step); ``kd-kl-share``: the mean
        share of the teacher term in the pull on the student's logits (0 = labels only).
        """
        figures = self._figures
        out: dict[str, float | int | str] = {"kd-corrected": self.corrected,
                                             "server-set-size": int(len(self.server_set.y))}
        if figures["batches"]:
            out["kd-teacher-accuracy"] = round(figures["teacher-correct"] / figures["examples"], 4)
            out["kd-student-accuracy"] = round(figures["student-correct"] / figures["examples"], 4)
            out["kd-kl-share"] = round(figures["kl-share"] / figures["batches"], 4)
        return out
