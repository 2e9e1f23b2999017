"""Forward passes over many inputs in cache-sized chunks.

Server-side methods run a model over hundreds or thousands of inputs at once
(FedEcho's logits of every arriving model on ``U``, FedRevive's probe set, the
server's evaluation). On a CPU with a small L2 cache one big batch is slower per
sample than chunks of 64, whose first layer's activations fit the cache (a CNN's
500 samples hold 50 MB there, 64 samples 6 MB). Per-sample outputs are the same
bits at every chunk size (tested), so only the time changes; the server-methods
benchmark measures it (linked from docs/methods.md).
"""

from __future__ import annotations

import torch
from torch import nn

from asyncfl.errors import ConfigError

CACHE_FRIENDLY_BATCH = 64


@torch.no_grad()
def chunked_forward(model: nn.Module, inputs: torch.Tensor, batch_size: int = CACHE_FRIENDLY_BATCH) -> torch.Tensor:
    """``model(inputs)`` computed ``batch_size`` rows at a time, without gradients (``model``'s mode is kept)."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    return torch.cat([model(inputs[start : start + batch_size]) for start in range(0, len(inputs), batch_size)])
