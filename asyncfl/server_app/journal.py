"""The wall clock's journal: every reply taken in after a checkpoint, kept so that a resumed run takes it in again.

On the virtual clock a resumed run sends the checkpoint's jobs again and gets the same
replies. On the wall clock a reply cannot be had again, so the engine appends each reply,
as it came, to the newest checkpoint's journal before taking it in (:func:`record_event`;
the file format is :class:`~asyncfl.server_app.checkpoint.Checkpoints`'s), and a resumed
run hands the replies, in order, to the same steps a live reply takes (read, the
participant's bounds, the count, the strategy: ``AsyncEngine.take_in``) before it
dispatches anything (:func:`replay`). So the bounds' history, the counters and the train
metrics after a resume are those of the run that died, by construction.

Journals written before replies were kept as they came (events ``arrival`` and ``failed``)
hold the update as bounded and the counts it left: they are replayed as they were then,
straight to the strategy.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.common import MessageType, serde
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from asyncfl import protocol
from asyncfl.server_app.engine_state import Job
from asyncfl.server_app.codec import HEADER_LIMIT, ModelCodec, RejectedReply, read_train_reply
from asyncfl.strategies.arrival import Arrival

if TYPE_CHECKING:
    from asyncfl.strategies.flower_options import MessageKeys
    from asyncfl.server_app.checkpoint import Checkpoints
    from asyncfl.server_app.engine import AsyncEngine
    from asyncfl.server_app.engine_state import EngineState

log = logging.getLogger("asyncfl.engine")


def record_event(checkpoints: Checkpoints, job: Job, reply: Message | None, state: EngineState,
                 codec: ModelCodec, keys: MessageKeys) -> RejectedReply | None:
    """Log the reply of ``job`` about to be taken in, as the reply path reads it: the model record (``keys.arrays``:
    each array's bytes as they came), the metrics it reads and the worker record's names (serialized), or the last line of its error,
    or that none came (``job.lost_reason``), with the job's fields and its round trip (nothing else a node sends).
    A reply whose model record carries more than the path takes (an array of another name or shape, or of more bytes
    than its entries can take) is logged as its rejection alone, so a reply's entry is at most what an accepted one's
    can be. Returns the reply's rejection when decided here: that one,
    or ``unrecordable`` when the reply cannot be written (values no serialization holds, e.g. an int beyond 64
    bits): a resumed run could not take it in again, so the live run refuses it too, and the journal says so."""
    pulled = state.pulled_at.get(job.message_id)
    header = {"kind": "reply", "seq": job.seq, "client": job.client, "node": job.node_id, "version": job.version,
              "start": job.start, "finish": job.finish, "lost": job.lost_reason, "outage": job.outage,
              "round_trip": None if pulled is None else pulled - job.sent_wall,
              "dispatched": state.stats.dispatched, "sent_model": job.sent_model is not None}
    arrays = [] if job.sent_model is None else [job.sent_model]
    refused = None
    if reply is not None and reply.has_error():
        lines = (reply.error.reason or "").strip().splitlines()  # all the reply path reads of it
        header["error"] = [int(reply.error.code), lines[-1][:300] if lines else "",
                           reply.metadata.src_node_id == SUPERLINK_NODE_ID]  # the server's own error in its place
    elif reply is not None and (refused := _carries_too_much(reply, codec, keys)) is not None:
        header["refused"] = [refused.reason, str(refused)]
    elif reply is not None:
        try:
            layout, payload, small, trimmed = _parts(reply.content, keys.arrays)
            arrays += [*payload, np.frombuffer(small, dtype=np.uint8)]
            header["content"] = {"key": keys.arrays, "arrays": layout, **({"metrics_trimmed": True} if trimmed else {})}
        except Exception as exc:  # whatever a node sent that serialization refuses
            refused = RejectedReply("unrecordable", f"the reply cannot be written to the journal ({type(exc).__name__}:"
                                                    f" {str(exc)[:200]}); a resumed run could not take it in again")
            header["refused"] = [refused.reason, str(refused)]
    checkpoints.record(header, *arrays)
    return refused


#: Bytes an array may carry beyond its entries: the .npy header (the codec refuses a longer one).
NPY_HEADER_BYTES = HEADER_LIMIT + 12
#: Bytes an entry may take: the widest dtype the codec accepts (float128).
ENTRY_BYTES = 16
#: Characters an array's dtype or serialization may be named in.
DESCRIPTION_CHARS = 64


def _carries_too_much(reply: Message, codec: ModelCodec, keys: MessageKeys) -> RejectedReply | None:
    """The path's rejection of a reply whose model record carries more than the path takes (arrays under other
    names or shapes, or of more bytes than their entries can take), worked out before the reply is written; ``None``
    for any other reply (the path reads it as usual; its metrics are journaled as the path reads them, cut to a
    report's size: ``protocol.reply_metrics``)."""
    record = reply.content.array_records.get(keys.arrays)
    if record is not None and not all(_fits(codec, name, array) for name, array in record.items()):
        try:
            read_train_reply(reply, codec, keys)
        except RejectedReply as rejected:
            return rejected
    return None


def _fits(codec: ModelCodec, name: str, array) -> bool:
    """Whether ``array`` under ``name`` is no larger than the model's entry of that name can be sent as: its name and
    shape, a dtype and serialization named in at most :data:`DESCRIPTION_CHARS`, bytes the entries can take."""
    i = codec.index.get(name)
    return (i is not None and tuple(array.shape) == codec.shapes[i] and len(array.dtype) <= DESCRIPTION_CHARS
            and len(array.stype) <= DESCRIPTION_CHARS
            and len(array.data) <= NPY_HEADER_BYTES + ENTRY_BYTES * codec.sizes[i])


def _parts(content: RecordDict, arrays_key: str) -> tuple[list | None, list[np.ndarray], bytes, bool]:
    """What the reply path reads of ``content``: the model record's arrays as their bytes (no re-encoding: a
    model-sized record costs one copy) with each one's ``[name, dtype, shape, stype]`` (``None``: no such
    record), the metrics and worker records serialized (Flower's serde), and whether the metrics were cut to a
    report's size (:class:`~asyncfl.protocol.TrimmedMetrics`: a replay counts it as the live run did)."""
    layout, payload = None, []
    if arrays_key in content.array_records:
        items = list(content.array_records[arrays_key].items())
        layout = [[str(name), str(array.dtype), [int(n) for n in array.shape], str(array.stype)]
                  for name, array in items]
        payload = [np.frombuffer(array.data, dtype=np.uint8) for _, array in items]
    kept = RecordDict()
    metrics = protocol.reply_metrics(content)
    if metrics is not None:
        kept["metrics"] = metrics  # the record reply_metrics picks, under the name it picks first
    worker = content.config_records.get(protocol.WORKER_RECORD)
    if worker is not None:  # the names the path reads, as it reads them: not whatever else a node put there
        names = {key: protocol.worker_name(worker.get(key)) for key in (protocol.PROCESS, protocol.RAY_NODE)}
        kept[protocol.WORKER_RECORD] = ConfigRecord({key: name for key, name in names.items() if name is not None})
    return (layout, payload, serde.recorddict_to_proto(kept).SerializeToString(),
            isinstance(metrics, protocol.TrimmedMetrics))


def _reply_of(header: dict, parts: list[np.ndarray]) -> Message | None:
    """The reply a journal event recorded (``parts``: its arrays' bytes, then its other records), as a Message the
    reply path reads (``None``: none came)."""
    from_superlink = "error" in header and len(header["error"]) > 2 and bool(header["error"][2])
    source = SUPERLINK_NODE_ID if from_superlink else int(header["node"])
    metadata = Metadata(run_id=0, message_id="", src_node_id=source, dst_node_id=0,
                        reply_to_message_id=f"replayed-{header['seq']}", group_id="", created_at=0.0, ttl=0,
                        message_type=MessageType.TRAIN)
    if "error" in header:
        code, reason = header["error"][:2]
        return make_message(metadata=metadata, error=Error(code=int(code), reason=str(reason)))
    if "content" not in header:
        return None
    proto = RecordDictProto()
    proto.ParseFromString(parts[-1].tobytes())
    content = serde.recorddict_from_proto(proto)
    layout = header["content"]["arrays"]
    if header["content"].get("metrics_trimmed") and "metrics" in content.metric_records:  # read as it was live
        content["metrics"] = protocol.TrimmedMetrics(content.metric_records["metrics"])
    if layout is not None:
        content[header["content"]["key"]] = ArrayRecord(OrderedDict(
            (name, Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data.tobytes()))
            for (name, dtype, shape, stype), data in zip(layout, parts)))
    return make_message(metadata=metadata, content=content)


