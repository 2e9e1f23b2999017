"""A train reply checked before a strategy sees it: an :class:`Arrival`, or what is wrong with it, by reason.

A reply is rejected (counted by reason, never aggregated, the run goes on) when it never
came, is an error, lacks the model record, carries a model of another layout, names, shape,
dtype or range or with NaN/Inf (:class:`~asyncfl.server_app.codec.ModelCodec` says which), or
reports an example count that is not a whole number >= 0. Whatever a node sends is data: no
value, type or shape here raises past :func:`read_reply`. Step 3 of
the reply path (``docs/engine.md``): nothing here counts, logs or changes state.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode

from asyncfl import protocol
from asyncfl.server_app.codec import MalformedUpdate, ModelCodec
from asyncfl.server_app.engine_state import Job
from asyncfl.strategies.arrival import Arrival
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


def read_reply(job: Job, reply: Message | None, codec: ModelCodec, keys: MessageKeys, version: int,
               base: np.ndarray, timeout: float) -> Arrival | RejectedReply:
    """What ``job``'s ``reply`` gives the strategy: an :class:`Arrival` (``version`` is the server's version now,
    ``base`` the model the job was sent), or the :class:`RejectedReply` saying why it gives nothing.

    ``reply`` is ``None`` for a job that never came back (``job.lost_reason``; ``timeout``: the wait it had).
    """
    if reply is None:
        if job.lost_reason == "node-offline":
            return RejectedReply(job.lost_reason, f"job {job.seq} lost: client {job.client}'s node went offline")
        return RejectedReply(job.lost_reason, f"job {job.seq} to client {job.client} lost (no reply in "
                                              f"{timeout:.0f}s)", expired=True)
    try:
        weights = read_train_reply(reply, codec, keys)
    except RejectedReply as rejected:
        return rejected
    metrics = protocol.reply_metrics(reply.content)
    num_examples = reported_count(metrics, keys.weight)
    if isinstance(num_examples, RejectedReply):
        return num_examples
    return Arrival(client_index=job.client, base_version=job.version, staleness=version - job.version,
                   weights=weights, base=base, num_examples=num_examples, train_loss=reported_loss(metrics),
                   time=job.finish)


#: The largest example count a reply may report (float64 holds whole numbers exactly up to 2**53).
MAX_COUNT = 2**53


def reported_count(metrics, key: str) -> int | RejectedReply:
    """A reply's example count under ``key``: a whole number >= 0 (an integral float is taken), 0 when absent;
    anything else (NaN, inf, negative, fractional, a list, a bool) is the reply's rejection ``bad-num-examples``."""
    value = metrics.get(key, 0) if metrics is not None else 0
    whole = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if not whole or not 0 <= value <= MAX_COUNT:
        return RejectedReply("bad-num-examples", f"{key!r} is {str(value)[:60]} ({type(value).__name__}); "
                                                 f"expected a whole number from 0 to {MAX_COUNT}")
    return int(value)


def reported_loss(metrics) -> float:
    """A reply's training loss (``train-loss`` or Flower's ``train_loss``) when it is a finite number, else NaN:
    a report, not an input to any step, so an odd value is not worth a rejection."""
    if metrics is None:
        return float("nan")
    value = next((metrics[k] for k in protocol.TRAIN_LOSS_ALIASES if k in metrics), None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float("nan")
    try:
        loss = float(value)
    except OverflowError:  # an int beyond float's range
        return float("nan")
    return loss if math.isfinite(loss) else float("nan")
