"""asyncfl's extras for your own ClientApp, without giving up your train function.

``answer_identity(app)`` registers a ``query`` handler that tells the engine the
node's ``partition-id`` (and, if you say how, its example count): clients are then
ordered by partition id, so a seeded simulation repeats exactly whatever node ids
the SuperLink assigned. ``pad_to_emulated_duration`` makes a deployed client take
as long as the delay model drew for the job (``start(..., emulate_delay_scale=...)``),
so asynchrony shows on uniform hardware (the ``device_speed`` mod, :mod:`asyncfl.client_app.device_speed`, does the
same from outside your handler, and also emulates slow devices from the node config or a named profile).
``report_train_seconds`` is a Flower mod that adds the
seconds your train handler took to its reply's metrics, so that on the wall clock the engine can
tell a job's training from the time it waited for a worker (a simulation runs more jobs than it
has workers) and lets ``dispatch-hold`` wait that long for a fresher model at no cost::

    app = ClientApp(mods=[report_train_seconds])
    answer_identity(app, num_examples=lambda context: len(my_partition(context)))

    @app.train()
    def train(msg, context):
        started = time.monotonic()
        ...  # your training
        pad_to_emulated_duration(msg, started)
        return Message(content, reply_to=msg)
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import MessageType

from asyncfl import protocol
from asyncfl.errors import ConfigError


def ray_node_id() -> str | None:
    """The id of the Ray node this process runs on, when it is a Ray worker (a simulated ClientApp); else None.

    Ray is only asked when a Ray worker has already imported it: a deployed ClientApp does not load it.
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_node_id())


def worker_record() -> dict[str, ConfigRecord]:
    """``{"asyncfl-worker": ConfigRecord({"process": "host:pid"})}``, with ``"ray-node": id`` in a Ray worker: the
    engine counts the processes that train (a simulation runs many nodes on a few) and the Ray nodes."""
    worker = ConfigRecord({protocol.PROCESS: f"{socket.gethostname()}:{os.getpid()}"})
    node = ray_node_id()
    if node:
        worker[protocol.RAY_NODE] = node
    return {protocol.WORKER_RECORD: worker}


def node_ids(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config, with a message that says how to set them."""
    try:
        return int(context.node_config[protocol.PARTITION_ID]), int(context.node_config[protocol.NUM_PARTITIONS])
    except KeyError as exc:
        raise ConfigError(
            f"node-config lacks {exc.args[0]!r}; start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from exc


def identity_reply(msg: Message, context: Context, num_examples: int | None = None,
                   label_counts: Callable[[], list[int]] | None = None) -> Message:
    """The reply to the engine's identity query: partition id, partitions, and what else is known.

    ``label_counts`` is called only when the request asks for it (delay models tied to labels).
    """
    partition_id, num_partitions = node_ids(context)
    config = ConfigRecord({protocol.PARTITION_ID: partition_id, protocol.NUM_PARTITIONS: num_partitions})
    if num_examples is not None:
        config[protocol.NUM_EXAMPLES] = int(num_examples)
    request = msg.content.config_records.get("config", ConfigRecord())
    if label_counts is not None and request.get(protocol.WANT_LABEL_COUNTS, False):
        config[protocol.LABEL_COUNTS] = [int(c) for c in label_counts()]
    return Message(RecordDict({"config": config}), reply_to=msg)


def answer_identity(app: ClientApp, num_examples: Callable[[Context], int] | None = None) -> None:
    """Register a ``query`` handler on ``app`` that answers asyncfl's identity query.

    Parameters
    ----------
    app : ClientApp
        Your ClientApp (it must not have a default ``query`` handler already).
    num_examples : callable, optional
        ``context -> training examples on this node``; delay models tied to data size use it.
    """

    @app.query()
    def identify(msg: Message, context: Context) -> Message:
        return identity_reply(msg, context, num_examples(context) if num_examples is not None else None)


def pad_to_emulated_duration(msg: Message, started: float) -> None:
    """Sleep until the job has taken the ``emulate-seconds`` its request carries (no key: return at once).

    ``started`` is the ``time.monotonic()`` taken when the handler began. The ``device_speed`` mod
    (:mod:`asyncfl.client_app.device_speed`) does this without a line in the handler, and counts the wait in
    ``train-seconds``; asyncfl's own ClientApp uses the mod.
    """
    config = msg.content.config_records.get("config", ConfigRecord())
    remaining = float(config.get(protocol.EMULATE_SECONDS, 0.0)) - (time.monotonic() - started)
    if remaining > 0:
        time.sleep(remaining)


def report_train_seconds(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Flower mod: add ``train-seconds`` (the train handler's wall time) to a train reply's metrics.

    Register it with ``ClientApp(mods=[report_train_seconds])``. The seconds go into the reply's
    ``"metrics"`` record (else its only MetricRecord, which the engine reads; a new ``"metrics"``
    record when it has none). A value the handler already reports is kept; error replies and other
    message types pass through untouched. The engine subtracts it from the job's round trip to learn
    how long jobs wait before they start (``dispatch-hold`` on the wall clock); Flower's strategies
    aggregate it like any other train metric. The mod also adds an ``"asyncfl-worker"`` ConfigRecord
    naming the process that trained (:func:`worker_record`; Flower's strategies aggregate no
    ConfigRecord): where many nodes share a few processes, the engine keeps no more jobs in flight than
    they can start soon (``cap-in-flight``).
    """
    if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return call_next(msg, context)
    started = time.monotonic()
    reply = call_next(msg, context)
    seconds = time.monotonic() - started
    if reply.has_error():
        return reply
    target = protocol.reply_metrics(reply.content)
    if target is None:
        reply.content["metrics"] = MetricRecord({protocol.TRAIN_SECONDS: seconds})
    elif protocol.TRAIN_SECONDS not in target:
        target[protocol.TRAIN_SECONDS] = seconds
    if protocol.WORKER_RECORD not in reply.content.config_records:
        reply.content.config_records.update(worker_record())
    return reply
