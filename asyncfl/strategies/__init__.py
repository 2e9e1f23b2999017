"""Server-side methods: pure math over flat parameter vectors, no Grid."""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from asyncfl.data.holdout import holdout_rows, stratified_rows
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
from asyncfl.strategies.fedrevive import FedRevive, ReviveConfig
from asyncfl.strategies.gi import GICompensation, LocalProgram
from asyncfl.strategies.stale_compensation import DCASGD, AsynTiers, StaleWeighted, WPred
from asyncfl.strategies.revive.synthesis import SynthesisConfig

_REGISTRY = {
    "fedavg": FedAvg,
    "fedasync": FedAsync,
    "fedbuff": FedBuff,
    "afl-dw": AFLDW,
    "ca2fl": CA2FL,
    "fadas": FADAS,
    "fedfa": FedFa,
    "stale-weighted": StaleWeighted,
    "dc-asgd": DCASGD,
    "w-pred": WPred,
    "asyn-tiers": AsynTiers,
}
NEEDS_RESOURCES = ("fedadt", "fedecho", "fedrevive", "dd-fedrevive", "gi-compensation")


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
    num_classes: int = 10
    label_histogram: Callable[[int, int], np.ndarray] | None = None  # (partition id, partitions) -> counts
    train_config: dict | None = None  # the clients' local-training keys (gi-compensation replays them)


def server_rows(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """FedADT's labeled server set: a seeded, class-stratified ``fraction`` of the training rows."""
    return stratified_rows(labels, fraction, seed, salt=5)


def _build_fedrevive(name: str, params: dict, resources: StrategyResources, **flower_options) -> FedRevive:
    synthesis = SynthesisConfig(
        batch_size=params.pop("synth_batch_size"), steps=params.pop("synth_steps"),
        generator_lr=params.pop("generator_lr"), latent_lr=params.pop("latent_lr"),
        alpha_target=params.pop("alpha_target"), alpha_feature=params.pop("alpha_feature"),
        alpha_adv=params.pop("alpha_adv"), meta_lambda=params.pop("meta_lambda"),
    )
    use_true = params.pop("proportions") == "true" or name == "dd-fedrevive"
    if use_true and resources.label_histogram is None:
        raise ValueError(f"{name} with true label proportions needs the clients' label histograms (simulation only)")
    holdout = None
    if name == "dd-fedrevive":
        rows = holdout_rows(resources.y_train, resources.server_holdout, resources.seed)
        holdout = (resources.x_train[rows], resources.y_train[rows])
    return FedRevive(resources.make_model, resources.num_classes, tuple(resources.x_train.shape[1:]),
                     ReviveConfig(synthesis=synthesis, **params), seed=resources.seed, holdout=holdout,
                     true_proportions=resources.label_histogram if use_true else None, **flower_options)


def build_strategy(name: str, params: dict, resources: StrategyResources | None = None,
                   **flower_options) -> Strategy:
    """Instantiate strategy ``name`` with its parsed ``params`` (and Flower's ``FedAvg`` options, if any).

    Methods that distil on the server (``fedadt``, ``fedecho``, ``fedrevive``, ``dd-fedrevive``) also need
    ``resources``.
    """
    if name in NEEDS_RESOURCES and resources is None:
        raise ValueError(f"strategy {name!r} needs server resources (a model builder and the training split)")
    if name in ("fedrevive", "dd-fedrevive"):
        return _build_fedrevive(name, dict(params), resources, **flower_options)
    if name == "gi-compensation":
        if resources.train_config is None:
            raise ValueError("gi-compensation needs the clients' local-training config to replay it")
        return GICompensation(resources.make_model, tuple(resources.x_train.shape[1:]), resources.num_classes,
                              LocalProgram.from_message_config(resources.train_config), seed=resources.seed, **params,
                              **flower_options)
    if name == "fedecho":
        params = dict(params)
        unlabeled = distillation_inputs(params["distill_set"], resources.x_train, resources.y_train,
                                        params["distill_size"], resources.seed, data_dir=resources.data_dir,
                                        holdout_fraction=resources.server_holdout)
        return FedEcho(resources.make_model, unlabeled, seed=resources.seed, **params, **flower_options)
    if name == "fedadt":
        params = dict(params)
        rows = server_rows(resources.y_train, params.pop("server_fraction"), resources.seed)
        server_set = ServerSet(resources.x_train[rows], resources.y_train[rows])
        return FedADT(resources.make_model, server_set, seed=resources.seed, **params, **flower_options)
    if name not in _REGISTRY:
        valid = list(_REGISTRY) + [n for n in NEEDS_RESOURCES if n not in _REGISTRY]
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(valid)}")
    return _REGISTRY[name](**params, **flower_options)


__all__ = [
    "AFLDW", "CA2FL", "DCASGD", "FADAS", "AsynTiers", "GICompensation", "StaleWeighted", "WPred", "Arrival", "FedADT", "FedAsync", "FedAvg", "FedBuff", "FedEcho", "FedFa", "FedRevive", "Strategy",
    "StrategyResources", "build_strategy", "server_rows",
]
