"""FedADT: the newest global model distils into stale client models before mixing.

FedADT paper, Algorithm 2 and Sec. IV. On an arrival with staleness ``tau > 1``
the current global model (teacher, logits ``z_S``) corrects the client model
(student, logits ``z_C``) by one pass of knowledge distillation over a small
labeled server set (0.5% of the training data in the paper):

``L = a(t) * KL(softmax(z_S / T) || softmax(z_C / T)) + (1 - a(t)) * CE(z_C, y)``

with ``T = 3`` and the adaptive weight
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


def fedadt_kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                   alpha: float, temperature: float) -> torch.Tensor:
    """``alpha * KL(softmax(z_S/T) || softmax(z_C/T)) + (1 - alpha) * CE(z_C, y)``, batch mean."""
    kl = F.kl_div(F.log_softmax(student_logits / temperature, dim=1), F.softmax(teacher_logits / temperature, dim=1),
                  reduction="batchmean")
    return alpha * kl + (1.0 - alpha) * F.cross_entropy(student_logits, labels)


@dataclass(frozen=True)
class FedADTConfig(StrategyConfig):
    """FedADT's knobs (run-config ``fedadt.*``).

    Parameters
    ----------
    temperature : float
        ``T`` of the distillation softmax.
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
    temperature, alpha_min, alpha_max, ramp_arrivals, kd_lr, kd_batch_size
        See :class:`FedADTConfig`.
    seed : int
        Seeds the order of the server set in each KD pass.
    """

    config_class = FedADTConfig
    # the teacher and student are loaded afresh for every correction: only the order stream and counters persist
    state_attributes = ("_generator", "timestamp", "corrected")

    def __init__(self, model_fn: Callable[[], nn.Module], server_data: Any, temperature: float = 3.0,
                 alpha_min: float = 0.2, alpha_max: float = 0.6, ramp_arrivals: int = 1000, kd_lr: float = 0.01,
                 kd_batch_size: int = 32, seed: int = 0, **flower_options: Any) -> None:
        super().__init__(**flower_options)
        self.config = FedADTConfig(temperature, alpha_min, alpha_max, ramp_arrivals, kd_lr, kd_batch_size)
        model_fn = checked_model_fn(model_fn, "FedADT")
        if isinstance(server_data, ServerSet):
            server_data = (server_data.x, server_data.y)
        if isinstance(server_data, (tuple, list)) and len(server_data) == 2 and len(server_data[1]) == 0:
            raise ValueError("FedADT needs a non-empty server set (fedadt.server-fraction too small?)")
        server_set = ServerSet(*labeled_arrays(server_data, "FedADT", "server_data"))
        self.teacher, self.student = model_fn(), model_fn()
        self.server_set = server_set
        self._x = torch.from_numpy(server_set.x)
        self._y = torch.from_numpy(server_set.y)
        self._generator = torch.Generator().manual_seed(seed)
        self.timestamp = 0
        self.corrected = 0

    @classmethod
    def from_config(cls, config: FedADTConfig, resources: StrategyResources | None = None,
                    **flower_options: Any) -> "FedADT":
        """Built-in app: the server set is a class-stratified ``server_fraction`` of the training split."""
        if resources is None:
            raise ValueError("FedADT needs the built-in app's model and training split (resources)")
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
            loss = fedadt_kd_loss(self.student(self._x[index]), teacher_logits, self._y[index], alpha, cfg.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return model_to_flat(self.student)

    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        client = arrival.weights
        if arrival.staleness > 1:
            client = self.correct(client, current)
            self.corrected += 1
        beta = np.float32(fedadt_beta(arrival.staleness))
        self.timestamp += 1
        return (1.0 - beta) * current + beta * client

    def summary(self) -> dict[str, float | int | str]:
        return {"kd-corrected": self.corrected, "server-set-size": int(len(self.server_set.y))}
