"""The engine's checkpoint half: its state out to a checkpoint, and a run back from one.

:class:`Resumable` is a part of :class:`~asyncfl.server_app.engine.AsyncEngine` (a mixin: it
reads and sets the engine's own fields), kept apart so the loop stays readable. A snapshot
is taken between two events, at the top of the loop: no reply is half accepted, so a run
resumed from it repeats what the first run does next.

* Virtual clock: the jobs that were in flight are sent again as they were (client, model
  version, request with its job seed, virtual times); the run is byte-identical to an
  uninterrupted one.
* Wall clock: a reply cannot be had again, so every event accepted after a checkpoint is
  appended to that checkpoint's journal as it happens (:meth:`_journal`) and replayed on
  resume (:meth:`_replay`); jobs still out when the run died count ``lost-in-restart``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

from asyncfl.errors import CheckpointError
from asyncfl.server_app.checkpoint import layout_of, resume_settings
from asyncfl.server_app.jobs import EngineStats, Job
from asyncfl.state import capture, restore
from asyncfl.strategies.arrival import Arrival

log = logging.getLogger("asyncfl.engine")


class Resumable:
    """Checkpoint and resume for the engine (see the module docstring)."""

    def _journal(self, job: Job, arrival: Arrival | None) -> None:
        """Wall clock: log the event about to be accepted (an arrival with its update, or a job that failed), so
        that a run resumed from the last checkpoint replays it instead of losing it."""
        if arrival is None:
            self.checkpoints.record({"kind": "failed", "seq": job.seq, "rejected": dict(self.stats.rejected),
                                     "expired": self._expired_jobs, "dispatched": self.stats.dispatched})
            return
        arrays = (arrival.weights,) if job.sent_model is None else (arrival.weights, job.sent_model)
        self.checkpoints.record({"kind": "arrival", "seq": job.seq, "client": job.client, "version": job.version,
                                 "num_examples": arrival.num_examples, "train_loss": arrival.train_loss,
                                 "time": job.finish, "dispatched": self.stats.dispatched}, *arrays)

    def _stateful_parts(self) -> dict[str, object]:
        """The parts around the engine that carry state of their own (each has state_dict/load_state_dict or
        state_attributes); the recorder last, so that it cuts its files back only once all else fitted."""
        parts = {"delays": self.delays, "scoring": self.scoring, "train_metrics": self.train_metrics,
                 "federated_eval": self.federated_eval, "evaluate_fn": self.evaluate_fn, "recorder": self.recorder}
        return {name: part for name, part in parts.items()
                if part is not None and (hasattr(part, "state_dict") or hasattr(type(part), "state_attributes"))}

    def snapshot(self) -> dict:
        """The whole server state at this moment, as a plain tree (:mod:`asyncfl.state`): global model and the
        versions jobs in flight were sent, those jobs (client, times, dispatch number, request as sent), the
        strategy's state, counters, random streams, the scoring schedule and the run folder's position.

        Taken between events (no reply half-accepted), so a run resumed from it repeats exactly what this one
        does next: on the virtual clock, byte for byte.
        """
        jobs = sorted(self._in_flight.values(), key=lambda j: j.seq)
        return {
            "settings": resume_settings(self.config),
            "layout": layout_of(self.codec),
            "clients": {"sizes": [int(s) for s in self.roster.sizes]},
            "strategy": self.strategy.state_dict(),
            "engine": capture({"now": self._now, "round_start": self._round_start, "seq": self._seq,
                               "failures_in_a_row": self._failures_in_a_row, "expired_jobs": self._expired_jobs,
                               "pick_rng": self._pick_rng}),
            "stats": capture({f.name: getattr(self.stats, f.name) for f in fields(EngineStats)
                              if f.name not in EngineStats.process_fields}),
            "versions": capture(self.versions.state_dict()),
            "train_config": capture({"record": dict(self.train_config), "round": self._round_configs}),
            "jobs": [capture({"client": j.client, "version": j.version, "start": j.start, "finish": j.finish,
                              "seq": j.seq, "sent_model": j.sent_model, "request": j.request}) for j in jobs],
            "parts": {name: part.state_dict() if hasattr(part, "state_dict") else capture(part, name)
                      for name, part in self._stateful_parts().items()},
        }

    def _checkpoint(self) -> None:
        path = self.checkpoints.save(self.snapshot, self.versions.version, self.stats.arrivals)
        log.debug("checkpoint %s", path)

    def _restore(self, state: dict) -> None:
        """Continue from a checkpoint's :meth:`snapshot` (after discovery and ``on_start``)."""
        sizes = [int(s) for s in self.roster.sizes]
        if state["clients"]["sizes"] != sizes:
            raise CheckpointError(
                f"the checkpoint was made with {len(state['clients']['sizes'])} client(s) of sizes "
                f"{state['clients']['sizes'][:8]}..., this run has {len(sizes)} of sizes {sizes[:8]}...: "
                "resume with the same nodes and data")
        self.strategy.load_state_dict(state["strategy"])
        engine = restore(None, state["engine"])
        self._now, self._round_start, self._seq = engine["now"], engine["round_start"], engine["seq"]
        self._failures_in_a_row, self._expired_jobs = engine["failures_in_a_row"], engine["expired_jobs"]
        self._pick_rng = engine["pick_rng"]
        for name, value in restore(None, state["stats"]).items():
            setattr(self.stats, name, value)
        self.versions.load_state_dict(restore(None, state["versions"]))
        train = restore(None, state["train_config"])
        self.train_config = ConfigRecord(train["record"])
        self._round_configs = train["round"]
        parts = self._stateful_parts()
        missing = sorted(set(parts) - set(state["parts"]))
        if missing:
            raise CheckpointError(f"the checkpoint has no state for {', '.join(missing)}: it was made by a run "
                                  "set up otherwise (federated evaluation, evaluate_fn, run folder)")
        for name, part in parts.items():
            if hasattr(part, "load_state_dict"):
                part.load_state_dict(state["parts"][name])
            else:
                restore(part, state["parts"][name], name)
        if self.checkpoints is not None:
            self.checkpoints.last_version = self.versions.version
        self.clock.resume_at(self._now)
        jobs = [restore(None, job) for job in state["jobs"]]
        if state.get("journal"):
            jobs = self._replay(state["journal"], jobs)
        self._reissue(jobs)
        log.info("resumed at server version %d after %d accepted updates (clock %.3f): %d job(s) in flight "
                 "re-sent", self.versions.version, self.stats.arrivals, self._now, len(self._in_flight))

    def _replay(self, events: list[tuple[dict, list[np.ndarray]]], saved: list[dict]) -> list[dict]:
        """Accept again, in order, what the run accepted after its checkpoint (the wall clock's journal); returns
        the checkpoint's jobs whose outcome the journal does not hold (still out when the run died)."""
        pending = {job["seq"]: job for job in saved}
        made: dict[int, np.ndarray] = {}  # versions made during the replay: bases of later replayed jobs
        # journals that record their scoring points replay them where they were; older ones score before each
        # arrival's time, which can differ from the run where a failed job or a wait reached a point first
        scoring_recorded = any(header["kind"] == "scored" for header, _ in events)
        for header, arrays in events:
            if header["kind"] == "scored":
                self.scoring.until(float(header["until"]), self._state)
                continue
            if header["kind"] == "round-end":
                new_model = self.strategy.on_round_end(self.versions.current)
                if new_model is not None:
                    self._advance(new_model)
                    made[self.versions.version] = self.versions.current
                continue
            job = pending.pop(header["seq"], None)
            self.stats.dispatched = max(self.stats.dispatched, int(header["dispatched"]))
            if header["kind"] == "failed":
                self.stats.rejected, self._expired_jobs = dict(header["rejected"]), int(header["expired"])
            else:
                version = int(header["version"])
                base = arrays[1] if len(arrays) > 1 else made.get(version)
                base = self.versions.model(version) if base is None else base
                arrival = Arrival(int(header["client"]), version, self.versions.version - version, arrays[0], base,
                                  int(header["num_examples"]), float(header["train_loss"]), float(header["time"]))
                if not scoring_recorded:
                    self._evaluate_until(arrival.time)
                self._now = max(self._now, arrival.time)
                self._accepted(arrival, self.strategy.on_arrival(arrival, self.versions.current))
                made.setdefault(self.versions.version, self.versions.current)
            if job is not None:
                self.versions.release(job["version"])
        if events:
            log.info("replayed %d event(s) accepted after the checkpoint (the journal): %d accepted updates now",
                     len(events), self.stats.arrivals)
        return list(pending.values())

    def _reissue(self, saved: list[dict]) -> None:
        """Send again the jobs that were in flight at the checkpoint, as they were sent (same client, model,
        seed and clock times), so their replies are the ones the first run would have accepted.

        On the wall clock a job's reply depends on when it comes back: those jobs are counted lost
        (``lost-in-restart``) and their slots filled anew.
        """
        if self.clock.nodes_come_and_go:
            for job in saved:
                self.versions.release(job["version"])
                self.stats.reject("lost-in-restart")
            if saved:
                log.warning("%d job(s) in flight at the checkpoint were lost with the run that wrote it "
                            "(lost-in-restart); their slots are filled anew", len(saved))
            return
        messages, jobs = [], []
        for entry in saved:
            client = entry["client"]
            if client >= len(self.roster.nodes):
                raise CheckpointError(f"the checkpoint has a job for client {client}; this run has "
                                      f"{len(self.roster.nodes)} clients")
            custom = entry["sent_model"]
            arrays = self.codec.to_record(custom) if custom is not None else self.versions.record(entry["version"])
            content = RecordDict({self.keys.arrays: arrays, self.keys.config: ConfigRecord(entry["request"])})
            messages.append(Message(content, dst_node_id=self.roster.nodes[client], message_type=MessageType.TRAIN,
                                    ttl=self.config.job_timeout))
            jobs.append(Job("", self.roster.nodes[client], client, entry["version"], entry["start"], entry["finish"],
                            entry["seq"], 0.0, sent_model=custom, request=entry["request"]))
        message_ids = list(self.grid.push_messages(messages)) if messages else []
        sent = time.monotonic()
        for job, message_id in zip(jobs, message_ids):
            job.message_id, job.sent_wall = message_id, sent
            self._in_flight[message_id] = job
            self._busy[job.client] += 1
        for job in jobs[len(message_ids):]:
            self.versions.release(job.version)
            self.stats.reject("push-refused")
        self._update_eligible(range(len(self.roster)))
