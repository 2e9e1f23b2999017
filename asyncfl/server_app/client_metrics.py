"""The ClientApps' train metrics, aggregated per round as Flower aggregates them.

Flower's ``Result.train_metrics_clientapp[r]`` is the weighted average of round ``r``'s
train replies. Asynchronously, round ``r``'s replies are those accepted since round ``r - 1``
closed (a round is ``cohort`` accepted updates, or one server version for synchronous
strategies; see :meth:`asyncfl.strategies.base.Strategy.start`); they are aggregated with the
strategy's ``train_metrics_aggr_fn`` (default Flower's ``aggregate_metricrecords``) when ``r`` closes.
Only the metric records are kept, never the arrays: memory is one buffer's worth of scalars.

Federated evaluation
--------------------
Federated evaluation at evaluation points, without stopping the training flow.

Flower's synchronous loop sends an ``evaluate`` message to ``fraction_evaluate`` of
the nodes after every round and waits. Here the engine calls :meth:`dispatch` at each
evaluation point (the end of a round): the model in effect goes to a seeded sample of the
nodes, the replies are collected while training goes on (:meth:`poll`), and once every reply
of a point is in (or lost after ``timeout``) they are aggregated into ``by_round[r]`` with
``evaluate_metrics_aggr_fn``. Which nodes evaluate at which point depends only on
the seed and the client order, so a seeded simulation gives the same metrics every time.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import MessageType
from flwr.common.logger import log as flwr_log
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from asyncfl import protocol
from asyncfl.server_app.codec import RejectedReply, is_undecodable, reported_count
from asyncfl.state import capture, restore
from asyncfl.strategies.flower_options import FlowerOptions, MetricsAggregation, configs_by_node

if TYPE_CHECKING:
    from asyncfl.callbacks import Callback

log = logging.getLogger("asyncfl.metrics")


def aggregate_replies(replies: list[RecordDict], weight_key: str, aggregate: MetricsAggregation | None,
                      what: str) -> MetricRecord | None:
    """``aggregate(replies, weight_key)``; ``None`` (with a warning) when it fails or no reply is left.

    With Flower's default aggregation (``aggregate`` None), a weighted mean over the replies' counts,
    a reply that cannot be averaged is left out with a warning: one without ``weight_key``, or one
    :func:`aggregatable` leaves out; all weights 0 fail (reported, never the run's end). An
    ``aggregate`` of the app's own gets the replies as they are.
    """
    if not replies:
        return None
    if aggregate is None:
        counted = [r for r in replies if weight_key in next(iter(r.metric_records.values()), {})]
        if len(counted) < len(replies):
            log.warning("%s metrics: %d of %d replies left out of the mean: they lack %r (weighted_by_key)", what,
                        len(replies) - len(counted), len(replies), weight_key)
        replies, left_out = aggregatable(counted, weight_key)
        if left_out:
            log.warning("%s metrics: %d reply(ies) left out of the mean: a value not a finite number (or a list of "
                        "them) of the shape most replies send", what, left_out)
        replies, few = common_names(replies, weight_key)
        if few:
            log.warning("%s metrics: %d metric name(s) left out of the mean: fewer than half of the replies send "
                        "them (e.g. %r)", what, len(few), few[0][:60])
        if not replies:
            return None
        aggregate = aggregate_metricrecords
    try:
        record = aggregate(replies, weight_key)
    except Exception as exc:  # noqa: BLE001 - the metrics come from participants: a report lost, never the run
        log.warning("%s metrics not aggregated: %s: %s", what, type(exc).__name__, str(exc)[:300])
        return None
    if aggregate is aggregate_metricrecords:  # finite values near float's largest can sum beyond it
        overflowed = [name for name, value in record.items()
                      if not all(math.isfinite(v) for v in (value if isinstance(value, list) else [value]))]
        for name in overflowed:
            del record[name]
        if overflowed:
            log.warning("%s metrics: the mean of %r left out: beyond float's range", what, overflowed[0][:60])
    return record


def common_names(replies: list[RecordDict], weight_key: str) -> tuple[list[RecordDict], list[str]]:
    """``replies`` without the metric names fewer than half of them send, and those names: Flower's mean weighs a
    value by its reply's share of every reply's count, so a name few send averages low, and one node's own names
    would be kept in every round's metrics (and checkpoint) for the rest of the run."""
    sent = Counter(name for reply in replies for name in next(iter(reply.metric_records.values())))
    few = sorted(name for name, n in sent.items() if 2 * n < len(replies) and name != weight_key)
    if not few:
        return replies, []
    dropped = set(few)
    return [RecordDict({"metrics": MetricRecord({name: value for name, value in
                                                 next(iter(reply.metric_records.values())).items()
                                                 if name not in dropped})}) for reply in replies], few


def aggregatable(replies: list[RecordDict], weight_key: str) -> tuple[list[RecordDict], int]:
    """The replies Flower's weighted mean can take, and how many were left out: those with a value that is not a
    finite number (or a list of them) of the shape most replies send its key in. One participant's NaN, inf, int
    beyond float's range or list of another length would otherwise make the mean NaN or fail, and the round's
    metrics of every participant would be lost; leaving out only the value would bias the mean of its key (Flower's
    mean weighs each value by the reply's share of every reply's count)."""
    shaped = []  # per reply, each key's shape: -1 a finite number, n a list of n of them, None anything else
    for reply in replies:
        shapes = {}
        for key, value in next(iter(reply.metric_records.values())).items():
            items = value if isinstance(value, list) else [value]
            finite = all(isinstance(v, float) and math.isfinite(v) or type(v) is int and abs(v) <= 2**1023
                         for v in items)
            shapes[key] = (len(value) if isinstance(value, list) else -1) if finite else None
        shaped.append(shapes)
    counts: dict[str, Counter] = {}
    for shapes in shaped:
        for key, shape in shapes.items():
            if key != weight_key and shape is not None:
                counts.setdefault(key, Counter())[shape] += 1
    common = {key: c.most_common(1)[0][0] for key, c in counts.items()}
    kept = [reply for reply, shapes in zip(replies, shaped)
            if all(key == weight_key or (key in common and shape == common[key]) for key, shape in shapes.items())]
    return kept, len(replies) - len(kept)


def rounds_state(by_round: dict[int, MetricRecord]) -> list:
    """``{round: MetricRecord}`` as plain values (a checkpoint's part); :func:`rounds_from_state` reverses it."""
    return [[r, dict(m)] for r, m in by_round.items()]


def rounds_from_state(state: list) -> dict[int, MetricRecord]:
    return {int(r): MetricRecord(m) for r, m in state}


class TrainMetrics:
    """Collects accepted train replies' metrics and aggregates them into ``by_round`` as each round closes."""

    def __init__(self, weight_key: str = "num-examples", aggregate: MetricsAggregation | None = None,
                 callbacks: Sequence["Callback"] = ()) -> None:
        self.weight_key = weight_key
        self.aggregate = aggregate
        self.callbacks = list(callbacks)
        self.by_round: dict[int, MetricRecord] = {}
        self._pending: list[RecordDict] = []

    def state_dict(self) -> dict:
        """The rounds aggregated so far and the open round's replies, as plain values (a checkpoint's part)."""
        return {"by_round": rounds_state(self.by_round),
                "pending": [dict(m) for content in self._pending for m in content.metric_records.values()]}

    def load_state_dict(self, state: dict) -> None:
        self.by_round = rounds_from_state(state["by_round"])
        self._pending = [RecordDict({"metrics": MetricRecord(m)}) for m in state["pending"]]

    def add(self, content: RecordDict) -> None:
        """One accepted reply's metrics (a RecordDict holding its MetricRecord)."""
        self._pending.append(content)

    def on_round(self, round_: int) -> None:
        """Round ``round_`` closed with the replies added since the previous one."""
        record = aggregate_replies(self._pending, self.weight_key, self.aggregate, "train")
        if record is not None:
            self.by_round[round_] = record
            for callback in self.callbacks:
                callback.on_train_metrics(round_, dict(record))
        self._pending = []

    def close(self, round_: int) -> None:
        """The run ended inside round ``round_``: the replies of that partial round, if any, aggregated under it
        (a run shorter than one round reports its train metrics under round 1, as Flower's first round)."""
        if self._pending and round_ not in self.by_round:
            self.on_round(round_)


POLL_EVERY_S = 0.05


#: An evaluation reply's weight is capped at this multiple of the point's median weight (one node's claim of 2**62
#: examples would otherwise be the federated metric).
EVALUATE_WEIGHT_MULTIPLE = 3.0


def capped_weights(replies: list[RecordDict], weight_key: str, multiple: float) -> None:
    """Cap each reply's ``weight_key`` at ``multiple`` x the median over ``replies`` (in place), so that no node's
    claimed example count makes a federated metric its own."""
    weights = [m[weight_key] for r in replies for m in r.metric_records.values() if weight_key in m]
    if len(weights) < 3:
        return
    ceiling = multiple * float(statistics.median(weights))
    for reply in replies:
        for record in reply.metric_records.values():
            if weight_key in record and record[weight_key] > ceiling:
                record[weight_key] = int(ceiling)


def read_evaluate_reply(reply: Message, weight_key: str) -> RecordDict | str:
    """A federated-evaluation reply's metrics as they are aggregated (its ``weight_key`` count, when it has one, a whole
    number from 0 to 2**53: :func:`~asyncfl.server_app.codec.reported_count`), or the reason it gives none."""
    if reply.has_error():
        return "undecodable" if is_undecodable(reply) else "error-reply"
    if not reply.content.metric_records:
        return "no-metrics"
    metrics = protocol.reply_metrics(reply.content)
    count = reported_count(metrics, weight_key) if weight_key in metrics else None
    if isinstance(count, RejectedReply):
        return count.reason
    if count is not None:
        metrics = MetricRecord({**metrics, weight_key: count})
    return RecordDict({"metrics": metrics})


@dataclass
class _Point:
    """One evaluation point: its messages out, the replies in."""

    sent: float
    pending: set[str]
    replies: list[RecordDict] = field(default_factory=list)


class FederatedEvaluation:
    """Sends the current model to a sample of nodes and aggregates their ``evaluate`` replies per round.

    Parameters
    ----------
    grid : GridLike
        Flower's Grid (``push_messages`` / ``pull_messages``).
    options : FlowerOptions
        ``fraction_evaluate``, ``min_evaluate_nodes``, record keys and the aggregation function.
    evaluate_config : dict
        Sent with every request (``server-round`` and ``model-version`` are added).
    seed : int
        Seeds the node sample of every point.
    timeout : float
        Seconds after which a missing reply counts as lost.
    """

    def __init__(self, grid, options: FlowerOptions, evaluate_config: dict, seed: int, timeout: float,
                 strategy=None, callbacks: Sequence["Callback"] = ()) -> None:
        self.grid = grid
        self.callbacks = list(callbacks)
        self.options = options
        self.strategy = strategy  # its configure_evaluate / aggregate_evaluate (Flower's hooks), when overridden
        # one record for the whole run, as Flower passes it to configure_evaluate every round
        self.evaluate_config = ConfigRecord(dict(evaluate_config))
        self.timeout = timeout
        self._rng = np.random.default_rng([seed, 11])
        self._points: dict[int, _Point] = {}
        self._round_of: dict[str, int] = {}
        self._last_poll = 0.0
        self.by_round: dict[int, MetricRecord] = {}
        self.rejected: dict[str, int] = {}

    def dispatch(self, round_: int, version: int, record: ArrayRecord, nodes: list[int]) -> None:
        """Send the model of server version ``version`` (in effect at the end of round ``round_``) to a seeded
        sample of ``nodes`` (in the engine's client order)."""
        count = self.options.evaluate_nodes(len(nodes))
        if count == 0 or round_ in self._points:
            return
        chosen = sorted(self._rng.choice(len(nodes), size=count, replace=False))
        by_node = self._configs(round_, record)
        default = dict(self.evaluate_config)
        messages = []
        for i in chosen:
            config = ConfigRecord({**by_node.get(nodes[i], default), protocol.SERVER_ROUND: round_,
                                   protocol.MODEL_VERSION: version})
            content = RecordDict({self.options.arrayrecord_key: record, self.options.configrecord_key: config})
            messages.append(Message(content, dst_node_id=nodes[i], message_type=MessageType.EVALUATE, ttl=self.timeout))
        ids = list(self.grid.push_messages(messages))
        self._points[round_] = _Point(time.monotonic(), set(ids))
        self._round_of.update((message_id, round_) for message_id in ids)
        self._count("push-refused", len(messages) - len(ids))
        self._close_finished()

    def _configs(self, round_: int, record: ArrayRecord) -> dict[int, dict]:
        """Node -> evaluate config from the strategy's ``configure_evaluate`` (Flower's hook; the sample of nodes
        stays this class's seeded one), when it overrides it."""
        if self.strategy is None or not self.strategy.overrides("configure_evaluate"):
            return {}
        return configs_by_node(self.strategy.configure_evaluate(round_, record, self.evaluate_config, self.grid),
                               self.options.configrecord_key)

    def poll(self) -> None:
        """Take in replies that arrived (at most every 50 ms) and close points that are complete or timed out."""
        if not self._round_of or time.monotonic() - self._last_poll < POLL_EVERY_S:
            return
        self._last_poll = time.monotonic()
        for reply in self.grid.pull_messages(list(self._round_of)):
            round_ = self._round_of.pop(reply.metadata.reply_to_message_id, None)
            if round_ is None:
                continue
            self._points[round_].pending.discard(reply.metadata.reply_to_message_id)
            content = read_evaluate_reply(reply, self.options.weighted_by_key)
            if isinstance(content, str):
                self._count(content)
            else:
                self._points[round_].replies.append(content)
        self._close_finished()

    def finish(self) -> None:
        """At the end of a run: wait (up to ``timeout``) for the replies still out, then close every point."""
        deadline = time.monotonic() + self.timeout
        while self._round_of and time.monotonic() < deadline:
            self._last_poll = 0.0
            self.poll()
            time.sleep(POLL_EVERY_S)
        for point in self._points.values():
            self._count("lost", len(point.pending))
            point.pending.clear()
        self._round_of.clear()
        self._close_finished(force=True)

    def state_dict(self) -> dict:
        """Aggregated rounds, rejections, the node-sampling stream, and each open point's replies so far."""
        return {"rng": capture(self._rng), "rejected": dict(self.rejected), "config": dict(self.evaluate_config),
                "by_round": rounds_state(self.by_round),
                "open": [[r, len(p.pending), [dict(m) for c in p.replies for m in c.metric_records.values()]]
                         for r, p in self._points.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Take a checkpoint's state; a point that was still waiting then is closed now with the replies it had
        (its requests went to the run that died: counted ``lost-in-restart``)."""
        self._rng = restore(self._rng, state["rng"])
        self.rejected = dict(state["rejected"])
        self.evaluate_config = ConfigRecord(state["config"])
        self.by_round = rounds_from_state(state["by_round"])
        for round_, pending, replies in state["open"]:
            self._count("lost-in-restart", int(pending))
            self._points[int(round_)] = _Point(time.monotonic(), set(),
                                               [RecordDict({"metrics": MetricRecord(m)}) for m in replies])
        self._close_finished(force=True)

    @property
    def outstanding(self) -> int:
        """Evaluate requests still waiting for a reply."""
        return len(self._round_of)

    def _close_finished(self, force: bool = False) -> None:
        now = time.monotonic()
        for round_, point in list(self._points.items()):
            if point.pending and not force and now - point.sent <= self.timeout:
                continue
            for message_id in point.pending:  # timed out
                self._round_of.pop(message_id, None)
            self._count("lost", len(point.pending))
            capped_weights(point.replies, self.options.weighted_by_key, EVALUATE_WEIGHT_MULTIPLE)
            if self.strategy is not None and self.strategy.overrides("aggregate_evaluate"):
                record = self.strategy.aggregate_evaluate(round_, [
                    Message(content, dst_node_id=0, message_type=MessageType.EVALUATE) for content in point.replies])
            else:
                record = aggregate_replies(point.replies, self.options.weighted_by_key,
                                           self.options.evaluate_metrics_aggr_fn, "evaluate")
            if record is not None:
                self.by_round[round_] = record
                flwr_log(logging.INFO, "federated evaluation of round %d on %d node(s): %s", round_,
                         len(point.replies), dict(record))
                for callback in self.callbacks:
                    callback.on_federated_evaluation(round_, dict(record))
            del self._points[round_]

    def _count(self, reason: str, n: int = 1) -> None:
        if n:
            self.rejected[reason] = self.rejected.get(reason, 0) + n
            flwr_log(logging.WARNING, "federated evaluation: %d reply(ies) rejected (%s)", n, reason)
