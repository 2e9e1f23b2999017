"""The wall clock's journal: every event accepted after a checkpoint, kept so that a resumed run replays it.

On the virtual clock a resumed run sends the checkpoint's jobs again and gets the same
replies. On the wall clock a reply cannot be had again, so the engine appends each event
to the newest checkpoint's journal as it happens (:func:`record_event`; the file format is
:class:`~asyncfl.server_app.checkpoint.Checkpoints`'s), and a resumed run accepts them again,
in order, before it dispatches anything (:func:`replay`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from asyncfl.server_app.jobs import Job
from asyncfl.strategies.arrival import Arrival

if TYPE_CHECKING:
    from asyncfl.server_app.checkpoint import Checkpoints
    from asyncfl.server_app.engine import AsyncEngine
    from asyncfl.server_app.engine_state import EngineState

log = logging.getLogger("asyncfl.engine")


def record_event(checkpoints: Checkpoints, job: Job, arrival: Arrival | None, state: EngineState) -> None:
    """Log the event about to be accepted: an arrival with its update (and the model it was sent, when that was
    not a global version), or a job that failed with the counts it left (already counted in ``state``)."""
    if arrival is None:
        checkpoints.record({"kind": "failed", "seq": job.seq, "rejected": dict(state.stats.rejected),
                            "expired": state.expired_jobs, "dispatched": state.stats.dispatched})
        return
    arrays = (arrival.weights,) if job.sent_model is None else (arrival.weights, job.sent_model)
    checkpoints.record({"kind": "arrival", "seq": job.seq, "client": job.client, "version": job.version,
                        "num_examples": arrival.num_examples, "train_loss": arrival.train_loss,
                        "time": job.finish, "dispatched": state.stats.dispatched}, *arrays)


def replay(engine: AsyncEngine, events: list[tuple[dict, list[np.ndarray]]], saved: list[dict]) -> list[dict]:
    """Accept again, in order, what the run accepted after its checkpoint; returns the checkpoint's jobs whose
    outcome the journal does not hold (still out when the run died)."""
    state, versions = engine.state, engine.versions
    pending = {job["seq"]: job for job in saved}
    made: dict[int, np.ndarray] = {}  # versions made during the replay: bases of later replayed jobs
    # journals that record their scoring points replay them where they were; older ones score before each
    # arrival's time, which can differ from the run where a failed job or a wait reached a point first
    scoring_recorded = any(header["kind"] == "scored" for header, _ in events)
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
        if header["kind"] == "failed":
            state.stats.rejected, state.expired_jobs = dict(header["rejected"]), int(header["expired"])
        else:
            version = int(header["version"])
            base = arrays[1] if len(arrays) > 1 else made.get(version)
            base = versions.model(version) if base is None else base
            arrival = Arrival(int(header["client"]), version, versions.version - version, arrays[0], base,
                              int(header["num_examples"]), float(header["train_loss"]), float(header["time"]))
            if not scoring_recorded:
                engine.score_until(arrival.time)
            state.now = max(state.now, arrival.time)
            engine.accept(arrival)
            made.setdefault(versions.version, versions.current)
        if job is not None:
            versions.release(job["version"])
    if events:
        log.info("replayed %d event(s) accepted after the checkpoint (the journal): %d accepted updates now",
                 len(events), state.stats.arrivals)
    return list(pending.values())
