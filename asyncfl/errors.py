"""asyncfl's exceptions: one class per kind of mistake, the same class wherever it is made.

- :class:`ConfigError` (a ``ValueError``): a setting is invalid, raised before any work starts.
- :class:`RejectedReply` (a ``ValueError``): a participant's reply that is not aggregated; the engine counts it by
  ``reason`` and the run goes on.
- :class:`RunFailed` and its subclasses: why a run stopped early, typed so that a caller can catch them one by one.

A :class:`RunFailed` is a ``RuntimeError`` (code that caught those keeps working) and a Flower
``AppExitException``, so a ServerApp that lets one escape exits with Flower's ServerApp
exit code and the message, as Flower's own ``flwr.serverapp.exception`` errors do.
"""

from __future__ import annotations

from flwr.app.exception import AppExitException
from flwr.supercore.exit import ExitCode

__all__ = ["CheckpointError", "ClientAppsFailing", "ConfigError", "MissingClientInfo", "NoNodesConnected",
           "NothingToDispatch", "RejectedReply", "RunFailed", "StateError", "TooFewPeers"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which, where it came from and what is valid."""


class RejectedReply(ValueError):
    """A participant's reply that must not be aggregated; ``reason`` is its ``summary.json`` tally key (e.g.
    ``wrong-shape``, ``non-finite``, ``update-norm``), ``expired`` whether the job ran out of time (Flower dropped
    it) rather than failed. Returned or raised on the reply path, never past the engine: the run goes on."""

    def __init__(self, reason: str, detail: str, expired: bool = False) -> None:
        super().__init__(detail)
        self.reason = reason
        self.expired = expired


class RunFailed(RuntimeError, AppExitException):
    """The run cannot go on; the message says what was seen and what to check."""

    exit_code = ExitCode.SERVERAPP_EXCEPTION


class NoNodesConnected(RunFailed):
    """No SuperNode connected within the wait (``wait_for_nodes`` / ``timeout``)."""


class NothingToDispatch(RunFailed):
    """Nodes are connected but no job could be sent (none idle and online)."""


class ClientAppsFailing(RunFailed):
    """Every one of many consecutive jobs failed or timed out: a broken ClientApp, not bad luck."""


class TooFewPeers(RunFailed):
    """A gossip method needs at least two peers."""


class MissingClientInfo(RunFailed):
    """A setting needs something every client must report (e.g. label counts) and one did not."""


class CheckpointError(ConfigError):
    """A checkpoint cannot be written or resumed from: missing, damaged, or made by another strategy, model
    layout or incompatible settings (the message says what differs). Raised before anything is overwritten."""


class StateError(CheckpointError):
    """A value cannot be captured, or a saved tree does not fit the live object."""
