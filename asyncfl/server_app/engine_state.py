"""Everything the engine's loop changes, as one object: what a checkpoint of the engine holds.

The loop (:mod:`~asyncfl.server_app.engine`) reads and writes these fields and nothing
else of its own; :meth:`EngineState.snapshot` turns them into a plain tree
(:mod:`asyncfl.state`) and :meth:`EngineState.restore` loads one back. The strategy, the
evaluator, the run folder and the other parts around the engine keep their own state
(``state_dict`` or ``state_attributes``); the engine's checkpoint adds theirs beside this.

Its parts: :class:`Job`, one dispatched train request; :class:`EngineStats`, the counters a run's
summary is built from; :class:`VersionStore`, the global models kept while a job needs them. The
protocols name exactly what the engine calls on Flower's Grid, on the run folder's recorder, on the
train-metrics sink and on federated evaluation (so that fakes can stand in).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from asyncfl import protocol
from asyncfl.errors import ClientAppsFailing
from asyncfl.server_app.codec import ModelCodec
from asyncfl.state import capture, restore

if TYPE_CHECKING:
    from asyncfl.server_app.codec import RejectedReply

log = logging.getLogger("asyncfl.engine")


class GridLike(Protocol):
    """The part of ``flwr.serverapp.Grid`` the engine uses."""

    def get_node_ids(self): ...

    def push_messages(self, messages): ...

    def pull_messages(self, message_ids): ...


class Recorder(Protocol):
    """Where the engine reports what happened (see :mod:`asyncfl.server_app.recorder`)."""

    def on_evaluation(self, row: dict) -> None: ...

    def on_progress(self, clock: float, arrivals: int) -> None: ...


class TrainMetricsSink(Protocol):
    """Collects the ClientApps' train metrics per round (see :mod:`asyncfl.server_app.client_metrics`)."""

    def add(self, content: RecordDict) -> None: ...

    def on_round(self, round_: int) -> None: ...


class FederatedEvaluator(Protocol):
    """Sends the model to a sample of nodes for evaluation (see :class:`asyncfl.server_app.client_metrics.FederatedEvaluation`)."""

    def dispatch(self, round_: int, version: int, record, nodes: list[int]) -> None: ...

    def poll(self) -> None: ...

    def finish(self) -> None: ...


@dataclass
class Job:
    """One dispatched train request."""

    message_id: str
    node_id: int
    client: int
    version: int
    start: float
    finish: float
    seq: int
    sent_wall: float
    lost_reason: str = "lost"
    sent_model: np.ndarray | None = None  # set when the strategy sent something other than the global model
    request: dict | None = None  # the request's config record as sent (a resumed run re-sends it as it was)
    outage: bool = False  # a SuperLink outage lost it and it was not sent again: no failure of its client
    push_began: float = 0.0  # time.monotonic() when the push that sent it began (it was out from then on)


#: Ray node names counted (``arrivals-by-ray-node``; later ones as ``other``), since any node may send any name.
WORKER_NAMES = 1024


