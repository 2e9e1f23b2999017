"""The keyword arguments of Flower's ``FedAvg`` that every asyncfl strategy accepts, and what they mean here.

A Flower app that builds ``FedAvg(fraction_train=..., fraction_evaluate=..., ...)`` keeps
those arguments when it swaps in an asyncfl strategy. In an asynchronous run there are no
rounds, so each one is mapped onto the engine:

* ``fraction_train`` / ``min_train_nodes``: how many jobs are in flight (the concurrency
  ``K``) when ``start(concurrency=None)``: ``max(min_train_nodes, int(fraction_train * nodes))``.
  For the synchronous :class:`~asyncfl.strategies.fedavg.FedAvg` preset that is the cohort
  of every round, as in Flower.
* ``fraction_evaluate`` / ``min_evaluate_nodes``: federated evaluation at each evaluation
  point, on that share of the nodes (0 turns it off).
* ``min_available_nodes``: ``start`` waits for this many connected nodes (up to ``timeout``).
* ``weighted_by_key``: the reply metric read as the client's example count (FedAvg's
  weights, FedEcho's and CA2FL's bookkeeping, metric averages).
* ``arrayrecord_key`` / ``configrecord_key``: record keys of requests and replies.
* ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: ``(list[RecordDict], weighting
  key) -> MetricRecord``, applied to the replies accepted for each server version and to
  each evaluation point's replies (default: Flower's weighted average).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from flwr.app import MetricRecord, RecordDict

from asyncfl.errors import ConfigError

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


@dataclass(frozen=True)
class MessageKeys:
    """Record keys of train/evaluate requests and replies (Flower's defaults)."""

    arrays: str = "arrays"
    config: str = "config"
    weight: str = "num-examples"


@dataclass(frozen=True)
class FlowerOptions:
    """Flower ``FedAvg``'s constructor arguments, validated (see the module docstring for their meaning)."""

    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_train_nodes: int = 2
    min_evaluate_nodes: int = 2
    min_available_nodes: int = 2
    weighted_by_key: str = "num-examples"
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"
    train_metrics_aggr_fn: MetricsAggregation | None = None
    evaluate_metrics_aggr_fn: MetricsAggregation | None = None

    @classmethod
    def for_strategy(cls, strategy: str, keywords: dict) -> "FlowerOptions":
        """The options a strategy's constructor got besides its own knobs; an unknown name lists the valid ones."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(keywords) - set(valid))
        if unknown:
            raise TypeError(f"{strategy}() got unexpected keyword argument(s) {', '.join(unknown)}; "
                            f"besides its own, it accepts Flower's FedAvg options: {', '.join(valid)}")
        return cls(**keywords)

    def __post_init__(self) -> None:
        for name in ("fraction_train", "fraction_evaluate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value!r} must be a number in [0, 1]")
        for name in ("min_train_nodes", "min_evaluate_nodes", "min_available_nodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name}={value!r} must be an integer >= 0")
        if self.fraction_train == 0.0 and self.min_train_nodes == 0:
            raise ConfigError("fraction_train=0 with min_train_nodes=0 would train on no node; an asynchronous "
                             "run needs at least one job in flight")
        for name in ("weighted_by_key", "arrayrecord_key", "configrecord_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name}={value!r} must be a non-empty string")
        for name in ("train_metrics_aggr_fn", "evaluate_metrics_aggr_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"{name} must be a callable (list[RecordDict], str) -> MetricRecord, "
                                 f"got {type(value).__name__}")

    @property
    def keys(self) -> MessageKeys:
        """The record keys these options name."""
        return MessageKeys(self.arrayrecord_key, self.configrecord_key, self.weighted_by_key)

    @property
    def evaluates_on_clients(self) -> bool:
        """Whether federated evaluation runs at all."""
        return self.fraction_evaluate > 0.0

    def train_nodes(self, available: int) -> int:
        """Jobs in flight for ``available`` connected nodes: ``max(min_train_nodes, int(fraction * nodes))``,
        at least 1 and at most ``available``."""
        return max(1, min(available, max(self.min_train_nodes, int(self.fraction_train * available))))

    def evaluate_nodes(self, available: int) -> int:
        """Nodes sampled at an evaluation point (0 when ``fraction_evaluate`` is 0, as in Flower)."""
        if self.fraction_evaluate == 0.0:
            return 0
        return min(available, max(self.min_evaluate_nodes, int(self.fraction_evaluate * available)))


def configs_by_node(messages, config_key: str) -> dict[int, dict]:
    """The config each destination node gets in ``messages`` (what a ``configure_train`` / ``configure_evaluate``
    override returned), the first message per node; a message without a config record gives ``{}``."""
    by_node: dict[int, dict] = {}
    for message in messages or ():
        record = message.content.config_records.get(config_key)
        by_node.setdefault(message.metadata.dst_node_id, dict(record) if record is not None else {})
    return by_node
