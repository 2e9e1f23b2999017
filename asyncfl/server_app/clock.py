"""The engine's two clocks: what time it is, how long a job takes, which reply is accepted next.

* :class:`VirtualClock` (simulation): a job's duration is drawn from the delay model when
  it is dispatched; replies are accepted strictly in (finish time, dispatch number) order,
  whatever order the Grid returns them in, so the same seed gives the same run. Time moves
  only when the engine accepts an event (and by measured server compute, when asked).
* :class:`WallClock` (deployments): time is seconds since the run started; replies are
  accepted in the order they were pulled; nodes come and go, and a job on a node that left
  is lost at once. With ``emulate-delay-scale > 0`` each request carries ``emulate-seconds``
  (the delay model's duration times the scale) and a ClientApp that pads its reply to it
  shows asynchrony on uniform hardware.

Both time jobs out on wall seconds (``timeout``): a reply that never comes is lost in a
simulation too. Seconds the SuperLink could not be reached do not count toward a job's timeout
(:attr:`VirtualClock.outage_seconds_since`, from the run's :class:`~asyncfl.server_app.transport.Link`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from asyncfl import protocol
from asyncfl.server_app.puller import ThreadedPuller
from asyncfl.server_app.simulation_workers import flower_simulation_workers

#: Wall clock: how many of the latest jobs' durations estimate a job's (median): the due time of one in flight.
RECENT_DURATIONS = 32
#: Wall clock: replies reporting train-seconds needed before the jobs in flight are capped at the measured parallelism.
CAP_AFTER_REPLIES = 8
#: Wall clock: how many of the latest process names kept (:class:`ClientWindow`) count the processes that train.
PROCESS_WINDOW = 128
#: Wall clock: replies after which the nodes online no longer count as the clients replying lately, however few of
#: them replied (nodes online that get no job: no data, or held back).
EARLY_REPLIES = 4 * RECENT_DURATIONS
#: Wall clock: the most entries one client holds in a window of reported timings or processes, as a multiple of an
#: even share (the window's length / the clients replying lately), so that a fast node fills its share, not the window.
SHARE_MULTIPLE = 3


class ClientWindow:
    """The latest ``length`` values replies reported, each client holding at most ``SHARE_MULTIPLE`` x an even
    share of them: what a node reports about its own jobs is one participant's word among the others'."""

    def __init__(self, length: int) -> None:
        self.entries: deque[tuple[int, object]] = deque(maxlen=length)
        self.counts: dict[int, int] = {}

    def add(self, client: int, value, clients: int) -> bool:
        """Keep ``client``'s ``value`` unless the client already holds its most of the window, shared among
        ``clients`` (those replying lately); whether it was kept."""
        if self.counts.get(client, 0) * max(1, clients) >= SHARE_MULTIPLE * self.entries.maxlen:
            return False
        if len(self.entries) == self.entries.maxlen:
            oldest = self.entries[0][0]
            self.counts[oldest] -= 1
            if not self.counts[oldest]:
                del self.counts[oldest]
        self.entries.append((client, value))
        self.counts[client] = self.counts.get(client, 0) + 1
        return True

    def values(self) -> list:
        return [value for _, value in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


if TYPE_CHECKING:
    from flwr.app import Message

    from asyncfl.options import EngineConfig
    from asyncfl.server_app.engine import Job
    from asyncfl.server_app.transport import Link


def no_outage(since: float) -> float:
    """Seconds the SuperLink was unreachable since ``since``: none (a clock without a Link)."""
    return 0.0


def timed_out(job: "Job", timeout: float, outage_seconds_since: Callable[[float], float],
              now_wall: float | None = None) -> bool:
    """Whether ``job`` has been out longer than ``timeout`` wall seconds at ``now_wall`` (``time.monotonic()``;
    read here when not given), not counting those the SuperLink could not be reached (a job cannot come back
    then)."""
    age = (time.monotonic() if now_wall is None else now_wall) - job.sent_wall
    return age > timeout and age - outage_seconds_since(job.sent_wall) > timeout


class Clock(Protocol):
    """What the engine asks of a clock."""

    #: Nodes may leave and join during the run (track who is online; wait for one to come back).
    nodes_come_and_go: bool
    #: Jobs may wait in a queue for a worker, so ``cap-in-flight`` keeps fewer out (:meth:`in_flight_cap`).
    jobs_queue: bool
    #: Seconds the SuperLink was unreachable since a moment (``time.monotonic()``): not part of a job's timeout.
    outage_seconds_since: Callable[[float], float]
    #: Clock time one second of server compute costs (``server-time-scale``; 0 on the wall clock, where it is
    #: already on the clock).
    server_time_scale: float

    def now(self, last_event: float) -> float:
        """The current time, given the time of the last accepted event."""

    def new_job(self, client: int) -> tuple[float, dict]:
        """What a new job to ``client`` is stamped with: its duration (its finish = dispatch time + this; 0: known
        on arrival) and the extra keys of its request."""

    def pick(self, in_flight: dict[str, "Job"], inbox: dict[str, "Message"], online: set[int], last_event: float,
             timeout: float) -> "tuple[Job, Message | None] | None":
        """The next job to accept and its reply (``None``: lost), or ``None`` when none is decided yet."""

    def next_version(self, in_flight: dict[str, "Job"], pending: int, hold: float) -> tuple[float, float] | None:
        """``dispatch-hold``: when the jobs in flight are due to bring the ``pending`` arrivals the strategy's next
        version needs (the ``pending``-th of their expected finishes), and how long a freed slot may wait for it:
        ``hold`` x a job's compute, plus the time a job waits before it starts (dead time whichever model it
        carries). ``None``: no estimate of a job's duration yet."""

    def observe_train_seconds(self, job: "Job", seconds: float, in_flight: int, process: str | None = None) -> None:
        """An accepted reply said its ClientApp trained for ``seconds`` (``train-seconds``) in ``process`` (its
        ``asyncfl-worker`` record, if any); ``in_flight`` jobs were out when it was accepted (this one included)."""

    def in_flight_cap(self, concurrency: int) -> int:
        """How many jobs to keep in flight, at most ``concurrency``: those the workers can start soon."""

    def puller(self, grid, concurrency: int) -> ThreadedPuller | None:
        """How replies are pulled: ``None`` for one ``pull_messages`` call over every waiting message."""

    def resume_at(self, clock: float) -> None:
        """A resumed run goes on from ``clock`` (the checkpoint's time)."""


