"""What the server-side methods take from a user's app: a model builder and data, checked at construction.

Methods that run a network on the server (FedEcho, FedADT, FedRevive, GI compensation)
take the user's own ``model_fn`` (e.g. ``model_fn=Net``) and data as numpy arrays, torch
tensors or a torch ``Dataset``. A missing or unusable piece is a ``ConfigError`` (a ``ValueError``) that says
what was expected, raised before any run starts.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from asyncfl.errors import ConfigError


def checked_model_fn(model_fn: Any, owner: str) -> Callable[[], nn.Module]:
    """``model_fn`` if calling it builds a ``torch.nn.Module``; else a clear error."""
    if not callable(model_fn):
        raise ConfigError(f"{owner} needs model_fn: a callable that builds your torch.nn.Module "
                         f"(e.g. model_fn=Net), got {type(model_fn).__name__}")
    built = model_fn()
    if not isinstance(built, nn.Module):
        raise ConfigError(f"{owner}: model_fn() must return a torch.nn.Module, got {type(built).__name__}")
    return model_fn


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _columns(data: Any) -> list[np.ndarray]:
    """The fields of a Dataset's samples stacked column-wise (a sample is a tensor or a tuple of them)."""
    samples = [data[i] for i in range(len(data))]
    if not samples:
        return []
    if isinstance(samples[0], (tuple, list)):
        return [np.stack([_as_numpy(s[k]) for s in samples]) for k in range(len(samples[0]))]
    return [np.stack([_as_numpy(s) for s in samples])]


def input_array(data: Any, owner: str, name: str) -> np.ndarray:
    """Model inputs as float32: an array, a tensor, or a ``Dataset`` whose samples are ``x`` or ``(x, ...)``."""
    if data is None:
        raise ConfigError(f"{owner} needs {name}: model inputs as a numpy array, a torch tensor or a torch Dataset")
    if isinstance(data, (np.ndarray, torch.Tensor)):
        array = _as_numpy(data)
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        columns = _columns(data)
        array = columns[0] if columns else np.empty((0,))
    else:
        raise ConfigError(f"{owner}: {name} must be a numpy array, a torch tensor or a torch Dataset, "
                         f"got {type(data).__name__}")
    if len(array) == 0:
        raise ConfigError(f"{owner}: {name} is empty")
    return np.ascontiguousarray(array, dtype=np.float32)


def labeled_arrays(data: Any, owner: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32, y int64)`` from a pair ``(x, y)`` or a ``Dataset`` of ``(x, y)`` samples."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = _as_numpy(data[0]), _as_numpy(data[1])
    elif data is not None and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        columns = _columns(data)
        if len(columns) < 2:
            raise ConfigError(f"{owner}: {name} must yield (input, label) samples")
        x, y = columns[0], columns[1]
    else:
        raise ConfigError(f"{owner} needs {name}: labeled server data as (x, y) or a torch Dataset of (x, y)")
    if len(x) == 0 or len(x) != len(y):
        raise ConfigError(f"{owner}: {name} needs as many labels as inputs and at least one sample "
                         f"(got {len(x)} inputs, {len(y)} labels)")
    return np.ascontiguousarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
