"""Flower's ``aggregate_train`` under ``start()``: a method's aggregation step handed to the user's override.

A Flower user who subclasses FedBuff (or the synchronous FedAvg preset) and overrides
``aggregate_train(server_round, replies) -> (ArrayRecord | None, MetricRecord | None)`` has it
called at each of the method's aggregations: FedBuff's buffer step (its ``buffer_size`` updates),
FedAvg's round end (the round's updates). ``replies`` are Flower train replies made from the
updates as the engine accepted them, i.e. after the update-norm bound clipped them, so an override
never aggregates a reply the bound would have cut: ``"arrays"`` holds the client's trained model,
``"metrics"`` its example count (under ``weighted_by_key``) and ``train-loss``, and
``metadata.src_node_id`` is the client's node. ``super().aggregate_train(server_round, replies)``
returns the method's own step over the replies it is given (over all of them: exactly the step the
method makes without the override). The arrays returned become the next server version (``None``:
FedBuff makes no version of this buffer; FedAvg keeps the model, as Flower's rounds do). The metrics
returned are not used: ``train_metrics_clientapp`` aggregates every accepted reply per round with
``train_metrics_aggr_fn``. Methods that make a model from each update alone (FedAsync, ...) have no
such step: :func:`check_overrides` refuses the override before a run starts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Message, MetricRecord

    from asyncfl.strategies.arrival import Arrival
    from asyncfl.strategies.base import Strategy

#: A method's own step over the arrivals at the given positions of the step's list (None: no new model).
OwnStep = Callable[[list[int]], "np.ndarray | None"]


class TrainHook:
    """Calls a strategy's ``aggregate_train`` override at its aggregation step (module docstring).

    Parameters
    ----------
    codec : ModelCodec
        The model's layout: flat vectors to ArrayRecords and back.
    keys : MessageKeys
        The record keys of replies (``arrays``, the example count).
    round_of_step : callable
        ``() -> int``: the round in progress at the step (Flower's ``server_round``).
    node_of : callable
        ``client index -> node id``.
    """

    def __init__(self, codec, keys, round_of_step: Callable[[], int], node_of: Callable[[int], int]) -> None:
        self.codec = codec
        self.keys = keys
        self.round_of_step = round_of_step
        self.node_of = node_of
        self._open: tuple[dict[int, int], OwnStep] | None = None
        self._own: tuple[np.ndarray, np.ndarray] | None = None  # the own step's model, and as its record decodes

    def step(self, strategy: "Strategy", arrivals: list["Arrival"], own: OwnStep) -> np.ndarray | None:
        """``strategy.aggregate_train(round, replies of arrivals)``'s model, flat (None: it returned no arrays).

        ``own`` is the method's step, which ``super().aggregate_train`` runs (:meth:`own_step`).
        """
        replies = [self._reply(arrival) for arrival in arrivals]
        self._open, self._own = ({id(reply): i for i, reply in enumerate(replies)}, own), None
        try:
            arrays, _ = strategy.aggregate_train(self.round_of_step(), replies)
        finally:
            self._open = None
        return None if arrays is None else self._flat(arrays, type(strategy).__name__)

    def own_step(self, strategy: "Strategy", replies) -> tuple["ArrayRecord | None", "MetricRecord | None"]:
        """What the base ``aggregate_train`` returns inside :meth:`step`: the method's step over ``replies``
        (some or all of the step's), and their train metrics aggregated as Flower's."""
        from asyncfl.server_app.client_metrics import aggregate_replies

        name = type(strategy).__name__
        if self._open is None:
            raise RuntimeError(f"{name}.aggregate_train is called by start() at the method's aggregation step, "
                               "with that step's replies; it cannot be called from elsewhere during a run")
        positions, own = self._open
        replies = list(replies)
        try:
            chosen = [positions[id(reply)] for reply in replies]
        except KeyError:
            raise ValueError(f"super().aggregate_train in {name}.aggregate_train aggregates the replies it was "
                             "handed (all or some of them), not new ones") from None
        new = own(chosen) if chosen else None
        flower = strategy.flower
        metrics = aggregate_replies([reply.content for reply in replies], flower.weighted_by_key,
                                    flower.train_metrics_aggr_fn, "train")
        if new is None:
            return None, metrics
        record = self.codec.to_record(new)
        self._own = (new, self.codec.decode(record))
        return record, metrics

    def _reply(self, arrival: "Arrival") -> "Message":
        """A Flower train reply from the client's node holding the update as accepted."""
        from flwr.app import Message, MetricRecord, RecordDict
        from flwr.common import MessageType

        metrics = {self.keys.weight: arrival.num_examples}
        if math.isfinite(arrival.train_loss):
            metrics["train-loss"] = arrival.train_loss
        content = RecordDict({self.keys.arrays: self.codec.to_record(arrival.weights),
                              "metrics": MetricRecord(metrics)})
        request = Message(RecordDict(), dst_node_id=int(self.node_of(arrival.client_index)),
                          message_type=MessageType.TRAIN)
        return Message(content, reply_to=request)

    def _flat(self, arrays: "ArrayRecord", name: str) -> np.ndarray:
        """The returned arrays as the flat model: the own step's exact vector when they are its arrays unchanged
        (a record rounds integer entries such as BatchNorm's counter), else decoded and checked."""
        from asyncfl.server_app.codec import MalformedUpdate

        try:
            flat = self.codec.decode(arrays)
        except MalformedUpdate as exc:
            raise ValueError(f"{name}.aggregate_train returned arrays that do not fit the model: {exc}") from exc
        if self._own is not None and np.array_equal(flat, self._own[1]):
            return self._own[0]
        return flat


def check_overrides(strategy: "Strategy") -> None:
    """Refuse, before a run starts, a Flower hook override that ``start()`` would never call.

    Raises
    ------
    ConfigError
        Naming the class, the override and what to override instead.
    """
    name = type(strategy).__name__
    if strategy.overrides("aggregate_train") and not strategy.honours_aggregate_train:
        raise ConfigError(
            f"{name} overrides aggregate_train, which start() cannot call: {name} makes a new model from each "
            "update as it arrives, with no round of replies to aggregate. Override on_arrival(arrival, current) "
            "for your own aggregation (docs/library.md, 'Write your own asynchronous strategy'), or subclass "
            "FedBuff, whose buffer step calls aggregate_train; to log or save models, pass callbacks=")
    if not strategy.flower.evaluates_on_clients:
        for hook in ("configure_evaluate", "aggregate_evaluate"):
            if strategy.overrides(hook):
                raise ConfigError(f"{name} overrides {hook}, but fraction_evaluate=0 turns federated evaluation "
                                  f"off, so it would never be called: give {name} fraction_evaluate > 0 (the DP "
                                  "wrapper's own, when wrapped), or leave the override out")
