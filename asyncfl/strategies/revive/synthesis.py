"""Generator training and sample synthesis (FedRevive paper, Sec. 2.2 step 2, Eq. 4), and the Reptile step.

``L_synth = a_target * L_target + a_feature * L_feature + a_adv * L_adv`` over a
batch of latents ``z`` with uniform random labels ``y``:

* ``L_target = mean_b sum_k w_k^{y_b} CE(teacher_k(r_b), y_b)``
* ``L_feature = sum_k w_k * sum_layers (||mu_k - mu_bar_k|| + ||var_k - var_bar_k||)``: BatchNorm
  statistics of each teacher on the synthetic batch against its running statistics
  (DeepInversion-style). The paper writes it per sample; batch statistics only exist per
  batch, so each teacher's term is weighted by ``w_k = mean_b w_k^{y_b}``. Teachers without
  BatchNorm contribute no feature term.
* ``L_adv = -mean_b sum_k w_k^{y_b} 1[argmax teacher_k = argmax student] KL(teacher_k || student)``

``(z, theta')`` take ``K_synth`` Adam steps (latent and generator learning rates);
the batch with the lowest loss is kept for the KD pool. Then Reptile:
``theta <- (1 - lambda) theta + lambda theta'``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from asyncfl.strategies.revive.generator import Generator


@dataclass(frozen=True)
class SynthesisConfig:
    """Knobs of one synthesis round (paper defaults, FEMNIST column of its Table 6)."""

    batch_size: int = 64
    steps: int = 2
    generator_lr: float = 0.01
    latent_lr: float = 0.003
    alpha_target: float = 1.0
    alpha_feature: float = 0.3
    alpha_adv: float = 0.1
    meta_lambda: float = 0.5


class BatchNormStatistics:
    """Collects ``||mean - running_mean|| + ||var - running_var||`` at every BatchNorm2d input of a model."""

    def __init__(self, model: nn.Module) -> None:
        self.terms: list[torch.Tensor] = []
        self._handles = [m.register_forward_hook(self._hook) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def _hook(self, module: nn.BatchNorm2d, inputs, _output) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.var(dim=(0, 2, 3), unbiased=False)
        self.terms.append(torch.norm(mean - module.running_mean, 2) + torch.norm(var - module.running_var, 2))

    def take(self) -> torch.Tensor:
        total = torch.stack(self.terms).sum() if self.terms else torch.zeros(())  # (a CPU scalar mixes with any device)
        self.terms = []
        return total

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def synthesis_loss(synthetic: torch.Tensor, labels: torch.Tensor, teachers: list[nn.Module],
                   statistics: list[BatchNormStatistics], student: nn.Module, weights: torch.Tensor,
                   config: SynthesisConfig) -> torch.Tensor:
    """Eq. 4 for one batch; ``weights[k, j]`` are the teachers' class weights."""
    per_sample = weights[:, labels]  # (teachers, batch)
    with torch.no_grad():
        student_logits = student(synthetic)
    student_log_p = F.log_softmax(student_logits, dim=1)
    target = adversarial = feature = synthetic.new_zeros(())
    for k, (teacher, stats) in enumerate(zip(teachers, statistics)):
        logits = teacher(synthetic)
        target = target + (per_sample[k] * F.cross_entropy(logits, labels, reduction="none")).mean()
        log_p = F.log_softmax(logits, dim=1)
        agree = (logits.argmax(dim=1) == student_logits.argmax(dim=1)).float()
        kl = (log_p.exp() * (log_p - student_log_p)).sum(dim=1)
        adversarial = adversarial - (per_sample[k] * agree * kl).mean()
        if stats.active:
            feature = feature + per_sample[k].mean() * stats.take()
    return config.alpha_target * target + config.alpha_feature * feature + config.alpha_adv * adversarial


def synthesize(generator: Generator, teachers: list[nn.Module], student: nn.Module, weights: torch.Tensor,
               num_classes: int, config: SynthesisConfig, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One synthesis round; returns the lowest-loss batch ``(inputs, labels)`` and its loss.

    ``generator`` is meta-updated in place with the Reptile step. The work runs on the generator's
    device; ``z`` and the labels are drawn from ``rng`` on the CPU (the same draws on every device),
    and the labels come back on the CPU.
    """
    device = next(generator.parameters()).device
    fast = copy.deepcopy(generator).train()
    z = torch.randn((config.batch_size, generator.latent_dim), generator=rng).to(device).requires_grad_(True)
    drawn = torch.randint(num_classes, (config.batch_size,), generator=rng)
    labels = drawn.to(device)
    optimizer = torch.optim.Adam([{"params": fast.parameters(), "lr": config.generator_lr},
                                  {"params": [z], "lr": config.latent_lr}], betas=(0.5, 0.999))
    for teacher in teachers:
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    student.eval()
    statistics = [BatchNormStatistics(t) for t in teachers]
    best: tuple[torch.Tensor, float] | None = None
    try:
        for _ in range(config.steps):
            synthetic = fast(z, labels)
            loss = synthesis_loss(synthetic, labels, teachers, statistics, student, weights, config)
            if best is None or loss.item() < best[1]:
                best = (synthetic.detach().clone(), loss.item())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        for stats in statistics:
            stats.remove()
    with torch.no_grad():  # Reptile meta-update towards the adapted generator
        for slow, adapted in zip(generator.parameters(), fast.parameters()):
            slow.mul_(1.0 - config.meta_lambda).add_(adapted, alpha=config.meta_lambda)
        for slow_buffer, adapted_buffer in zip(generator.buffers(), fast.buffers()):
            slow_buffer.copy_(adapted_buffer)
    assert best is not None
    return best[0], drawn, best[1]