def replay(engine: AsyncEngine, events: list[tuple[dict, list[np.ndarray]]], saved: list[dict]) -> list[dict]:
    """Take in again, in order, what the run took in after its checkpoint; returns the checkpoint's jobs whose
    outcome the journal does not hold (still out when the run died)."""
    state, versions = engine.state, engine.versions
    pending = {job["seq"]: job for job in saved}
    # the bases of replayed jobs: the checkpoint's current version (jobs sent after the checkpoint carried it) and
    # the versions made during the replay, which the store drops once no job it knows of needs them
    made: dict[int, np.ndarray] = {versions.version: versions.current}
    # journals that record their scoring points replay them where they were; older ones score before each
    # arrival's time, which can differ from the run where a failed job or a wait reached a point first
    scoring_recorded = any(header["kind"] == "scored" for header, _ in events)
    engine.replaying = True
    try:
        for header, arrays in events:
            if header["kind"] == "scored":
                engine.score_until(float(header["until"]))
                continue
            if header["kind"] == "round-end":
                before = versions.version
                engine.end_round()
                if versions.version != before:
                    made[versions.version] = versions.current
                continue
            job = pending.pop(header["seq"], None)
            state.stats.dispatched = max(state.stats.dispatched, int(header["dispatched"]))
            if header["kind"] == "reply":
                _take_in_again(engine, header, arrays, made, scoring_recorded)
            else:
                _legacy_event(engine, header, arrays, made, scoring_recorded)
            made.setdefault(versions.version, versions.current)
            if job is not None:
                versions.release(job["version"])
    finally:
        engine.replaying = False
    if events:
        engine.slots.update_all()  # the bounds' shares moved with the replayed updates
        log.info("replayed %d event(s) taken in after the checkpoint (the journal): %d accepted updates now",
                 len(events), state.stats.arrivals)
    return list(pending.values())


