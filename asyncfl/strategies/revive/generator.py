"""The conditional generator of KD-Revive (FedRevive paper, Sec. 2.2 step 2; FastDFKD-style).

A latent vector ``z`` plus a learned class embedding of the target label go
through a linear projection to a ``(base, H/4, W/4)`` map, then two
upsample + conv + BatchNorm + LeakyReLU blocks and a final conv to the input's
channels. The output passes a non-affine BatchNorm, so synthetic inputs come
out standardised like our (standardised) datasets. Input sides must be
divisible by 4 (28 and 32 are).
"""

from __future__ import annotations

import torch
from torch import nn

from asyncfl.errors import ConfigError


class Generator(nn.Module):
    """``G_theta(z, y)``: latent ``z`` (B x latent_dim) and labels ``y`` (B,) to inputs (B x C x H x W)."""

    def __init__(self, latent_dim: int, num_classes: int, input_shape: tuple[int, int, int], base: int = 64) -> None:
        super().__init__()
        channels, height, width = input_shape
        if height % 4 or width % 4:
            raise ConfigError(f"generator needs input sides divisible by 4, got {height}x{width}")
        self.latent_dim, self.base, self.side = latent_dim, base, (height // 4, width // 4)
        self.embed = nn.Embedding(num_classes, latent_dim)
        self.project = nn.Sequential(nn.Linear(latent_dim, base * 2 * self.side[0] * self.side[1]),
                                     nn.BatchNorm1d(base * 2 * self.side[0] * self.side[1]))
        self.body = nn.Sequential(
            nn.Upsample(scale_factor=2), nn.Conv2d(base * 2, base * 2, 3, padding=1), nn.BatchNorm2d(base * 2),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2), nn.Conv2d(base * 2, base, 3, padding=1), nn.BatchNorm2d(base),
            nn.LeakyReLU(0.2),
            nn.Conv2d(base, channels, 3, padding=1), nn.BatchNorm2d(channels, affine=False),
        )

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.project(z + self.embed(labels))
        return self.body(h.view(-1, self.base * 2, *self.side))
