"""Per-client class-proportion proxies from regular uploads (FedRevive paper, Sec. 2.1 and Appendix B).

For each of a client's first ``T_est`` uploads the server probes the model with
Gaussian-noise inputs and averages ``softmax(logits / T_probe)``; the proxy is
the running mean of those vectors, fixed after ``T_est`` uploads. Teacher
weights per class are the proxies normalised over the buffered teachers:
``w_k^j = pi_k^j / sum_{l in buffer} pi_l^j``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from asyncfl.models.inference import chunked_forward


class ClassProportionProxies:
    """Online proxies ``pi_hat_i``; ``true_proportions`` (ablation only) replaces them with the real histograms."""

    state_attributes = ("_sum", "_count")

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int], t_est: int = 2, t_probe: float = 1.0,
                 probe_size: int = 256, seed: int = 0, true_proportions: dict[int, np.ndarray] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.num_classes, self.t_est, self.t_probe = num_classes, t_est, t_probe
        generator = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same probe on every device
        self.probe = torch.randn((probe_size, *input_shape), generator=generator).to(device)
        self.true_proportions = true_proportions
        self._sum: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}

    @torch.no_grad()
    def observe(self, client: int, model: nn.Module) -> None:
        """Probe one upload of ``client`` (only its first ``T_est`` count)."""
        if self.true_proportions is not None or self._count.get(client, 0) >= self.t_est:
            return
        logits = chunked_forward(model.eval(), self.probe)
        probs = torch.softmax(logits / self.t_probe, dim=1).mean(dim=0).double().cpu().numpy()
        self._sum[client] = self._sum.get(client, 0.0) + probs
        self._count[client] = self._count.get(client, 0) + 1

    def proportions(self, client: int) -> np.ndarray:
        """``pi_hat_client`` (uniform for a client never observed)."""
        if self.true_proportions is not None:
            return np.asarray(self.true_proportions[client], dtype=np.float64)
        if client not in self._count:
            return np.full(self.num_classes, 1.0 / self.num_classes)
        return self._sum[client] / self._count[client]


def teacher_class_weights(proportions: list[np.ndarray]) -> np.ndarray:
    """``w[k, j] = pi_k^j / sum_l pi_l^j`` over the buffered teachers (columns sum to 1)."""
    stacked = np.stack(proportions)
    totals = stacked.sum(axis=0, keepdims=True)
    return np.divide(stacked, totals, out=np.full_like(stacked, 1.0 / len(proportions)), where=totals > 0)