def _base_of(version: int, sent_model: np.ndarray | None, made: dict[int, np.ndarray], versions) -> np.ndarray:
    """The model a replayed job was sent: its own, a version made during the replay, or a stored one."""
    if sent_model is not None:
        return sent_model
    base = made.get(version)
    return versions.models[version] if base is None else base


def _take_in_again(engine: AsyncEngine, header: dict, arrays: list[np.ndarray], made: dict[int, np.ndarray],
                   scoring_recorded: bool) -> None:
    """A recorded reply through the live reply path (``AsyncEngine.take_in``), its job as it was sent."""
    sent_model = arrays[0] if header["sent_model"] else None
    version, finish = int(header["version"]), float(header["finish"])
    job = Job(f"replayed-{header['seq']}", int(header["node"]), int(header["client"]), version,
              float(header["start"]), finish, int(header["seq"]), 0.0, lost_reason=str(header["lost"]),
              sent_model=sent_model, outage=bool(header["outage"]))
    if header["round_trip"] is not None:  # read by the count as (pulled - sent): sent at 0
        engine.state.pulled_at[job.message_id] = float(header["round_trip"])
    if not scoring_recorded:
        engine.score_until(finish)
    engine.state.now = max(engine.state.now, finish)
    refused = RejectedReply(*header["refused"]) if "refused" in header else None
    engine.take_in(job, None if refused else _reply_of(header, arrays[1:] if sent_model is not None else arrays),
                   _base_of(version, sent_model, made, engine.versions), refused)


def _legacy_event(engine: AsyncEngine, header: dict, arrays: list[np.ndarray], made: dict[int, np.ndarray],
                  scoring_recorded: bool) -> None:
    """An event of a journal written before replies were kept as they came: an update as bounded, straight to the
    strategy, or a failed job's counts."""
    state = engine.state
    if header["kind"] == "failed":
        state.stats.rejected, state.expired_jobs = dict(header["rejected"]), int(header["expired"])
        return
    version = int(header["version"])
    arrival = Arrival(int(header["client"]), version, engine.versions.version - version, arrays[0],
                      _base_of(version, arrays[1] if len(arrays) > 1 else None, made, engine.versions),
                      int(header["num_examples"]), float(header["train_loss"]), float(header["time"]))
    if not scoring_recorded:
        engine.score_until(arrival.time)
    state.now = max(state.now, arrival.time)
    engine.accept(arrival)
