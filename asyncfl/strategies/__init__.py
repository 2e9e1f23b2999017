"""Server-side methods: pure math over flat parameter vectors, no Grid."""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from asyncfl.data.holdout import stratified_rows
from asyncfl.data.unlabeled import distillation_inputs
from asyncfl.strategies.afl_dw import AFLDW
from asyncfl.strategies.base import Arrival, Strategy
from asyncfl.strategies.ca2fl import CA2FL
from asyncfl.strategies.fadas import FADAS
from asyncfl.strategies.fedasync import FedAsync
from asyncfl.strategies.fedavg import FedAvg
from asyncfl.strategies.fedadt import FedADT, ServerSet
from asyncfl.strategies.fedbuff import FedBuff
from asyncfl.strategies.fedecho import FedEcho
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
    """What server-side methods with a live network need: a model builder and the training split.

    ``data_dir`` and ``server_holdout`` locate FedEcho's unlabeled set.
    """

    make_model: Callable
    x_train: np.ndarray
    y_train: np.ndarray
    seed: int
    data_dir: str = ""
    server_holdout: float = 0.0


def server_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """FedADT's labeled server set: a seeded, class-stratified ``fraction`` of the training rows."""
    return stratified_rows(labels, fraction, seed, salt=5)


def build_strategy(name: str, params: dict, resources: StrategyResources | None = None) -> Strategy:
    """Instantiate strategy ``name`` with its parsed ``params``.

    Methods that distil on the server (``fedadt``, ``fedecho``) also need ``resources``.
    """
    if name in ("fedadt", "fedecho") and resources is None:
        raise ValueError(f"strategy {name!r} needs server resources (a model builder and the training split)")
    if name == "fedecho":
        params = dict(params)
        unlabeled = distillation_inputs(params["distill_set"], resources.x_train, resources.y_train,
                                        params["distill_size"], resources.seed, data_dir=resources.data_dir,
                                        holdout_fraction=resources.server_holdout)
        return FedEcho(resources.make_model, unlabeled, seed=resources.seed, **params)
    if name == "fedadt":
        params = dict(params)
        rows = server_rows(resources.y_train, params.pop("server_fraction"), resources.seed)
        server_set = ServerSet(resources.x_train[rows], resources.y_train[rows])
        return FedADT(resources.make_model, server_set, seed=resources.seed, **params)
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(list(_REGISTRY) + ['fedadt', 'fedecho'])}")
    return _REGISTRY[name](**params)


__all__ = [
    "AFLDW", "CA2FL", "FADAS", "Arrival", "FedADT", "FedAsync", "FedAvg", "FedBuff", "FedEcho", "FedFa", "Strategy",
    "StrategyResources", "build_strategy", "server_rows",
]
