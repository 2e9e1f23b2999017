"""Local training and evaluation loops (plain PyTorch, no Flower)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from asyncfl.errors import ConfigError
from asyncfl.models.inference import CACHE_FRIENDLY_BATCH


def pick_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD (with momentum) or Adam (beta1 = 0.9, as in the FedRevive paper)."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    raise ConfigError(f"unknown optimizer {name!r}; valid: sgd, adam")


def train_local(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    steps: int,
    epochs: int,
    batch_size: int,
    optimizer: str,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    seed: int = 0,
    device: torch.device | None = None,
) -> float:
    """Train ``model`` in place on ``(x, y)``; return the mean training loss.

    ``epochs > 0`` runs that many passes over the data; otherwise exactly
    ``steps`` mini-batch iterations, reshuffling whenever the data run out
    (FedRevive: 25 local iterations of batch 32). Batches are drawn with a
    generator seeded by ``seed``, so a job is reproducible.
    """
    if len(x) == 0:
        raise ValueError("this client's partition is empty; nothing to train on")
    device = device or pick_device()
    model.to(device).train()
    inputs = torch.from_numpy(x).to(device)
    labels = torch.from_numpy(y).to(device)
    generator = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model, optimizer, lr, momentum, weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    batch_size = min(batch_size, len(x))
    batches_per_epoch = max(1, int(np.ceil(len(x) / batch_size)))
    total_steps = epochs * batches_per_epoch if epochs > 0 else steps
    order = torch.randperm(len(x), generator=generator)
    cursor, losses = 0, []
    for _ in range(total_steps):
        if cursor >= len(x):
            order, cursor = torch.randperm(len(x), generator=generator), 0
        index = order[cursor : cursor + batch_size].to(device)
        cursor += batch_size
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[index]), labels[index])
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return float(torch.stack(losses).mean().item())


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = CACHE_FRIENDLY_BATCH,
             device: torch.device | None = None) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)``."""
    loss, accuracy, _ = evaluate_per_class(model, x, y, 0, batch_size, device)
    return loss, accuracy


@torch.no_grad()
def evaluate_per_class(model: nn.Module, x: np.ndarray, y: np.ndarray, num_classes: int, batch_size: int = CACHE_FRIENDLY_BATCH,
                       device: torch.device | None = None) -> tuple[float, float, list[float]]:
    """Mean cross-entropy, accuracy, and the accuracy on each of ``num_classes`` classes (NaN where absent)."""
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty split")
    device = device or pick_device()
    model.to(device).eval()
    loss_sum, correct = 0.0, 0
    hits = np.zeros(num_classes, dtype=np.int64)
    for start in range(0, len(x), batch_size):
        inputs = torch.from_numpy(x[start : start + batch_size]).to(device)
        labels = torch.from_numpy(y[start : start + batch_size]).to(device)
        logits = model(inputs)
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        right = logits.argmax(1) == labels
        correct += int(right.sum())
        if num_classes:
            hits += np.bincount(labels[right].cpu().numpy(), minlength=num_classes)[:num_classes]
    totals = np.bincount(y, minlength=num_classes)[:num_classes] if num_classes else np.zeros(0)
    per_class = [float(h / t) if t else float("nan") for h, t in zip(hits, totals)]
    return loss_sum / len(x), correct / len(x), per_class
