"""Forward passes over many inputs in cache-sized chunks.

Server-side methods run a model over hundreds or thousands of inputs at once
(FedEcho's logits of every arriving model on ``U``, FedRevive's probe set, the
server's evaluation). On this machine's CPU (2 MiB L2 per core) one big batch
is much slower per sample than chunks of 64: the CNN's forward over 1000
inputs takes ~500 ms in chunks of 500 and ~155 ms in chunks of 64 (one thread;
the first layer's activations of 500 samples are 50 MB, of 64 samples 6 MB);
ResNet-18 over 256 CIFAR inputs 4.2 s vs 3.0 s; LeNet-5 and the MLP are flat.
Per-sample outputs are the same bits at every chunk size (tested), so only the
time changes. ``benchmarks/server_methods.py`` measures it.
"""

from __future__ import annotations

import torch
from torch import nn

CACHE_FRIENDLY_BATCH = 64


@torch.no_grad()
def chunked_forward(model: nn.Module, inputs: torch.Tensor, batch_size: int = CACHE_FRIENDLY_BATCH) -> torch.Tensor:
    """``model(inputs)`` computed ``batch_size`` rows at a time, without gradients (``model``'s mode is kept)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return torch.cat([model(inputs[start : start + batch_size]) for start in range(0, len(inputs), batch_size)])
