"""The strategy interface: react to one client arrival, never touch Grid or clocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Arrival:
    """One accepted client reply, as the engine hands it to a strategy.

    Parameters
    ----------
    client_index : int
        The client's stable index (its ``partition-id`` when known).
    base_version : int
        Server model version the job was dispatched with.
    staleness : int
        ``tau = current server version - base_version``.
    weights : np.ndarray
        The client's trained model, flattened to float32.
    base : np.ndarray
        The global model of ``base_version``, flattened (read-only).
    num_examples : int
        Examples the client trained on, as it reported.
    train_loss : float
        The client's reported training loss.
    time : float
        Clock time (virtual or wall) at which the reply was accepted.
    """

    client_index: int
    base_version: int
    staleness: int
    weights: np.ndarray
    base: np.ndarray
    num_examples: int
    train_loss: float
    time: float

    @cached_property
    def delta(self) -> np.ndarray:
        """The client's update ``Delta = weights - base`` (computed once, on demand)."""
        return self.weights - self.base


class Strategy(ABC):
    """A server-side method: turns arrivals into new global models.

    Subclasses implement :meth:`on_arrival`. The engine owns the global model;
    a strategy returns a new flat vector when it wants the server version to
    advance, or ``None`` to keep the current one.
    """

    #: When True the engine runs synchronous rounds: it dispatches a full cohort
    #: only when no job is in flight and calls :meth:`on_round_end` after the last
    #: reply of the round (accepted or lost).
    synchronous: bool = False

    def on_start(self, num_clients: int) -> None:
        """Called once by the engine, after client discovery, before the first dispatch."""

    @abstractmethod
    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        """React to one accepted arrival; return the new global model or ``None``."""

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        """The model to send ``client`` instead of the current global one (``None``: the global model).

        The arrival's ``base`` is then the model that was sent. Used by W-Pred's look-ahead.
        """
        return None

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        """Called by the engine when a synchronous round has no job left in flight."""
        return None

    def summary(self) -> dict[str, float | int | str]:
        """Strategy-specific figures for ``summary.json``."""
        return {}
