"""Where a server-side method runs its networks: the CPU (default) or a CUDA GPU.

FedRevive's server trains a generator and distils eight teachers into a student at every
arrival, FedEcho's runs every arriving model over its unlabeled set and distils at every
aggregation; on a CPU core that is up to seconds per arrival, on a GPU a fraction of it. The engine's
global model stays a numpy vector either way: a method copies it onto its device to work
and hands a numpy vector back, so the choice changes the method's speed and, through
floating-point order on the GPU, the last bits of its numbers, nothing else.
"""

from __future__ import annotations

import torch

from asyncfl.errors import ConfigError

#: The run-config values of a ``server-device`` knob.
SERVER_DEVICES = ("cpu", "cuda")


def device_problem(name: str) -> str | None:
    """Why ``name`` cannot be used on this machine, or ``None`` when it can."""
    if name == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU and torch sees none on this machine (torch.cuda.is_available() is False); use 'cpu'"
    return None


def torch_device(name: str) -> torch.device:
    """The torch device for ``name`` (one of :data:`SERVER_DEVICES`); raises ``ConfigError`` when unusable."""
    if name not in SERVER_DEVICES:
        raise ConfigError(f"server device {name!r} is not valid; choose one of: {', '.join(SERVER_DEVICES)}")
    problem = device_problem(name)
    if problem:
        raise ConfigError(f"server device {name!r} {problem}")
    return torch.device(name)
