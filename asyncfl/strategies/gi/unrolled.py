"""The client's local-training program, replayed differentiably on the server.

Gradient-inversion compensation (``gradient-inversion-stale-updates``, Sec. 3.1,
Eq. 6) needs ``LocalUpdate(w; D)``: the exact program a client runs (our
``train_local``: SGD with momentum and weight decay, ``epochs`` passes of
mini-batches, or a fixed number of ``steps``), written functionally with
``torch.func.functional_call`` so the result stays differentiable with respect
to the data ``D`` (inputs and soft labels). Gradients are taken with
``create_graph=True`` only when the caller differentiates through them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from asyncfl.errors import ConfigError
from asyncfl.models.flat import load_flat

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalProgram:
    """What one client job does, as the run-config tells every client.

    Only plain SGD (with momentum and weight decay) is replayed: the paper's
    Appendix E (Table 20) finds inversion fails under Adam, and so it is refused.
    """

    epochs: int
    steps: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        if self.optimizer != "sgd":
            raise ConfigError(f"gradient-inversion compensation replays SGD clients only, got optimizer={self.optimizer!r}"
                             " (the paper's Appendix E: inversion fails under Adam); set optimizer='sgd'")
        if self.batch_size < 1 or self.lr <= 0 or (self.epochs <= 0 and self.steps <= 0):
            raise ConfigError(f"invalid local program {self}: need batch-size >= 1, lr > 0 and epochs or steps > 0")

    @classmethod
    def from_message_config(cls, config: dict) -> "LocalProgram":
        """From the kebab-case keys of a train request (``TrainConfig.to_message_config``)."""
        return cls(epochs=int(config["local-epochs"]), steps=int(config["local-steps"]),
                   batch_size=int(config["batch-size"]), lr=float(config["lr"]), momentum=float(config["momentum"]),
                   weight_decay=float(config["weight-decay"]), optimizer=str(config["optimizer"]))

    def batches_per_epoch(self, num_examples: int) -> int:
        return max(1, math.ceil(num_examples / min(self.batch_size, num_examples)))

    def total_steps(self, num_examples: int) -> int:
        """Optimiser steps a client with ``num_examples`` samples takes (as ``train_local`` counts them)."""
        return self.epochs * self.batches_per_epoch(num_examples) if self.epochs > 0 else self.steps


def client_batches(num_examples: int, program: LocalProgram, seed: int) -> list[torch.Tensor]:
    """The index batches ``train_local`` draws for a job with ``job-seed = seed`` (same generator, same order)."""
    generator = torch.Generator().manual_seed(seed)
    size = min(program.batch_size, num_examples)
    order, cursor, out = torch.randperm(num_examples, generator=generator), 0, []
    for _ in range(program.total_steps(num_examples)):
        if cursor >= num_examples:
            order, cursor = torch.randperm(num_examples, generator=generator), 0
        out.append(order[cursor : cursor + size])
        cursor += size
    return out


def recovered_batches(rec_size: int, num_examples: int, program: LocalProgram) -> list[torch.Tensor]:
    """Batches over a recovered set that keep the client's step count.

    ``D_rec`` is split into as many fixed, contiguous batches as the client has
    per epoch, and the client's epochs (or steps) are replayed over them, so
    the replay takes the same number of steps at the same learning rate even
    though ``D_rec`` is smaller than the client's data (the paper sizes it at
    about half, Appendix D).
    """
    chunks = [torch.as_tensor(c) for c in np.array_split(np.arange(rec_size), min(rec_size, program.batches_per_epoch(num_examples)))]
    return [chunks[i % len(chunks)] for i in range(program.total_steps(num_examples))]


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Batch mean of ``-sum_c p_c log softmax(logits)_c``; equals ``cross_entropy`` for one-hot ``p``."""
    return -(target_probs * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def unrolled_sgd(model: nn.Module, params: Tensors, buffers: Tensors, inputs: torch.Tensor,
                 target_probs: torch.Tensor, batches: Iterable[torch.Tensor], program: LocalProgram,
                 differentiable: bool = True) -> Tensors:
    """Run ``program``'s SGD over ``batches`` of ``(inputs, target_probs)`` from ``params``; return the new params.

    Follows ``torch.optim.SGD`` exactly (dampening 0, no Nesterov): ``d = g + wd * p``;
    ``b = d`` on the first step, else ``b = momentum * b + d``; ``p = p - lr * b``.
    ``buffers`` (BatchNorm statistics) are updated in place as in training.
    """
    names = list(params)
    current = [params[n] for n in names]
    velocity: list[torch.Tensor | None] = [None] * len(names)
    for index in batches:
        state = {**dict(zip(names, current)), **buffers}
        loss = soft_cross_entropy(functional_call(model, state, (inputs[index],)), target_probs[index])
        grads = torch.autograd.grad(loss, current, create_graph=differentiable)
        updated = []
        for i, (p, g) in enumerate(zip(current, grads)):
            d = g + program.weight_decay * p if program.weight_decay else g
            if program.momentum:
                velocity[i] = d if velocity[i] is None else program.momentum * velocity[i] + d
                d = velocity[i]
            updated.append(p - program.lr * d)
        current = updated
    return dict(zip(names, current))


class FlatLayout:
    """Where each trainable parameter sits in the engine's flat ``state_dict`` vector.

    Parameters
    ----------
    model : nn.Module
        A model of the run's architecture (its values are overwritten by :meth:`split`).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.param_names = [name for name, _ in model.named_parameters()]
        spans, offset = {}, 0
        for name, tensor in model.state_dict().items():
            spans[name] = (offset, offset + tensor.numel())
            offset += tensor.numel()
        self.size = offset
        self.param_index = np.concatenate([np.arange(*spans[n]) for n in self.param_names])

    def split(self, flat: np.ndarray) -> tuple[Tensors, Tensors]:
        """``(params, buffers)`` of ``flat`` as fresh tensors (parameters require no grad yet)."""
        load_flat(self.model, flat)
        params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        return params, buffers

    def param_vector(self, flat: np.ndarray) -> np.ndarray:
        """The trainable-parameter coordinates of ``flat``."""
        return flat[self.param_index]


def flatten_params(params: Tensors, names: Sequence[str]) -> torch.Tensor:
    """Concatenate ``params`` in ``names`` order into one vector."""
    return torch.cat([params[n].reshape(-1) for n in names])
