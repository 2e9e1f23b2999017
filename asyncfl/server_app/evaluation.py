"""Centralised evaluation of flat global models on the server-held test split."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from asyncfl.client_app.training import evaluate_per_class, pick_device
from asyncfl.data.drift import DriftConfig, drifted
from asyncfl.models.flat import load_flat


def state_as_numpy(model: torch.nn.Module) -> "OrderedDict[str, np.ndarray]":
    """A model's ``state_dict`` as numpy arrays (CPU)."""
    return OrderedDict((k, v.detach().cpu().numpy()) for k, v in model.state_dict().items())


class CentralEvaluator:
    """Loads a flat vector into a reusable torch model and scores it on ``(x, y)``, overall and per class."""

    def __init__(self, model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int, num_classes: int) -> None:
        self.device = pick_device()
        self.model = model.to(self.device)
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.num_classes = num_classes

    def __call__(self, flat: np.ndarray) -> tuple[float, float, list[float]]:
        load_flat(self.model, flat)
        return evaluate_per_class(self.model, self.x, self.y, self.num_classes, self.batch_size, self.device)


class DriftingEvaluator(CentralEvaluator):
    """A :class:`CentralEvaluator` whose test split drifts like the clients' data (variant-data scenario).

    The engine calls :meth:`select` with the evaluation time before scoring; the test
    inputs then have the fraction of samples replaced that the clients' data has then
    (same sources and rules, its own seed).
    """

    def __init__(self, model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int, num_classes: int,
                 drift: DriftConfig, seed: int) -> None:
        super().__init__(model, x, y, batch_size, num_classes)
        self.base_x, self.drift, self.seed = x, drift, seed
        self._count = 0

    def select(self, at: float) -> int:
        """Use the test data in effect at time ``at``; return how many test samples are replaced."""
        count = int(np.floor(self.drift.fraction(at) * len(self.base_x)))
        if count != self._count:
            # its own stream: the clients' are (seed, 0, partition)
            self.x = drifted(self.base_x, self.y, self.drift.fraction(at), self.drift.source, (self.seed, 1))
            self._count = count
        return count


class RecordEvaluator:
    """A :class:`CentralEvaluator` as a Flower ``evaluate_fn(version, ArrayRecord) -> MetricRecord``.

    The record carries ``accuracy``, ``loss`` and ``class-accuracy`` (a list, NaN for classes
    absent from the split). A drifting evaluator's ``select`` is passed through, so the engine
    tells it the clock before each evaluation.
    """

    state_attributes = ("best_accuracy",)  # what a checkpoint keeps: best_model.pt is rewritten only on a new best

    def __init__(self, evaluator: CentralEvaluator, best_model_path: Path | None = None) -> None:
        self.evaluator = evaluator
        self.best_model_path = best_model_path
        self.best_accuracy = float("-inf")
        if hasattr(evaluator, "select"):
            self.select = evaluator.select

    def __call__(self, version: int, arrays: ArrayRecord) -> MetricRecord:
        evaluator = self.evaluator
        state = arrays.to_torch_state_dict()
        evaluator.model.load_state_dict(state)
        loss, accuracy, per_class = evaluate_per_class(evaluator.model, evaluator.x, evaluator.y,
                                                       evaluator.num_classes, evaluator.batch_size, evaluator.device)
        if self.best_model_path is not None and accuracy > self.best_accuracy:
            self.best_accuracy = float(accuracy)
            save_state_dict(state, self.best_model_path)  # written as it comes: a killed run keeps its best
        return MetricRecord({"accuracy": float(accuracy), "loss": float(loss), "class-accuracy": per_class})


def save_state_dict(state: "OrderedDict[str, torch.Tensor]", path: Path) -> None:
    """``torch.save(state, path)`` atomically (a crash mid-write leaves the previous file); load it with
    ``model.load_state_dict(torch.load(path))``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)
