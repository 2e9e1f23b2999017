"""Flat float32 vectors <-> torch models, in ``state_dict`` order.

The engine's global model is one vector laid out as the model's
``state_dict`` (every entry flattened and cast to float32). These helpers let
server-side methods that need a live network (evaluation, distillation) move
between the two without knowing Flower's ArrayRecord.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def load_flat(model: nn.Module, flat: np.ndarray) -> nn.Module:
    """Copy ``flat`` into ``model`` in place (dtypes follow the model's own).

    BatchNorm running variances are clamped to >= 0 on the way in: a candidate model
    built from stale deltas (``x + eta * sum(client - stale base)``) can hold negative
    ones before the engine's own clamp, and a server-side pass through such a network in
    eval mode (FedEcho's distillation) would turn every output into NaN.
    """
    offset = 0
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            size = tensor.numel()
            piece = torch.from_numpy(np.asarray(flat[offset : offset + size])).view(tensor.shape)
            tensor.copy_(piece.round() if not tensor.is_floating_point() else piece)
            if name.endswith("running_var"):
                tensor.clamp_(min=0.0)
            offset += size
    if offset != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, the model needs {offset}")
    return model


def model_to_flat(model: nn.Module) -> np.ndarray:
    """The model's ``state_dict`` as one new float32 vector."""
    return np.concatenate([t.detach().cpu().reshape(-1).float().numpy() for t in model.state_dict().values()])


def parameter_mask(model: nn.Module) -> np.ndarray:
    """Boolean vector over the flat layout: True where an entry is a trainable parameter.

    BatchNorm running statistics and counters are ``state_dict`` entries too; comparing the
    size of two updates (FedRevive's KD half against the client's delta) on parameters alone
    keeps a running variance's drift from dominating the norm.
    """
    parameters = {name for name, _ in model.named_parameters()}
    return np.concatenate([np.full(t.numel(), name in parameters) for name, t in model.state_dict().items()])
