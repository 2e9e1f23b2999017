"""Live server state as a plain tree, and back: what checkpoints are made of.

:func:`capture` turns a value (numpy arrays, numbers, containers, random generators, torch
modules, optimizers, tensors and generators, asyncfl dataclasses, and objects that list
their ``state_attributes``) into a tree of plain values and numpy arrays, copied so later
changes to the live object do not reach it. :func:`restore` puts such a tree back, loading
into the live object where one exists (a module's weights, an optimizer's moments, a
generator's state), so references held elsewhere stay valid.

torch is imported only when a torch object is met: the engine captures its own state
with this module and loads no torch (``tests/test_layering.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections import deque
from typing import Any

import numpy as np

from asyncfl.errors import CheckpointError, StateError  # noqa: F401 (StateError re-exported)

#: Tag of a captured value that is not a plain one.
KIND = "__kind__"


def capture(value: Any, where: str = "state") -> Any:
    """A plain, independent copy of ``value``'s state (``where`` names it in errors)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (bytes, bytearray)):
        return {KIND: "bytes", "array": np.frombuffer(bytes(value), dtype=np.uint8).copy()}
    if isinstance(value, np.random.Generator):
        return {KIND: "numpy-generator", "state": value.bit_generator.state}
    if isinstance(value, deque):
        return {KIND: "deque", "items": [capture(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {KIND: "tuple", "items": [capture(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [capture(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {KIND: "dict", "items": [[capture(k, f"{where} key"), capture(v, f"{where}[{k!r}]")]
                                        for k, v in value.items()]}
    torch_state = _capture_torch(value, where)
    if torch_state is not None:
        return torch_state
    attributes = getattr(type(value), "state_attributes", None)
    if attributes is not None:
        return {KIND: "object", "type": _type_name(value),
                "attributes": {name: capture(getattr(value, name), f"{where}.{name}") for name in attributes}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__module__.startswith("asyncfl."):
        return {KIND: "dataclass", "type": _type_name(value),
                "fields": {f.name: capture(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}}
    raise StateError(f"{where}: cannot capture a {type(value).__module__}.{type(value).__qualname__}; give its class "
                     "a state_attributes tuple, or its owner state_dict()/load_state_dict() methods")


def restore(current: Any, saved: Any, where: str = "state") -> Any:
    """The live value for ``saved``: loaded into ``current`` where that is a module, optimizer, generator or
    object with ``state_attributes`` (and ``current`` returned), a new value otherwise."""
    if isinstance(saved, list):  # a list of live objects (networks) is loaded element by element
        live = current if isinstance(current, list) and len(current) == len(saved) else [None] * len(saved)
        return [restore(c, v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(live, saved))]
    if not (isinstance(saved, dict) and KIND in saved):
        return saved.copy() if isinstance(saved, np.ndarray) else saved
    kind = saved[KIND]
    if kind == "numpy-generator":
        generator = current if isinstance(current, np.random.Generator) else np.random.default_rng()
        if type(generator.bit_generator).__name__ != saved["state"]["bit_generator"]:
            generator = np.random.Generator(getattr(np.random, saved["state"]["bit_generator"])())
        generator.bit_generator.state = saved["state"]
        return generator
    if kind == "bytes":
        return saved["array"].tobytes()
    if kind == "deque":
        return deque((restore(None, v, where) for v in saved["items"]),
                     maxlen=current.maxlen if isinstance(current, deque) else None)
    if kind == "tuple":
        return tuple(restore(None, v, where) for v in saved["items"])
    if kind == "dict":  # values with a live counterpart under the same key are loaded into it
        live = current if isinstance(current, dict) else {}
        out = {}
        for k, v in saved["items"]:
            key = _hashable(restore(None, k, where))
            out[key] = restore(live.get(key), v, f"{where}[{key!r}]")
        return out
    if kind.startswith("torch-"):
        return _restore_torch(current, saved, where)
    if kind == "object":
        if current is None or _type_name(current) != MOVED.get(saved["type"], saved["type"]):
            raise StateError(f"{where}: saved a {saved['type']}, the live value is "
                             f"{'missing' if current is None else _type_name(current)}")
        for name, value in saved["attributes"].items():
            setattr(current, name, restore(getattr(current, name, None), value, f"{where}.{name}"))
        return current
    if kind == "dataclass":
        cls = _asyncfl_type(MOVED.get(saved["type"], saved["type"]), where)
        return cls(**{name: restore(None, value, f"{where}.{name}") for name, value in saved["fields"].items()})
    raise StateError(f"{where}: unknown saved kind {kind!r}")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


#: Classes that moved to another module since checkpoints named them: old ``module:qualname`` -> new.
MOVED = {"asyncfl.server_app.count_bound:ExampleCountCeiling": "asyncfl.server_app.participants:ExampleCountCeiling",
         "asyncfl.strategies.response:ResponseMeter": "asyncfl.strategies.pace:ResponseMeter",
         "asyncfl.server_app.update_bound:UpdateNormBound": "asyncfl.server_app.participants:UpdateNormBound"}


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}:{type(value).__qualname__}"


def _asyncfl_type(name: str, where: str) -> type:
    """The class ``module:qualname`` names; only asyncfl's own (a checkpoint never names code to import)."""
    module, _, qualname = name.partition(":")
    if not module.startswith("asyncfl."):
        raise StateError(f"{where}: a checkpoint may only name asyncfl classes, not {name!r}")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _capture_torch(value: Any, where: str) -> dict | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(value, torch.Tensor):
        return {KIND: "torch-tensor", "array": value.detach().cpu().numpy().copy()}
    if isinstance(value, torch.nn.Module):
        return {KIND: "torch-module", "state": {k: v.detach().cpu().numpy().copy() for k, v in value.state_dict().items()}}
    if isinstance(value, torch.optim.Optimizer):
        return {KIND: "torch-optimizer", "state": capture(value.state_dict(), where)}
    if isinstance(value, torch.Generator):
        return {KIND: "torch-generator", "state": value.get_state().numpy().copy()}
    return None


def _restore_torch(current: Any, saved: dict, where: str) -> Any:
    import torch

    kind = saved[KIND]
    if kind == "torch-tensor":
        return torch.from_numpy(saved["array"].copy())
    if kind == "torch-generator":
        generator = current if isinstance(current, torch.Generator) else torch.Generator()
        generator.set_state(torch.from_numpy(saved["state"].copy()))
        return generator
    if current is None:
        raise StateError(f"{where}: a saved {kind[6:]} needs a live one to load into")
    if kind == "torch-module":
        own = current.state_dict()
        if list(own) != list(saved["state"]) or any(tuple(own[k].shape) != saved["state"][k].shape for k in own):
            raise StateError(f"{where}: the saved network's layout differs from the live one "
                             f"({len(saved['state'])} vs {len(own)} tensors)")
        current.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in saved["state"].items()})
        return current
    if kind == "torch-optimizer":  # its moments were captured as tensors and come back as tensors
        current.load_state_dict(restore(None, saved["state"], where))
        return current
    raise StateError(f"{where}: unknown saved kind {kind!r}")
