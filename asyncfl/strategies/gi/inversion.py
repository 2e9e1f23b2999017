"""Recover a data set whose local training reproduces a stale update (gradient-inversion paper, Sec. 3.1).

``D_rec`` = inputs plus learnable soft labels (logits). It is optimised with
Adam so that ``LocalUpdate(w^{t-tau}; D_rec) - w^{t-tau}`` matches the received
stale update in L1 over the top-K coordinates (Eq. 6; L1 rather than cosine
because ``D_rec`` is large, Appendix D). The estimated unstale update is then
``LocalUpdate(w^t; D_rec) - w^t`` (Fig. 2). The public code's reconstructor uses
Adam at lr 1 for 40k iterations on a GPU; our defaults are CPU-sized and the
error they reach is reported by the strategy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from asyncfl.strategies.gi.sparsify import top_k_mask
from asyncfl.strategies.gi.unrolled import LocalProgram, Tensors, flatten_params, recovered_batches, unrolled_sgd


@dataclass(frozen=True)
class InversionConfig:
    """Knobs of one inversion (checked where they are set: :class:`~asyncfl.strategies.gi.strategy.GICompensationConfig`).

    Parameters
    ----------
    rec_fraction : float
        ``|D_rec| / |D_i|`` (the paper settles at 1/2, Appendix D, Tables 17-18).
    max_rec : int
        Upper bound on ``|D_rec|`` (compute grows linearly with it).
    iterations, warm_iterations : int
        Adam iterations from a random start, and when continuing from the client's previous ``D_rec``
        (Sec. 3.3, Table 5: warm starts save ~43% of the iterations).
    lr : float
        Adam learning rate on inputs and label logits.
    keep_fraction : float
        Top-K share of the update's coordinates in the disparity (0.05 = the paper's 95% sparsification).
    """

    rec_fraction: float = 0.5
    max_rec: int = 64
    iterations: int = 100
    warm_iterations: int = 40
    lr: float = 0.1
    keep_fraction: float = 0.05

    def rec_size(self, num_examples: int) -> int:
        """``|D_rec|`` for a client with ``num_examples`` samples."""
        return max(1, min(self.max_rec, round(self.rec_fraction * max(num_examples, 1))))


@dataclass
class RecoveredSet:
    """``D_rec``: inputs and label logits (soft labels are ``softmax(label_logits)``)."""

    inputs: torch.Tensor
    label_logits: torch.Tensor

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


@dataclass(frozen=True)
class InversionResult:
    """The recovered set and how well it reproduces the target update."""

    recovered: RecoveredSet
    initial_disparity: float
    disparity: float
    iterations: int
    seconds: float


def random_recovered_set(size: int, input_shape: tuple[int, ...], num_classes: int,
                         generator: torch.Generator) -> RecoveredSet:
    """Gaussian inputs and near-uniform label logits (the paper's ``randn`` initialisation)."""
    inputs = torch.randn((size, *input_shape), generator=generator)
    logits = 0.01 * torch.randn((size, num_classes), generator=generator)
    return RecoveredSet(inputs, logits)


def replay_update(model: nn.Module, params: Tensors, buffers: Tensors, recovered: RecoveredSet,
                  program: LocalProgram, num_examples: int, differentiable: bool = False) -> torch.Tensor:
    """``LocalUpdate(params; D_rec) - params`` as one vector over the trainable parameters."""
    names = list(params)
    start = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    batches = recovered_batches(len(recovered), num_examples, program)
    inputs, labels = recovered.inputs, F.softmax(recovered.label_logits, dim=1)
    with torch.enable_grad():
        final = unrolled_sgd(model, start, {n: b.clone() for n, b in buffers.items()}, inputs, labels, batches,
                             program, differentiable=differentiable)
    delta = flatten_params(final, names) - flatten_params(start, names)
    return delta if differentiable else delta.detach()


def invert_update(model: nn.Module, base_params: Tensors, buffers: Tensors, target: torch.Tensor,
                  program: LocalProgram, num_examples: int, input_shape: tuple[int, ...], num_classes: int,
                  config: InversionConfig, generator: torch.Generator, warm_start: RecoveredSet | None = None) -> InversionResult:
    """Optimise ``D_rec`` so that replaying the client's program from ``base_params`` gives ``target``.

    Parameters
    ----------
    model : nn.Module
        The run's architecture, used functionally (its own weights are not read).
    base_params, buffers : dict of tensors
        ``w^{t-tau}``: the global model the stale job started from.
    target : torch.Tensor
        The stale update over the trainable parameters (``flatten_params`` order).
    program : LocalProgram
        The client's local training, replayed step for step.
    num_examples : int
        The client's reported sample count (sets ``|D_rec|`` and the step count).
    input_shape : tuple of int
        One sample's shape ``(C, H, W)``.
    warm_start : RecoveredSet, optional
        The client's previous ``D_rec``; used when its size still matches.
    """
    started = time.perf_counter()
    size = config.rec_size(num_examples)
    if warm_start is not None and len(warm_start) == size:
        start, iterations = warm_start, config.warm_iterations
    else:
        start, iterations = random_recovered_set(size, input_shape, num_classes, generator), config.iterations
    inputs = start.inputs.detach().clone().requires_grad_(True)
    logits = start.label_logits.detach().clone().requires_grad_(True)
    index = torch.nonzero(top_k_mask(target, config.keep_fraction).reshape(-1)).reshape(-1)
    wanted = target.reshape(-1)[index].detach()
    optimiser = torch.optim.Adam([inputs, logits], lr=config.lr)
    first = last = float("nan")
    for step in range(iterations):
        replayed = replay_update(model, base_params, buffers, RecoveredSet(inputs, logits), program, num_examples,
                                 differentiable=True)
        loss = (replayed[index] - wanted).abs().mean()
        grad_inputs, grad_logits = torch.autograd.grad(loss, [inputs, logits])
        inputs.grad, logits.grad = grad_inputs, grad_logits
        optimiser.step()
        last = float(loss.detach())
        if step == 0:
            first = last
    recovered = RecoveredSet(inputs.detach(), logits.detach())
    return InversionResult(recovered, first, last, iterations, time.perf_counter() - started)

