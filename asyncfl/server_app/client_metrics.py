"""The ClientApps' train metrics, aggregated per round as Flower aggregates them.

Flower's ``Result.train_metrics_clientapp[r]`` is the weighted average of round ``r``'s
train replies. Asynchronously, round ``r``'s replies are those accepted since round ``r - 1``
closed (a round is ``cohort`` accepted updates, or one server version for synchronous
strategies; see :meth:`asyncfl.strategies.base.Strategy.start`); they are aggregated with the
strategy's ``train_metrics_aggr_fn`` (default Flower's ``aggregate_metricrecords``) when ``r`` closes.
Only the metric records are kept, never the arrays: memory is one buffer's worth of scalars.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from asyncfl.strategies.flower_options import MetricsAggregation

if TYPE_CHECKING:
    from asyncfl.callbacks import Callback

log = logging.getLogger("asyncfl.metrics")


def aggregate_replies(replies: list[RecordDict], weight_key: str, aggregate: MetricsAggregation | None,
                      what: str) -> MetricRecord | None:
    """``aggregate(replies, weight_key)``; ``None`` (with a warning) when a reply lacks the weight or it fails.

    Flower's default aggregation divides by the summed weights: replies without ``weight_key``
    (or all weights 0) cannot be averaged, so they are reported rather than crashing the run.
    """
    if not replies:
        return None
    if aggregate is None:
        missing = sum(weight_key not in next(iter(r.metric_records.values()), {}) for r in replies)
        if missing:
            log.warning("%s metrics not aggregated: %d of %d replies lack %r (weighted_by_key)", what, missing,
                        len(replies), weight_key)
            return None
        aggregate = aggregate_metricrecords
    try:
        return aggregate(replies, weight_key)
    except Exception as exc:  # noqa: BLE001 - the metrics come from participants: a report lost, never the run
        log.warning("%s metrics not aggregated: %s: %s", what, type(exc).__name__, str(exc)[:300])
        return None


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
