"""Server-side methods: pure math over flat parameter vectors, no Grid."""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from asyncfl.strategies.afl_dw import AFLDW
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.ca2fl import CA2FL
from asyncfl.strategies.fadas import FADAS
from asyncfl.strategies.fedasync import FedAsync
from asyncfl.strategies.fedavg import FedAvg
from asyncfl.strategies.fedadt import FedADT, ServerSet
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


@dataclass(frozen=True)
class StrategyResources:
    """What server-side methods with a live network need: a model builder and the training split."""

    make_model: Callable
    x_train: np.ndarray
    y_train: np.ndarray
    seed: int


def server_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A seeded, class-stratified ``fraction`` of the rows (at least one per class present)."""
    rng = np.random.default_rng([seed, 5])
    rows = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rows.append(rng.choice(members, size=max(1, int(round(fraction * len(members)))), replace=False))
    return np.sort(np.concatenate(rows))


def build_strategy(name: str, params: dict, resources: StrategyResources | None = None) -> Strategy:
    """Instantiate strategy ``name`` with its parsed ``params``.

    Methods that distil on the server (``fedadt``) also need ``resources``.
    """
    if name == "fedadt":
        if resources is None:
            raise ValueError("strategy 'fedadt' needs server resources (a model builder and the training split)")
        params = dict(params)
        rows = server_rows(resources.y_train, params.pop("server_fraction"), resources.seed)
        server_set = ServerSet(resources.x_train[rows], resources.y_train[rows])
        return FedADT(resources.make_model, server_set, seed=resources.seed, **params)
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(list(_REGISTRY) + ['fedadt'])}")
    return _REGISTRY[name](**params)


__all__ = [
    "AFLDW", "CA2FL", "FADAS", "Arrival", "FedADT", "FedAsync", "FedAvg", "FedBuff", "FedFa", "Strategy",
    "StrategyResources", "build_strategy", "server_rows",
]
