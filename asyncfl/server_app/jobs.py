"""What the engine tracks and counts, and the parts it talks to (as protocols, so fakes can stand in).

``Job`` is one dispatched train request; ``EngineStats`` the counters a run's summary is
built from. The protocols name exactly what the engine calls on Flower's Grid, on the
run folder's recorder, on the train-metrics sink and on federated evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from flwr.app import RecordDict


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
    """Sends the model to a sample of nodes for evaluation (see :mod:`asyncfl.server_app.federated_eval`)."""

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
    held_dispatches: int = 0  # times free slots waited for the strategy's next version (dispatch-hold)
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

    #: Fields that are moments of this process's monotonic clock: not carried into a resumed run.
    process_fields = ("first_push_wall", "last_arrival_wall")

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
        if worker_node is not None:
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
