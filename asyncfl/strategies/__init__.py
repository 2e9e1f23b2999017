"""Server-side methods: pure math over flat parameter vectors, no Grid.

Each method is a module with its class and its config dataclass
(:class:`asyncfl.strategies.settings.StrategyConfig`); :mod:`asyncfl.strategies.registry`
maps the built-in app's run-config names to the classes. Names below are imported on
first use, so importing a submodule (the registry, the settings) loads no other method.
"""

from importlib import import_module

_EXPORTS = {
    "Arrival": "base", "Strategy": "base", "StrategyConfig": "settings", "ConfigError": "settings",
    "StrategyResources": "resources", "strategy_class": "registry",
    "FedAvg": "fedavg", "FedAsync": "fedasync", "FedBuff": "fedbuff", "AFLDW": "afl_dw", "CA2FL": "ca2fl",
    "FADAS": "fadas", "FedFa": "fedfa", "FedADT": "fedadt", "FedEcho": "fedecho", "FedRevive": "fedrevive",
    "DDFedRevive": "fedrevive", "GICompensation": "gi.strategy", "StaleWeighted": "stale_compensation",
    "DCASGD": "stale_compensation", "WPred": "stale_compensation", "AsynTiers": "stale_compensation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'asyncfl.strategies' has no attribute {name!r}")
    value = getattr(import_module(f"asyncfl.strategies.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
