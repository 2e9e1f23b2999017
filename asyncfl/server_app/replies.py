"""A train reply checked before a strategy sees it: what is wrong with it, by reason.

A reply is rejected (counted by reason, never aggregated, the run goes on) when it is
an error, lacks the model record, or carries a model of another layout, shape or dtype
or with NaN/Inf (:class:`~asyncfl.server_app.codec.ModelCodec` says which).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode

from asyncfl.server_app.codec import MalformedUpdate, ModelCodec
from asyncfl.strategies.flower_options import MessageKeys

#: Flower's codes for a message or reply it dropped as older than its TTL: the job ran out of time.
EXPIRED_CODES = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)


class RejectedReply(ValueError):
    """A reply that must not be aggregated; ``reason`` is its ``summary.json`` tally key."""

    def __init__(self, reason: str, detail: str, expired: bool = False) -> None:
        super().__init__(detail)
        self.reason = reason
        self.expired = expired  # the job ran out of time (Flower dropped it), rather than failed


def read_train_reply(reply: Message, codec: ModelCodec, keys: MessageKeys) -> np.ndarray:
    """The trained model of ``reply`` as a flat vector in ``codec``'s layout; :class:`RejectedReply` if unusable."""
    if reply.has_error():
        lines = (reply.error.reason or "").strip().splitlines()
        raise RejectedReply("error-reply", f"the ClientApp replied with an error: {lines[-1][:300] if lines else '?'}",
                            expired=reply.error.code in EXPIRED_CODES)
    records = reply.content.array_records
    if keys.arrays not in records:
        raise RejectedReply("no-arrays", f"the reply lacks the {keys.arrays!r} record")
    try:
        return codec.decode(records[keys.arrays])
    except MalformedUpdate as exc:
        raise RejectedReply(exc.reason, str(exc)) from exc
