"""The built-in app's strategy names: run-config ``strategy`` -> class.

Names map to ``module:Class`` strings and a class is imported only when asked for,
so the run-config can name-check ``strategy`` (and a ClientApp can parse the shared
keys) without loading the server-side methods and their torch models.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from asyncfl.strategies.base import Strategy

STRATEGY_CLASSES: dict[str, str] = {
    "fedavg": "asyncfl.strategies.fedavg:FedAvg",
    "fedasync": "asyncfl.strategies.fedasync:FedAsync",
    "fedbuff": "asyncfl.strategies.fedbuff:FedBuff",
    "afl-dw": "asyncfl.strategies.afl_dw:AFLDW",
    "ca2fl": "asyncfl.strategies.ca2fl:CA2FL",
    "fadas": "asyncfl.strategies.fadas:FADAS",
    "fedfa": "asyncfl.strategies.fedfa:FedFa",
    "fedadt": "asyncfl.strategies.fedadt:FedADT",
    "fedecho": "asyncfl.strategies.fedecho:FedEcho",
    "fedrevive": "asyncfl.strategies.fedrevive:FedRevive",
    "dd-fedrevive": "asyncfl.strategies.fedrevive:DDFedRevive",
    "stale-weighted": "asyncfl.strategies.stale_compensation:StaleWeighted",
    "dc-asgd": "asyncfl.strategies.stale_compensation:DCASGD",
    "w-pred": "asyncfl.strategies.stale_compensation:WPred",
    "asyn-tiers": "asyncfl.strategies.stale_compensation:AsynTiers",
    "gi-compensation": "asyncfl.strategies.gi.strategy:GICompensation",
}


def class_modules() -> dict[str, str]:
    """``{class name: module}`` of every registered class: what ``asyncfl`` and ``asyncfl.strategies``
    export, derived from :data:`STRATEGY_CLASSES` so a method is registered in one place."""
    return {spec.partition(":")[2]: spec.partition(":")[0] for spec in STRATEGY_CLASSES.values()}


def strategy_class(name: str) -> type["Strategy"]:
    """The class registered as ``name``.

    Raises
    ------
    ConfigError
        For a name that is not registered, listing the valid ones (a ``ValueError``, as the
        run-config parser raises for the same mistake).
    """
    if name not in STRATEGY_CLASSES:
        raise ConfigError(f"strategy={name!r} is not valid; choose one of: {', '.join(STRATEGY_CLASSES)}")
    module, _, attribute = STRATEGY_CLASSES[name].partition(":")
    return getattr(import_module(module), attribute)
