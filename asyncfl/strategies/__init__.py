"""Server-side methods: pure math over flat parameter vectors, no Grid.

Each method is a module with its class and its config dataclass
(:class:`asyncfl.strategies.settings.StrategyConfig`); :mod:`asyncfl.strategies.registry`
maps the built-in app's run-config names to the classes. Names below are imported on
first use, so importing a submodule (the registry, the settings) loads no other method.
"""

from importlib import import_module

from asyncfl.strategies.registry import class_modules

_EXPORTS = {
    "Arrival": "asyncfl.strategies.base", "Strategy": "asyncfl.strategies.base",
    "StrategyConfig": "asyncfl.strategies.settings", "ConfigError": "asyncfl.errors",
    "StrategyResources": "asyncfl.strategies.resources", "strategy_class": "asyncfl.strategies.registry",
    **class_modules(),  # every method, from the one registry
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'asyncfl.strategies' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