@dataclass
class EngineStats:
    """Counters the summary is built from."""

    arrivals: int = 0
    dispatched: int = 0
    staleness: list[int] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    server_seconds: float = 0.0
    evaluations: list[dict] = field(default_factory=list)
    round_trip_seconds: list[float] = field(default_factory=list)  # push -> reply pulled, wall seconds
    client_train_seconds: list[float] = field(default_factory=list)  # as the ClientApps report it
    reply_bytes: list[int] = field(default_factory=list)  # serialized array payload of each accepted reply
    clamped_variances: int = 0  # negative BatchNorm running variances set to 0 in new global models
    metrics_trimmed: int = 0  # accepted replies whose metrics were cut to a report's size (protocol.reply_metrics)
    held_dispatches: int = 0  # times free slots waited for the strategy's next version (dispatch-hold)
    reply_pulls: int = 0  # wall clock: pull requests of single replies the puller made (each costs the SuperLink)
    # wall clock: seconds from the last pull that missed a reply to the pull that found it (how late it may have been
    # noticed), summed over the replies found after a miss, and their count
    reply_miss_gap: tuple[float, int] = (0.0, 0)
    # cap-in-flight: dispatch checks that found jobs in flight capped below concurrency, the sum and least cap
    capped_checks: int = 0
    in_flight_cap_sum: int = 0
    in_flight_cap_min: int = 0
    unidentified_nodes: int = 0  # nodes that reported no partition-id (ordered by node id)
    # jobs a SuperLink outage lost (out while it could not be reached, then lost, timed out or "unavailable"):
    # never counted as rejections or toward the failure streak; those sent again at once (their node online)
    outage_jobs: int = 0
    outage_resent: int = 0
    # client -> [accepted arrivals, staleness sum, round-trip seconds sum, round trips]: who was slow, who stale
    by_client: dict[int, list[float]] = field(default_factory=dict)
    by_worker: dict[str, int] = field(default_factory=dict)  # accepted replies per Ray node (simulation on a cluster)
    first_push_wall: float | None = None  # time.monotonic() when the first train job was pushed
    last_arrival_wall: float | None = None  # time.monotonic() when the last accepted reply was taken in

    #: Fields of this process alone (moments of its monotonic clock, its puller's count): not carried into a
    #: resumed run.
    process_fields = ("first_push_wall", "last_arrival_wall", "reply_pulls", "reply_miss_gap")

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def count_reply(self, job: Job, content: RecordDict, arrays_key: str, train_seconds: float | None,
                    pulled_wall: float | None, worker_node: str | None) -> None:
        """An accepted reply's transport: bytes of its arrays as serialized, its round trip (``pulled_wall``: when
        it was pulled, if known), the client's own compute time and the Ray node it ran on."""
        self.reply_bytes.append(sum(len(array.data) for array in content.array_records[arrays_key].values()))
        if pulled_wall is not None:
            self.round_trip_seconds.append(pulled_wall - job.sent_wall)
            tally = self.by_client.setdefault(job.client, [0, 0, 0.0, 0])  # created at the client's first reply
            tally[2] += pulled_wall - job.sent_wall
            tally[3] += 1
        if train_seconds is not None:
            self.client_train_seconds.append(train_seconds)
        if worker_node is not None and (worker_node := protocol.worker_name(worker_node)) is not None:
            if worker_node not in self.by_worker and len(self.by_worker) >= WORKER_NAMES:  # a bounded table
                worker_node = "other"
            self.by_worker[worker_node] = self.by_worker.get(worker_node, 0) + 1

    def count_in_flight_cap(self, cap: int) -> None:
        """A dispatch check found jobs in flight capped at ``cap`` (below ``concurrency``)."""
        self.capped_checks += 1
        self.in_flight_cap_sum += cap
        self.in_flight_cap_min = cap if self.capped_checks == 1 else min(self.in_flight_cap_min, cap)

    def count_arrival(self, client: int, staleness: int, wall: float) -> None:
        """An update the strategy took in."""
        self.arrivals += 1
        self.last_arrival_wall = wall
        self.staleness.append(staleness)
        tally = self.by_client.setdefault(client, [0, 0, 0.0, 0])
        tally[0] += 1
        tally[1] += staleness

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class VersionStore:
    """Reference-counted global model versions.

    The current version is always kept; an older one lives only while a job
    dispatched with it is in flight, so memory grows with the concurrency, never
    with the number of clients or of versions.
    """

    def __init__(self, codec: ModelCodec, initial: np.ndarray) -> None:
        self.codec = codec
        self.version = 0
        #: The flat model of each stored version: the current one and those pinned by jobs in flight.
        self.models: dict[int, np.ndarray] = {0: initial}
        #: The current global model (flat).
        self.current: np.ndarray = initial
        self._records: dict[int, ArrayRecord] = {}
        self._refs: dict[int, int] = {}
        self.peak_versions = 1

    def record(self, version: int) -> ArrayRecord:
        """The ArrayRecord of ``version``, encoded once and shared by all its dispatches."""
        if version not in self._records:
            self._records[version] = self.codec.to_record(self.models[version])
        return self._records[version]

    def acquire(self) -> int:
        """Pin the current version for a new job; returns the version number."""
        self._refs[self.version] = self._refs.get(self.version, 0) + 1
        return self.version

    def release(self, version: int) -> None:
        """Unpin ``version`` for a finished job; drop it if nobody needs it anymore."""
        self._refs[version] -= 1
        if self._refs[version] == 0:
            del self._refs[version]
            if version != self.version:  # neither current nor pinned: forgotten
                self.models.pop(version, None)
                self._records.pop(version, None)

    def advance(self, new_model: np.ndarray) -> int:
        """Make ``new_model`` the current version; returns the new version number."""
        old = self.version
        self.version += 1
        self.models[self.version] = self.current = new_model
        if old not in self._refs:
            self.models.pop(old, None)
            self._records.pop(old, None)
        self.peak_versions = max(self.peak_versions, len(self.models))
        return self.version

    def state_dict(self) -> dict:
        """The current version number, every stored model and the pins on them (a checkpoint's part)."""
        return {"version": self.version, "models": dict(self.models), "refs": dict(self._refs),
                "peak_versions": self.peak_versions}

    def load_state_dict(self, state: dict) -> None:
        """Take the versions a checkpoint stored; their records are re-encoded on first use."""
        self.version = int(state["version"])
        self.models = {int(v): m for v, m in state["models"].items()}
        self.current = self.models[self.version]
        self._refs = {int(v): int(n) for v, n in state["refs"].items()}
        self._records = {}
        self.peak_versions = int(state["peak_versions"])

    @property
    def stored(self) -> int:
        """How many versions are held now."""
        return len(self.models)


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
