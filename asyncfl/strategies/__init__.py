"""Server-side methods: pure math over flat parameter vectors, no Grid."""

from asyncfl.strategies.afl_dw import AFLDW
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.ca2fl import CA2FL
from asyncfl.strategies.fadas import FADAS
from asyncfl.strategies.fedasync import FedAsync
from asyncfl.strategies.fedavg import FedAvg
from asyncfl.strategies.fedbuff import FedBuff
from asyncfl.strategies.fedfa import FedFa

_REGISTRY = {
    "fedavg": FedAvg,
    "fedasync": FedAsync,
    "fedbuff": FedBuff,
    "afl-dw": AFLDW,
    "ca2fl": CA2FL,
    "fadas": FADAS,
    "fedfa": FedFa,
}


def build_strategy(name: str, params: dict) -> Strategy:
    """Instantiate strategy ``name`` with its parsed ``params``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name](**params)


__all__ = ["AFLDW", "CA2FL", "FADAS", "Arrival", "FedAsync", "FedAvg", "FedBuff", "FedFa", "Strategy", "build_strategy"]
