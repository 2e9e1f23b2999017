"""Everything the engine's loop changes, as one object: what a checkpoint of the engine holds.

The loop (:mod:`~asyncfl.server_app.engine`) reads and writes these fields and nothing
else of its own; :meth:`EngineState.snapshot` turns them into a plain tree
(:mod:`asyncfl.state`) and :meth:`EngineState.restore` loads one back. The strategy, the
evaluator, the run folder and the other parts around the engine keep their own state
(``state_dict`` or ``state_attributes``); the engine's checkpoint adds theirs beside this.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ConfigRecord, Message

from asyncfl.errors import ClientAppsFailing
from asyncfl.server_app.jobs import EngineStats, Job
from asyncfl.server_app.versions import VersionStore
from asyncfl.state import capture, restore

if TYPE_CHECKING:
    from asyncfl.server_app.replies import RejectedReply

log = logging.getLogger("asyncfl.engine")

#: The loop's scalars a checkpoint keeps, in the order it writes them.
LOOP_FIELDS = ("now", "round_start", "seq", "failures_in_a_row", "expired_jobs", "pick_rng", "held_since")


@dataclass
class EngineState:
    """The engine's own state between two events.

    Parameters
    ----------
    versions : VersionStore
        The global model and every version a job in flight was sent.
    pick_rng : numpy.random.Generator
        Draws the clients of new jobs.
    stats : EngineStats
        The counters a run's summary is built from.
    train_config : ConfigRecord
        The run's train config, as Flower passes it to ``configure_train`` every round (changes made there last).
    """

    versions: VersionStore
    pick_rng: np.random.Generator
    stats: EngineStats = field(default_factory=EngineStats)
    train_config: ConfigRecord = field(default_factory=ConfigRecord)
    now: float = 0.0  # the clock at the last accepted event
    round_start: float = 0.0  # the clock at the last dispatch (a synchronous round's start)
    seq: int = 0  # dispatch number of the next job
    held_since: float = -1.0  # the clock when free slots began waiting for the next version (dispatch-hold); -1: none
    failures_in_a_row: int = 0  # jobs that failed since the last accepted update
    # clients whose jobs failed since the last accepted update: the run stops only once every job out is theirs
    # (not saved: a resumed run starts a new streak)
    failing_clients: set = field(default_factory=set)
    expired_jobs: int = 0  # lost to timeout, or replies Flower dropped as older than their TTL
    rounds_closed: int = 0  # rounds whose end was handled (train metrics, round-scheduled evaluation)
    # what configure_train said for a round: (round, client -> config, default)
    round_configs: tuple[int, dict[int, dict], dict] | None = None
    in_flight: dict[str, Job] = field(default_factory=dict)  # message id -> job
    inbox: dict[str, Message] = field(default_factory=dict)  # pulled replies not yet accepted (pulls destroy)
    pulled_at: dict[str, float] = field(default_factory=dict)  # message id -> monotonic time its reply was pulled

    def rounds(self, per_round: int) -> tuple[int, int]:
        """``(rounds complete, round in progress)``, counted from 1 as Flower's: with ``per_round`` accepted updates
        a round, round ``r`` holds arrivals ``(r - 1) * per_round + 1`` to ``r * per_round``, so the model after
        the first update is round 1's (0 is the initial model's). ``per_round`` 0 (synchronous strategies): a
        round is a server version, both counts being the version."""
        if not per_round:
            return self.versions.version, self.versions.version
        arrivals = self.stats.arrivals
        return arrivals // per_round, -(-arrivals // per_round)

    def count_failure(self, job: Job, outcome: RejectedReply) -> None:
        """Step 4 for a job that gave nothing: counted by reason and toward the failure streak, unless a SuperLink
        outage lost it (``job.outage``, counted when it was found: no failure of its client)."""
        if job.outage:
            log.info("job %d to client %d lost to the SuperLink outage (%s): not the client's failure", job.seq,
                     job.client, outcome.reason)
            return
        log.warning("client %d reply rejected (%s): %s", job.client, outcome.reason, outcome)
        self.stats.reject(outcome.reason)
        self.expired_jobs += outcome.expired
        self.failures_in_a_row += 1
        self.failing_clients.add(job.client)

    def check_not_all_failing(self, concurrency: int, timeout: float) -> None:
        """Abort when every one of many consecutive jobs failed and every job still out went to a client that
        failed in that streak: a broken ClientApp (or every node unreachable), not bad luck, and not one fast
        node that sends junk while the others' jobs are out. Jobs a SuperLink outage lost are not in the streak."""
        limit = 5 * concurrency + 10
        if self.failures_in_a_row >= limit and all(job.client in self.failing_clients
                                                    for job in self.in_flight.values()):
            rejected = dict(self.stats.rejected)
            hint = (f"; most of them ran out of time (no reply, or Flower dropped a reply older than its message's "
                    f"TTL = timeout = {timeout:g} s): if the ClientApps are slow rather than broken, raise "
                    "timeout" if self.expired_jobs * 2 >= sum(rejected.values()) else "")
            raise ClientAppsFailing(f"the last {limit} jobs all failed (rejected: {rejected}); "
                                    f"check the ClientApp logs: the run cannot make progress{hint}")

    def snapshot(self) -> dict:
        """The engine's part of a checkpoint: the loop's scalars, counters, stored versions, train config and the
        jobs in flight (client, model version, clock times, dispatch number, the request and any custom model
        as sent). Replies already pulled are not kept: their jobs are sent again on resume."""
        jobs = sorted(self.in_flight.values(), key=lambda j: j.seq)
        return {
            "engine": capture({name: getattr(self, name) for name in LOOP_FIELDS}),
            "stats": capture({f.name: getattr(self.stats, f.name) for f in fields(EngineStats)
                              if f.name not in EngineStats.process_fields}),
            "versions": capture(self.versions.state_dict()),
            "train_config": capture({"record": dict(self.train_config), "round": self.round_configs}),
            "jobs": [capture({"client": j.client, "version": j.version, "start": j.start, "finish": j.finish,
                              "seq": j.seq, "sent_model": j.sent_model, "request": j.request}) for j in jobs],
        }

    def restore(self, tree: dict) -> list[dict]:
        """Load a :meth:`snapshot`; returns the jobs that were in flight (plain dicts), for the engine to send
        again. Counts of rounds closed are not stored: every round due was closed before a checkpoint."""
        for name, value in restore(None, tree["engine"]).items():
            setattr(self, name, value)
        for name, value in restore(None, tree["stats"]).items():
            setattr(self.stats, name, value)
        self.versions.load_state_dict(restore(None, tree["versions"]))
        train = restore(None, tree["train_config"])
        self.train_config = ConfigRecord(train["record"])
        self.round_configs = train["round"]
        return [restore(None, job) for job in tree["jobs"]]
