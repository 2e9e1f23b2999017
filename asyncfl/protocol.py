"""The wire between asyncfl's server side and ClientApps: record keys and the job-seed rule.

Both sides import these names, so a key is written once. The keys Flower's own
apps already use (``"arrays"``, ``"config"``, ``"metrics"``, ``"num-examples"``)
stay configurable on the strategy (:class:`asyncfl.strategies.flower_options.MessageKeys`);
the ones below are asyncfl's additions. A stock Flower ClientApp may ignore all of
them and still trains under every strategy.

This module imports nothing from asyncfl and no torch: the ClientApp and the server
runtime both load it.
"""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord

# ----------------------------------------------------------- train / evaluate requests (server -> client)
#: The server version a job's model is (Flower has no such key; staleness is counted from it).
MODEL_VERSION = "model-version"
#: Flower's round key; under an asynchronous strategy the round of client work the job belongs to.
SERVER_ROUND = "server-round"
#: A seed per job: the client seeds its batch order and dropout with it, so a simulation repeats.
JOB_SEED = "job-seed"
#: The clock time (virtual units or wall seconds) the job starts at; variant data drifts with it.
DISPATCH_TIME = "dispatch-time"
#: Wall clock with emulated delays: how long the job should take (seconds).
EMULATE_SECONDS = "emulate-seconds"

# ------------------------------------------------------------------------- identity query (server -> client)
#: Marks a ``query`` message as asyncfl's identity query.
IDENTIFY = "asyncfl-identify"
#: Set in the identity query when the server needs the node's label counts (label-tied delay models).
WANT_LABEL_COUNTS = "asyncfl-label-counts"

# ---------------------------------------------------------------------- identity reply (client -> server)
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
LABEL_COUNTS = "label-counts"

# -------------------------------------------------------------------------- train reply (client -> server)
#: The training loss a reply reports (asyncfl's ClientApp; Flower's examples write ``train_loss``).
TRAIN_LOSS = "train-loss"
TRAIN_LOSS_ALIASES = (TRAIN_LOSS, "train_loss")
#: Seconds the ClientApp spent on the job (asyncfl's ClientApp; any app with the ``report_train_seconds`` mod): on
#: the wall clock, a round trip minus this is the time the job waited to start (a simulation's worker queue).
TRAIN_SECONDS = "train-seconds"


def train_seconds(metrics) -> float | None:
    """A reply's ``train-seconds`` when its metrics hold a finite number >= 0 there, else ``None``."""
    value = metrics.get(TRAIN_SECONDS) if metrics is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1e9:
        return None  # also an int beyond float's range, which float() would not take
    return float(value)


#: The most of a reply's metrics the server reads: names, a name's characters, numbers in all (a list counts its
#: entries). Metrics are reports; beyond these a node would be storing data on the server (rounds, journal).
METRIC_NAMES, METRIC_NAME_CHARS, METRIC_VALUES = 1000, 200, 10_000


class TrimmedMetrics(MetricRecord):
    """A reply's metrics cut to a report's size (:func:`reply_metrics`)."""


def reply_metrics(content):
    """A reply's ``"metrics"`` MetricRecord, else its only (first) one as Flower reads it, else ``None``; one beyond a
    report's size (:data:`METRIC_NAMES` names, :data:`METRIC_NAME_CHARS` characters in a name, :data:`METRIC_VALUES`
    numbers) as :class:`TrimmedMetrics`: its single numbers first (an example count, a loss), then its lists, in the
    order sent, as far as the bounds go; a name too long left out."""
    records = content.metric_records
    record = records["metrics"] if "metrics" in records else next(iter(records.values()), None)
    if record is None or len(record) <= METRIC_NAMES and sum(
            len(value) if isinstance(value, list) else 1 for value in record.values()) <= METRIC_VALUES and all(
            len(name) <= METRIC_NAME_CHARS for name in record):
        return record
    kept, values = {}, 0
    for lists in (False, True):
        for name, value in record.items():
            size = len(value) if isinstance(value, list) else 1
            if (isinstance(value, list) == lists and len(name) <= METRIC_NAME_CHARS and len(kept) < METRIC_NAMES
                    and values + size <= METRIC_VALUES):
                kept[name], values = value, values + size
    return TrimmedMetrics(kept)


#: A reply's record saying where its ClientApp ran: ``{PROCESS: "host:pid"}``, and ``RAY_NODE: id`` in a Ray worker.
WORKER_RECORD = "asyncfl-worker"
RAY_NODE = "ray-node"
PROCESS = "process"
#: The characters of a worker record's name read (a node's word, not a place to store data).
WORKER_NAME_CHARS = 200


def worker_name(value) -> str | None:
    """A worker record's name as read: a str or an int, its first ``WORKER_NAME_CHARS`` characters, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value)[:WORKER_NAME_CHARS]

# ------------------------------------------------------------------ gossip events (relay <-> peer ClientApps)
#: A peer's accuracy on its local test split after the event.
LOCAL_ACCURACY = "local-acc"
#: How many of the messages the event's request carried the peer refused (they did not fit its model).
REFUSED_MESSAGES = "refused-messages"
#: 1 when the peer's stored model could not be trained within bounds and it restarted (from the model it last trained
#: where its method keeps one, else from the initial model).
RESTARTED = "restarted"

#: Stream tags that keep the engine's and the relay's job seeds apart for the same run seed.
ENGINE_STREAM = 4
RELAY_STREAM = 12


def job_seed(seed: int, stream: int, *counters: int) -> int:
    """The seed of one job: a 63-bit draw from ``SeedSequence([seed, stream, *counters])``.

    Parameters
    ----------
    seed : int
        The run's seed.
    stream : int
        :data:`ENGINE_STREAM` (counter: the job's dispatch number) or :data:`RELAY_STREAM`
        (counters: the peer and its event number).
    *counters : int
        What identifies the job within its stream.

    Returns
    -------
    int
        A non-negative integer below ``2**63`` (a Flower ConfigRecord holds signed 64-bit ints).
    """
    return int(np.random.SeedSequence([seed, stream, *counters]).generate_state(1)[0] >> 1)