class VirtualClock:
    """Simulated time: durations drawn per job, replies accepted in virtual finish order."""

    nodes_come_and_go = False
    jobs_queue = False  # a virtual job starts when it is dispatched

    def __init__(self, delays, server_time_scale: float = 0.0) -> None:
        self.delays = delays
        self.server_time_scale = server_time_scale
        #: Seconds the SuperLink was unreachable since a moment (``time.monotonic()``): not part of a job's timeout.
        self.outage_seconds_since: Callable[[float], float] = no_outage

    def now(self, last_event: float) -> float:
        return last_event

    def new_job(self, client: int) -> tuple[float, dict]:
        return self.delays.job_duration(client), {}

    def pick(self, in_flight, inbox, online, last_event, timeout):
        head = min(in_flight.values(), key=lambda j: (j.finish, j.seq))
        if head.message_id in inbox:
            return head, inbox.pop(head.message_id)
        if timed_out(head, timeout, self.outage_seconds_since):
            return head, None
        return None

    def next_version(self, in_flight, pending, hold):
        if not in_flight:
            return None
        # finishes are drawn at dispatch; a job's duration is the median in flight: a few slow clients' jobs must
        # not stretch the fast ones' wait
        typical = float(np.median([job.finish - job.start for job in in_flight.values()]))
        return sorted(job.finish for job in in_flight.values())[pending - 1], hold * typical

    def observe_train_seconds(self, job, seconds, in_flight, process=None):
        pass  # a virtual job starts when it is dispatched and lasts what was drawn for it

    def in_flight_cap(self, concurrency):
        return concurrency  # nothing queues on the virtual clock

    def puller(self, grid, concurrency: int) -> None:
        return None

    def resume_at(self, clock: float) -> None:
        pass  # the virtual clock is the engine's own: restored with it


