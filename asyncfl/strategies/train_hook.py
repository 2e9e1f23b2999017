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
method makes without the override), as they hold then: a reply whose ``"arrays"`` (or example count)
the override replaced or changed in place counts with what it holds now, decoded and checked as an
arriving update is (names, shapes, dtypes, finite) and taken as an update against the model its job
was sent (the update-norm bound is not applied again: the override is the server's own code). The
override must return Flower's ``(ArrayRecord | None, MetricRecord | None)``; the arrays returned become
the next server version (``None``: FedBuff makes no version of this buffer; FedAvg keeps the model, as
Flower's rounds do) and go through the engine's checks of every new model (not finite: the run stops
with an error naming the override; negative BatchNorm variances clamped to 0). The metrics returned are
not used: ``train_metrics_clientapp`` aggregates every accepted reply per round with
``train_metrics_aggr_fn``. Methods that make a model from each update alone (FedAsync, ...) have no
such step: :func:`check_overrides` refuses the override before a run starts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from asyncfl import protocol
from asyncfl.errors import ConfigError

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Message, MetricRecord

    from asyncfl.strategies.arrival import Arrival
    from asyncfl.strategies.base import Strategy

#: A method's own step over the step's arrivals at the given positions, each paired with the arrival as its reply
#: holds it now (the arrival itself when unchanged, else a copy with the reply's weights or example count); None:
#: no new model.
OwnStep = Callable[[list[tuple[int, "Arrival"]]], "np.ndarray | None"]


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
        self._open: _Step | None = None
        self._own: tuple[np.ndarray, np.ndarray] | None = None  # the own step's model, and as its record decodes

    def step(self, strategy: "Strategy", arrivals: list["Arrival"], own: OwnStep) -> np.ndarray | None:
        """``strategy.aggregate_train(round, replies of arrivals)``'s model, flat (None: it returned no arrays).

        ``own`` is the method's step, which ``super().aggregate_train`` runs (:meth:`own_step`).
        """
        name = f"{type(strategy).__name__}.aggregate_train"
        replies = [self._reply(arrival) for arrival in arrivals]
        self._open, self._own = _Step(replies, arrivals, own, self.keys), None
        try:
            returned = strategy.aggregate_train(self.round_of_step(), replies)
        finally:
            self._open = None
        arrays = _arrays_returned(returned, name)
        return None if arrays is None else self._flat(arrays, name)

    def own_step(self, strategy: "Strategy", replies) -> tuple["ArrayRecord | None", "MetricRecord | None"]:
        """What the base ``aggregate_train`` returns inside :meth:`step`: the method's step over ``replies``
        (some or all of the step's) as they hold now, and their train metrics aggregated as Flower's."""
        from asyncfl.server_app.client_metrics import aggregate_replies

        name = type(strategy).__name__
        if self._open is None:
            raise RuntimeError(f"{name}.aggregate_train is called by start() at the method's aggregation step, "
                               "with that step's replies; it cannot be called from elsewhere during a run")
        step = self._open
        replies = list(replies)
        try:
            chosen = [step.positions[id(reply)] for reply in replies]
        except KeyError:
            raise ValueError(f"super().aggregate_train in {name}.aggregate_train aggregates the replies it was "
                             "handed (all or some of them), not new ones") from None
        new = step.own([(i, self._as_held_now(step, i, f"{name}.aggregate_train")) for i in chosen]) \
            if chosen else None
        flower = strategy.flower
        metrics = aggregate_replies([reply.content for reply in replies], flower.weighted_by_key,
                                    flower.train_metrics_aggr_fn, "train")
        if new is None:
            return None, metrics
        if not np.isfinite(new).all():  # as the engine refuses any non-finite model: the run stops
            raise FloatingPointError(f"super().aggregate_train in {name}.aggregate_train made a non-finite model "
                                     "(NaN or Inf, or beyond float32's range) from the replies it was given: refused")
        record = self.codec.to_record(new)
        self._own = (new, self.codec.decode(record))
        return record, metrics

    def _as_held_now(self, step: "_Step", i: int, name: str) -> "Arrival":
        """Arrival ``i`` as reply ``i`` holds it now: itself when its arrays and count are as handed out, else a
        copy with the reply's arrays (decoded and checked as an arriving update) and example count."""
        from dataclasses import replace

        from asyncfl.server_app.codec import RejectedReply, reported_count

        arrival, content = step.arrivals[i], step.replies[i].content
        record = content.array_records.get(self.keys.arrays)
        if record is None:
            raise ValueError(f"super().aggregate_train in {name}: reply {i} no longer holds an ArrayRecord "
                             f"{self.keys.arrays!r}; replace its arrays with the model's (same names, shapes, "
                             "dtypes), or return your own ArrayRecord instead of calling super()")
        changes = {}
        if not step.unchanged(i, record):
            try:
                weights = self.codec.decode(record)
            except RejectedReply as exc:
                raise ValueError(f"super().aggregate_train in {name}: reply {i}'s arrays, as changed, do not fit "
                                 f"the model ({exc.reason}: {exc})") from exc
            if not np.array_equal(weights, self.codec.decode(self.codec.to_record(arrival.weights))):
                changes["weights"] = weights
        count = reported_count(protocol.reply_metrics(content), self.keys.weight)
        if isinstance(count, RejectedReply):
            raise ValueError(f"super().aggregate_train in {name}: reply {i}'s example count: {count}")
        if count != arrival.num_examples:
            changes["num_examples"] = count
        return replace(arrival, **changes) if changes else arrival

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
        from asyncfl.errors import RejectedReply

        try:
            flat = self.codec.decode(arrays)
        except RejectedReply as exc:
            if exc.reason == "non-finite":  # as the engine refuses any non-finite model: the run stops
                raise FloatingPointError(f"{name} returned a non-finite model ({exc}): refused") from exc
            raise ValueError(f"{name} returned arrays that do not fit the model ({exc.reason}: {exc})") from exc
        if self._own is not None and np.array_equal(flat, self._own[1]):
            return self._own[0]
        return flat


class _Step:
    """One open aggregation step: its replies, their arrivals, the method's own step, and what each reply's
    arrays record held when handed out (held, so that a replaced array is never mistaken for it by its id)."""

    def __init__(self, replies: list["Message"], arrivals: list["Arrival"], own: OwnStep, keys) -> None:
        self.replies, self.arrivals, self.own = replies, arrivals, own
        self.positions = {id(reply): i for i, reply in enumerate(replies)}
        self._handed = [self._contents(reply.content.array_records[keys.arrays]) for reply in replies]

    @staticmethod
    def _contents(record: "ArrayRecord") -> tuple:
        return (record, [(key, array, array.data, array.dtype, tuple(array.shape)) for key, array in record.items()])

    def unchanged(self, i: int, record: "ArrayRecord") -> bool:
        """Whether ``record`` is reply ``i``'s arrays as handed out: the same record holding the same arrays."""
        (handed, items), (now, now_items) = self._handed[i], self._contents(record)
        return now is handed and len(items) == len(now_items) and all(
            a[0] == b[0] and all(x is y or x == y for x, y in zip(a[1:], b[1:])) for a, b in zip(items, now_items))


def _arrays_returned(returned, name: str) -> "ArrayRecord | None":
    """The arrays of an override's return value: Flower's ``(ArrayRecord | None, MetricRecord | None)``."""
    from flwr.app import ArrayRecord

    what = f"{name} must return Flower's (ArrayRecord | None, MetricRecord | None): the new model's arrays (or None)"
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise TypeError(f"{what} and its train metrics (or None); it returned {_described(returned)}")
    arrays = returned[0]
    if arrays is not None and not isinstance(arrays, ArrayRecord):
        raise TypeError(f"{what}; its first element is {_described(arrays)} (wrap a state dict or a list of numpy "
                        "arrays as ArrayRecord(...))")
    return arrays


def _described(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__module__}.{type(value).__qualname__}"


def check_overrides(strategy: "Strategy") -> None:
    """Refuse, before a run starts, a Flower hook override that ``start()`` would never call.

    Raises
    ------
    ConfigError
        Naming the class, the override and what to override instead.
    """
    name = type(strategy).__name__
    if strategy.overrides("aggregate_train") and not strategy.honours_aggregate_train:
        raise ConfigError(strategy._aggregate_train_refusal())
    if not strategy.flower.evaluates_on_clients:
        for hook in ("configure_evaluate", "aggregate_evaluate"):
            if strategy.overrides(hook):
                raise ConfigError(f"{name} overrides {hook}, but fraction_evaluate=0 turns federated evaluation "
                                  f"off, so it would never be called: give {name} fraction_evaluate > 0 (the DP "
                                  "wrapper's own, when wrapped), or leave the override out")
