"""A train reply is read or rejected by reason, before any strategy sees it."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from asyncfl.server_app.codec import ModelCodec, RejectedReply, read_reply, read_train_reply
from asyncfl.server_app.engine_state import Job
from asyncfl.strategies.arrival import Arrival
from asyncfl.strategies.flower_options import MessageKeys

CODEC = ModelCodec.from_state(OrderedDict(w=np.zeros(2, np.float32), b=np.zeros(1, np.float32)))


def request() -> Message:
    return Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=1, message_type="train")


def reply_with(content: RecordDict) -> Message:
    return Message(content, reply_to=request())


def from_node(reply: Message, node: int = 7) -> Message:
    """``reply`` as a node sends it (the SuperLink checks a reply's sender is the node that pushed it)."""
    reply.metadata.__dict__["_src_node_id"] = node
    return reply


def test_a_good_reply_gives_the_flat_model():
    arrays = ArrayRecord(OrderedDict(w=Array(np.array([1.0, 2.0], np.float32)), b=Array(np.array([3.0], np.float32))))
    flat = read_train_reply(reply_with(RecordDict({"arrays": arrays})), CODEC, MessageKeys())
    assert flat.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("reply, reason, expired", [
    (lambda: Message(Error(code=1, reason="Traceback\nValueError: boom"), reply_to=request()), "error-reply", False),
    (lambda: Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="gone"), reply_to=request()), "error-reply", True),
    (lambda: reply_with(RecordDict({"metrics": MetricRecord({"num-examples": 1})})), "no-arrays", False),
    # a node's own error that reads like the server's undecodable reply is its error reply
    (lambda: from_node(Message(Error(code=0, reason="the reply could not be decoded: x"), reply_to=request())),
     "error-reply", False),
    (lambda: reply_with(RecordDict({"arrays": ArrayRecord(OrderedDict(w=Array(np.zeros(2, np.float32))))})),
     "wrong-layout", False),
])
def test_unusable_replies_are_rejected_by_reason(reply, reason, expired):
    with pytest.raises(RejectedReply) as rejected:
        read_train_reply(reply(), CODEC, MessageKeys())
    assert (rejected.value.reason, rejected.value.expired) == (reason, expired)
    if reason == "error-reply" and not expired:  # the last line of what the node said
        assert str(rejected.value).split(": ", 1)[1] in ("ValueError: boom", "the reply could not be decoded: x")


def job(**fields) -> Job:
    return Job("m1", node_id=7, client=3, version=4, start=1.0, finish=2.5, seq=9, sent_wall=0.0, **fields)


def test_read_reply_gives_the_arrival_the_strategy_sees():
    arrays = ArrayRecord(OrderedDict(w=Array(np.array([1.0, 2.0], np.float32)), b=Array(np.array([3.0], np.float32))))
    metrics = MetricRecord({"num-examples": 12, "train_loss": 0.5})
    base = np.zeros(3, np.float32)
    arrival = read_reply(job(), reply_with(RecordDict({"arrays": arrays, "metrics": metrics})), CODEC, MessageKeys(),
                         version=6, base=base, timeout=30.0)
    assert isinstance(arrival, Arrival)
    assert (arrival.client_index, arrival.base_version, arrival.staleness, arrival.num_examples, arrival.time) == (
        3, 4, 2, 12, 2.5)
    assert arrival.train_loss == 0.5 and arrival.weights.tolist() == [1.0, 2.0, 3.0] and arrival.base is base


@pytest.mark.parametrize("lost_reason, expired, says", [("lost", True, "no reply in 30s"),
                                                        ("node-offline", False, "node went offline")])
def test_read_reply_names_why_a_job_gave_nothing(lost_reason, expired, says):
    outcome = read_reply(job(lost_reason=lost_reason), None, CODEC, MessageKeys(), version=6,
                         base=np.zeros(3, np.float32), timeout=30.0)
    assert isinstance(outcome, RejectedReply)
    assert (outcome.reason, outcome.expired) == (lost_reason, expired) and says in str(outcome)


def test_read_reply_returns_a_rejection_instead_of_raising():
    outcome = read_reply(job(), reply_with(RecordDict({"metrics": MetricRecord({"num-examples": 1})})), CODEC,
                         MessageKeys(), version=6, base=np.zeros(3, np.float32), timeout=30.0)
    assert isinstance(outcome, RejectedReply) and outcome.reason == "no-arrays"


@pytest.mark.parametrize("value, expected", [(12, 12), (12.0, 12), (0, 0), (2**53, 2**53)])
def test_an_example_count_is_a_whole_number_from_zero(value, expected):
    from asyncfl.server_app.codec import reported_count
    assert reported_count(MetricRecord({"num-examples": value}), "num-examples") == expected
    assert reported_count(None, "num-examples") == 0 and reported_count(MetricRecord({}), "num-examples") == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 2.5, [1, 2], 2**53 + 1, 2**70])
def test_any_other_example_count_is_the_replys_rejection_not_an_exception(value):
    from asyncfl.server_app.codec import reported_count
    outcome = reported_count(MetricRecord({"num-examples": value}), "num-examples")
    assert isinstance(outcome, RejectedReply) and outcome.reason == "bad-num-examples"
    assert "expected a whole number from 0 to" in str(outcome)


@pytest.mark.parametrize("value, expected", [(0.25, 0.25), (3, 3.0), (float("inf"), None), ([1.0], None),
                                             (2**1100, None)])
def test_a_training_loss_that_is_not_a_finite_number_reads_as_nan(value, expected):
    import math

    from asyncfl.server_app.codec import reported_loss
    loss = reported_loss(MetricRecord({"train_loss": value}))
    assert loss == expected if expected is not None else math.isnan(loss)
