"""Server-side methods: pure math over flat parameter vectors, no Grid."""

from asyncfl.strategies.afl_dw import AFLDW
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.fedasync import FedAsync
from asyncfl.strategies.fedavg import FedAvg
from asyncfl.strategies.fedbuff import FedBuff

_REGISTRY = {"fedavg": FedAvg, "fedasync": FedAsync, "fedbuff": FedBuff, "afl-dw": AFLDW}


def build_strategy(name: str, params: dict) -> Strategy:
    """Instantiate strategy ``name`` with its parsed ``params``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name](**params)


__all__ = ["AFLDW", "Arrival", "FedAsync", "FedAvg", "FedBuff", "Strategy", "build_strategy"]