class WallClock:
    """Real time: replies accepted as they are pulled; jobs on nodes that left are lost at once."""

    nodes_come_and_go = True
    jobs_queue = True  # Flower's simulation runs many nodes' jobs on a few workers
    server_time_scale = 0.0  # server compute is already on the clock

    def __init__(self, delays, emulate_delay_scale: float = 0.0) -> None:
        self.delays = delays  # drawn from only to emulate slow clients (emulate-delay-scale)
        self.emulate_delay_scale = emulate_delay_scale
        self.started = time.monotonic()
        self.recent_durations: deque[float] = deque(maxlen=RECENT_DURATIONS)
        # the latest RECENT_DURATIONS distinct clients that replied, oldest first, one entry each however fast:
        # client -> (its node, whether its latest reply reported timings)
        self.recent_repliers: dict[int, tuple[int, bool]] = {}
        self.online = 0  # nodes online at the latest pick: before many have replied, the clients to share among
        self.online_nodes: set[int] | None = None  # those nodes (None: not told yet)
        self.replies_seen = 0
        # replies that report train-seconds: (compute, round trip - compute, jobs out) of the latest ones
        self.reported = ClientWindow(RECENT_DURATIONS)
        self.recent_processes = ClientWindow(PROCESS_WINDOW)  # which process trained each reply
        self._cap: tuple[tuple, int] | None = None  # ((concurrency, workers), cap): asked at every dispatch
        # Flower's simulation runtime: its ClientApp actors, counted (cap-in-flight for a ClientApp that reports
        # no train-seconds); None elsewhere
        self.simulation_workers: Callable[[], int | None] | None = None
        self.outage_seconds_since: Callable[[float], float] = no_outage  # as VirtualClock's

    def now(self, last_event: float) -> float:
        return time.monotonic() - self.started

    def new_job(self, client: int) -> tuple[float, dict]:
        if self.emulate_delay_scale <= 0:
            return 0.0, {}
        return 0.0, {protocol.EMULATE_SECONDS: self.delays.job_duration(client) * self.emulate_delay_scale}

    def pick(self, in_flight, inbox, online, last_event, timeout):
        if len(online) != self.online:  # the clients to share among may have changed
            self.online, self._cap = len(online), None
        self.online_nodes = online
        for message_id, job in in_flight.items():
            if job.node_id not in online and message_id not in inbox:
                # the node left (crashed or stopped): its job will not come back
                job.finish, job.lost_reason = self.now(last_event), "node-offline"
                return job, None
        for message_id, reply in inbox.items():  # first pulled, first accepted
            job = in_flight[message_id]
            job.finish = self.now(last_event)
            self.recent_durations.append(job.finish - job.start)
            self._replied(job.client, job.node_id, reported=False)
            del inbox[message_id]
            return job, reply
        now_wall = time.monotonic()  # one reading for every job out (thousands, at every pick)
        for job in in_flight.values():
            if timed_out(job, timeout, self.outage_seconds_since, now_wall):
                job.finish = self.now(last_event)
                return job, None
        return None

    def next_version(self, in_flight, pending, hold):
        if not self.recent_durations:
            return None
        typical = float(np.median(self.recent_durations))  # a job is due a usual duration after it started
        due = sorted(job.start + typical for job in in_flight.values())[pending - 1]
        # without train-seconds the round trip is all the engine knows of a job: a hold of ``hold`` x that
        if not self.reported or not self._reported_by_most():
            return due, hold * typical
        compute, waits, _ = zip(*self.reported.values())
        return due, hold * float(np.median(compute)) + float(np.median(waits))

    def observe_train_seconds(self, job, seconds, in_flight, process=None):
        round_trip = job.finish - job.start
        if not 0.0 <= seconds <= round_trip:  # not a measurement of this job (a clock step, a made-up value)
            return
        self._replied(job.client, job.node_id, reported=True)
        clients = self._clients()
        kept = self.reported.add(job.client, (seconds, round_trip - seconds, in_flight), clients)
        if isinstance(process, str):  # a node's word: a name, kept short
            kept = self.recent_processes.add(job.client, process[:protocol.WORKER_NAME_CHARS], clients) or kept
        if kept:
            self._cap = None

    def parallelism(self) -> float | None:
        """Jobs the workers run at once, by Little's law over the latest replies that report train-seconds:
        jobs in flight x (train + the shortest wait to start) / round trip. The shortest wait is transport and
        start-up, which every job pays; anything above it is a queue for a worker.
        ``None``: too few reports, or reported by fewer than half of the clients replying lately
        (:meth:`_reported_by_most`: one node's timings are not the fleet's)."""
        if len(self.reported) < CAP_AFTER_REPLIES or not self._reported_by_most():
            return None
        compute, waits, in_flight = zip(*self.reported.values())
        round_trip = float(np.mean(compute)) + float(np.mean(waits))
        if round_trip <= 0:
            return None
        return float(np.mean(in_flight)) * (float(np.mean(compute)) + min(waits)) / round_trip

    def _replied(self, client: int, node: int, reported: bool) -> None:
        """``client`` (on ``node``) replied: the newest of the latest ``RECENT_DURATIONS`` distinct clients that
        replied, its latest reply with timings reported or not (a reply this clock picked is marked reported
        when its timings are taken in: counted once)."""
        before = self.recent_repliers.pop(client, None)
        if before is None or before[1] != reported:  # who replies, or who reports, changed: the quorum may have
            self._cap = None
        self.recent_repliers[client] = (node, reported)
        if before is not None and before == (node, False) and reported:
            return  # the timings of the reply just picked: the same reply
        if len(self.recent_repliers) > RECENT_DURATIONS:
            del self.recent_repliers[next(iter(self.recent_repliers))]
        self.replies_seen += 1

    def _clients(self) -> int:
        """The clients replying lately: the latest distinct ones that replied, and, until half of the nodes online
        (up to ``RECENT_DURATIONS``) have replied or ``EARLY_REPLIES`` replies came, at least those nodes: the
        first nodes to reply are not the fleet, and nodes online that never get a job stop counting."""
        fleet = min(RECENT_DURATIONS, self.online)
        early = 2 * len(self.recent_repliers) < fleet and self.replies_seen < EARLY_REPLIES
        return max(len(self.recent_repliers), fleet if early else 0, 1)

    def _reported_by_most(self) -> bool:
        """At least half of the clients replying lately (:meth:`_clients`) have timings in the window, reported in
        their latest reply, from a node still online: a node whose later replies report nothing, or that left, no
        longer counts."""
        online = self.online_nodes
        reporters = sum(reported and client in self.reported.counts and (online is None or node in online)
                        for client, (node, reported) in self.recent_repliers.items())
        return 2 * reporters >= self._clients()

    def in_flight_cap(self, concurrency):
        workers = self.simulation_workers() if self.simulation_workers is not None else None
        if self._cap is None or self._cap[0] != (concurrency, workers):  # the figures change only with a reply
            self._cap = ((concurrency, workers), self._measured_cap(concurrency, workers))
        return self._cap[1]

    def _measured_cap(self, concurrency: int, workers: int | None) -> int:
        # Only where replies show fewer training processes than jobs in flight do jobs queue for a worker (Flower's
        # simulation runs many nodes on a few Ray actors). A deployment's node trains one job at a time, and a wait
        # there is transport or a SuperNode's idle poll: waiting for the next job would idle the node.
        processes = len(set(self.recent_processes.values())) if self._reported_by_most() else 0
        if not processes:  # a stock ClientApp reports no process: in Flower's simulation its actors are counted
            return concurrency if workers is None else max(1, min(concurrency, workers + 1))
        running = self.parallelism()
        # as many processes as names in the window: a process per job (a deployment's ClientApps), no queue
        if running is None or processes >= concurrency or processes == len(self.recent_processes):
            return concurrency
        # one job more than the workers run, so a worker that frees finds the next job there; below the workers no
        # job queues, so the estimate, and with it the cap, grows back by one per window of replies
        return max(1, min(concurrency, max(processes, math.ceil(running - 1e-9)) + 1))

    def resume_at(self, clock: float) -> None:
        self.started = time.monotonic() - clock  # wall time goes on from the checkpoint's, never back

    def puller(self, grid, concurrency: int) -> ThreadedPuller:
        # the grid is known from here on: inside Flower's simulation runtime its ClientApp actors can be counted
        self.simulation_workers = flower_simulation_workers(getattr(grid, "inner", grid))  # the Grid in its Link
        # message by message in threads, so one reply whose upload died with its SuperNode cannot stall every
        # other reply (see asyncfl.server_app.puller)
        return ThreadedPuller(grid, workers=max(8, concurrency))


def clock_for(config: "EngineConfig", delays, link: "Link | None" = None) -> VirtualClock | WallClock:
    """The clock ``config.clock`` names, drawing durations from the ``delays`` sampler; ``link``: the run's
    :class:`~asyncfl.server_app.transport.Link`, whose outages do not count toward a job's timeout."""
    clock = VirtualClock(delays, config.server_time_scale) if config.clock == "virtual" \
        else WallClock(delays, config.emulate_delay_scale)
    if link is not None:
        clock.outage_seconds_since = link.down_seconds_since
    return clock
