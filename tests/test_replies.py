"""A train reply is read or rejected by reason, before any strategy sees it."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from asyncfl.server_app.codec import ModelCodec
from asyncfl.server_app.replies import RejectedReply, read_train_reply
from asyncfl.strategies.flower_options import MessageKeys

CODEC = ModelCodec.from_state(OrderedDict(w=np.zeros(2, np.float32), b=np.zeros(1, np.float32)))


def request() -> Message:
    return Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=1, message_type="train")


def reply_with(content: RecordDict) -> Message:
    return Message(content, reply_to=request())


def test_a_good_reply_gives_the_flat_model():
    arrays = ArrayRecord(OrderedDict(w=Array(np.array([1.0, 2.0], np.float32)), b=Array(np.array([3.0], np.float32))))
    flat = read_train_reply(reply_with(RecordDict({"arrays": arrays})), CODEC, MessageKeys())
    assert flat.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("reply, reason, expired", [
    (lambda: Message(Error(code=1, reason="Traceback\nValueError: boom"), reply_to=request()), "error-reply", False),
    (lambda: Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="gone"), reply_to=request()), "error-reply", True),
    (lambda: reply_with(RecordDict({"metrics": MetricRecord({"num-examples": 1})})), "no-arrays", False),
    (lambda: reply_with(RecordDict({"arrays": ArrayRecord(OrderedDict(w=Array(np.zeros(2, np.float32))))})),
     "wrong-layout", False),
])
def test_unusable_replies_are_rejected_by_reason(reply, reason, expired):
    with pytest.raises(RejectedReply) as rejected:
        read_train_reply(reply(), CODEC, MessageKeys())
    assert (rejected.value.reason, rejected.value.expired) == (reason, expired)
    if reason == "error-reply" and not expired:
        assert "ValueError: boom" in str(rejected.value)
