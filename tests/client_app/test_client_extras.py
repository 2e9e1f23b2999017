"""asyncfl's extras for a user's ClientApp: the ``report_train_seconds`` mod."""

import os
import socket
import time

from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.common import MessageType

from asyncfl import protocol, report_train_seconds


def _message(message_type: str) -> Message:
    return Message(RecordDict({"arrays": ArrayRecord()}), dst_node_id=1, message_type=message_type)


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def _handler(content: RecordDict, seconds: float = 0.05):
    def train(msg, context):
        time.sleep(seconds)
        return Message(content, reply_to=msg)
    return train


def test_the_mod_adds_the_handlers_seconds_to_the_metrics_record_a_train_reply_has():
    reply = report_train_seconds(_message(MessageType.TRAIN), _context(),
                                 _handler(RecordDict({"metrics": MetricRecord({"num-examples": 10})})))
    metrics = reply.content.metric_records["metrics"]
    assert metrics["num-examples"] == 10 and 0.05 <= metrics[protocol.TRAIN_SECONDS] < 5.0
    # Flower's examples name their record otherwise: the only MetricRecord gets it (the one the engine reads)
    reply = report_train_seconds(_message("train.personal"), _context(),
                                 _handler(RecordDict({"train_metrics": MetricRecord({"train_loss": 1.0})})))
    assert protocol.TRAIN_SECONDS in reply.content.metric_records["train_metrics"]
    assert list(reply.content.metric_records) == ["train_metrics"]
    # and which process trained, in a ConfigRecord (Flower's strategies aggregate MetricRecords only)
    worker = reply.content.config_records[protocol.WORKER_RECORD]
    assert worker[protocol.PROCESS] == f"{socket.gethostname()}:{os.getpid()}"


def test_the_mod_creates_a_metrics_record_and_keeps_a_reported_value():
    reply = report_train_seconds(_message(MessageType.TRAIN), _context(), _handler(RecordDict(), 0.0))
    assert protocol.TRAIN_SECONDS in reply.content.metric_records["metrics"]
    own = RecordDict({"metrics": MetricRecord({protocol.TRAIN_SECONDS: 123.0})})
    reply = report_train_seconds(_message(MessageType.TRAIN), _context(), _handler(own, 0.0))
    assert reply.content.metric_records["metrics"][protocol.TRAIN_SECONDS] == 123.0


def test_the_mod_leaves_other_messages_and_error_replies_alone():
    content = RecordDict({"metrics": MetricRecord({"eval-acc": 0.5})})
    reply = report_train_seconds(_message(MessageType.EVALUATE), _context(), _handler(content, 0.0))
    assert dict(reply.content.metric_records["metrics"]) == {"eval-acc": 0.5}

    def failing(msg, context):
        return Message(Error(code=0, reason="boom"), reply_to=msg)

    reply = report_train_seconds(_message(MessageType.TRAIN), _context(), failing)
    assert reply.has_error() and reply.error.reason == "boom"
