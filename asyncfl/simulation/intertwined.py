"""Intertwined data and device heterogeneity (gradient-inversion paper, Sec. 4.1).

One class is chosen, and the ``delayed_clients`` clients holding the most
samples of it are late by ``staleness`` rounds; every other client is on time.
With rounds of one virtual unit (``round-deadline = 1``), an on-time job lasts
``on_time`` (<= 1) and a delayed job ``staleness + 0.5``, so it lands in the
middle of the round ``staleness`` rounds after its dispatch and is aggregated
there with ``tau = staleness``. The sampler needs each client's label counts,
which the engine asks the clients for only when this model is in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncfl.errors import ConfigError, MissingClientInfo


@dataclass(frozen=True)
class IntertwinedDelays:
    """Which clients are late, and by how much.

    Parameters
    ----------
    affected_class : int
        The class whose biggest holders are delayed (the paper uses 5 on MNIST).
    delayed_clients : int
        How many clients are delayed (the paper: the top 10).
    staleness : int
        Rounds of delay (the paper: 10, 40, 100).
    on_time : float
        Duration of an on-time job, in round units (0 < on_time <= 1).
    """

    affected_class: int = 5
    delayed_clients: int = 10
    staleness: int = 40
    on_time: float = 1.0

    def __post_init__(self) -> None:
        if self.affected_class < 0:
            raise ConfigError(f"intertwined.class must be >= 0, got {self.affected_class}")
        if self.delayed_clients < 0:
            raise ConfigError(f"intertwined.clients must be >= 0, got {self.delayed_clients}")
        if self.staleness < 1:
            raise ConfigError(f"intertwined.staleness must be >= 1 round, got {self.staleness}")
        if not 0.0 < self.on_time <= 1.0:
            raise ConfigError(f"intertwined.on-time must be in (0, 1] (a round is 1 unit), got {self.on_time}")

    @property
    def delayed_duration(self) -> float:
        """A delayed job's duration: it arrives mid-round, ``staleness`` rounds after dispatch."""
        return self.staleness + 0.5


def most_holding(label_counts: np.ndarray, label: int, count: int) -> np.ndarray:
    """Indices of the ``count`` clients with the most samples of ``label`` (ties: lower index first)."""
    label_counts = np.asarray(label_counts)
    if label_counts.ndim != 2 or label >= label_counts.shape[1]:
        raise ValueError(f"need a (clients, classes) label-count table with class {label}; got shape {label_counts.shape}")
    order = np.lexsort((np.arange(len(label_counts)), -label_counts[:, label]))
    return np.sort(order[:count])


class IntertwinedSampler:
    """Deterministic durations: ``on_time`` for most clients, ``staleness + 0.5`` for the delayed ones."""

    state_attributes = ()  # durations follow from the bound clients alone
    needs_label_counts = True

    def __init__(self, spec: IntertwinedDelays, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.delayed: np.ndarray | None = None

    def bind_clients(self, sizes: list[int], label_counts: list[list[int]] | None = None) -> None:
        """Pick the delayed clients from every client's label counts (client order)."""
        if label_counts is None or any(c is None for c in label_counts):
            raise MissingClientInfo("delay-model 'intertwined' needs every client's label counts; a client did not report "
                               "them (is it running the asyncfl ClientApp?)")
        self.delayed = most_holding(np.asarray(label_counts), self.spec.affected_class, self.spec.delayed_clients)

    def job_duration(self, client: int) -> float:
        if self.delayed is None:
            raise RuntimeError("IntertwinedSampler.bind_clients must run before the first job")
        return self.spec.delayed_duration if client in self.delayed else self.spec.on_time

    def counts(self) -> dict[str, int | list[int]]:
        """For the summary: the delayed clients (client indices) and how many are on time."""
        if self.delayed is None:
            return {}
        return {"delayed": [int(c) for c in self.delayed], "affected-class": self.spec.affected_class,
                "staleness-rounds": self.spec.staleness}
