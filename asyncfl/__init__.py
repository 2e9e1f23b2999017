"""asyncfl: asynchronous federated learning on Flower.

Every server-side method is a Flower-style strategy: swap the import in your
``server_app.py`` and keep the rest of your app::

    from asyncfl import FedBuff            # was: from flwr.serverapp.strategy import FedAvg
    result = FedBuff(buffer_size=5).start(grid=grid, initial_arrays=arrays, num_rounds=50)

Names are imported on first use, so a ClientApp process that imports
``asyncfl.client_app`` does not load the server-side methods (and their torch models).
"""

from importlib import import_module
from typing import TYPE_CHECKING

from asyncfl.strategies.registry import class_modules

__version__ = "0.1.0"

_PUBLIC = {
    "Strategy": "asyncfl.strategies.base",
    "Arrival": "asyncfl.strategies.base",
    "AsyncResult": "asyncfl.server_app.launch",
    **class_modules(),  # every method, from the one registry (asyncfl/strategies/registry.py)
    "LocalProgram": "asyncfl.strategies.gi.unrolled",
    "DifferentialPrivacyServerSideFixedClipping": "asyncfl.strategies.privacy",
    "DifferentialPrivacyClientSideFixedClipping": "asyncfl.strategies.privacy",
    "ConfigError": "asyncfl.errors",
    "StateError": "asyncfl.errors",
    "RejectedReply": "asyncfl.errors",
    "RunOptions": "asyncfl.options",
    "Callback": "asyncfl.callbacks",
    "VersionInfo": "asyncfl.callbacks",
    "CheckpointError": "asyncfl.errors",
    "RunFailed": "asyncfl.errors",
    "NoNodesConnected": "asyncfl.errors",
    "NothingToDispatch": "asyncfl.errors",
    "ClientAppsFailing": "asyncfl.errors",
    "TooFewPeers": "asyncfl.errors",
    "MissingClientInfo": "asyncfl.errors",
    "StrategyConfig": "asyncfl.strategies.settings",
    "answer_identity": "asyncfl.client_app.extras",
    "pad_to_emulated_duration": "asyncfl.client_app.extras",
    "report_train_seconds": "asyncfl.client_app.extras",
    "DelayModel": "asyncfl.simulation.delays",
    "ComponentDelay": "asyncfl.simulation.delays",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # what IDEs and type checkers see of the names that are not methods (a test keeps them equal to
    # _PUBLIC less the registry's); the methods are found by the registry only, so that adding one touches its own
    # module and nothing else: import one from its module (asyncfl.strategies.fedbuff) where its type matters
    from asyncfl.strategies.base import Strategy, Arrival
    from asyncfl.server_app.launch import AsyncResult
    from asyncfl.strategies.gi.unrolled import LocalProgram
    from asyncfl.strategies.privacy import (
        DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyServerSideFixedClipping,
    )
    from asyncfl.strategies.settings import StrategyConfig
    from asyncfl.options import RunOptions
    from asyncfl.callbacks import Callback, VersionInfo
    from asyncfl.errors import (
        RunFailed, NoNodesConnected, NothingToDispatch, ClientAppsFailing, TooFewPeers, MissingClientInfo,
        CheckpointError, ConfigError, StateError, RejectedReply,
    )
    from asyncfl.client_app.extras import answer_identity, pad_to_emulated_duration, report_train_seconds
    from asyncfl.simulation.delays import DelayModel, ComponentDelay


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'asyncfl' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
