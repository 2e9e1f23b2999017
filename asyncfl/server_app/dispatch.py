"""Jobs out: which clients get one, with which model and request, pushed to the Grid in one call.

Before any job, :meth:`Dispatcher.discover_clients` fixes the client order (by ``partition-id``,
so a seed picks the same data whatever node ids the SuperLink gave). Then, whenever slots are
free, :meth:`Dispatcher.top_up` draws clients uniformly (seeded) among the eligible ones
(:class:`Slots`, below), builds each request (the round's config from the
strategy's ``configure_train``, ``model-version``, ``job-seed``, ``dispatch-time`` and the
clock's keys) and pushes all of them at once; the version's ArrayRecord is encoded once.

Who may get a job
-----------------
Which clients a new job may go to, kept up to date instead of rebuilt on every dispatch.

The engine picks the clients of new jobs uniformly among the eligible ones (idle,
with data, online), in client-index order, with its seeded generator. Building
that list anew for every dispatch costs O(clients): with 10,000 clients it was a
visible share of the server's time per arrival. Here the eligible flags live in
a Fenwick (binary indexed) tree, so a flag change and "the k-th eligible client"
each cost O(log clients). Drawing positions ``0..count-1`` and mapping them
through :meth:`EligibleClients.kth` picks exactly the clients that drawing from
the materialised list did (numpy draws positions either way), so seeded runs
are unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

from asyncfl import protocol
from asyncfl.errors import NoNodesConnected
from asyncfl.options import EngineConfig
from asyncfl.server_app.codec import ModelCodec
from asyncfl.server_app.engine_state import EngineState, GridLike, Job
from asyncfl.server_app.roster import Roster
from asyncfl.server_app.transport import NODE_SETTLE_S, UNAVAILABLE_CODES, wait_for_nodes
from asyncfl.strategies.flower_options import MessageKeys, configs_by_node

if TYPE_CHECKING:
    from asyncfl.server_app.clock import Clock
    from asyncfl.strategies.base import Strategy

log = logging.getLogger("asyncfl.engine")


class EligibleClients:
    """A set of client indices ``0..n-1`` with O(log n) add, remove and k-th smallest."""

    def __init__(self, n: int = 0) -> None:
        self._flags = bytearray()
        self._tree = [0]
        self.count = 0
        self.grow(n)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, index: int) -> bool:
        return 0 <= index < len(self._flags) and bool(self._flags[index])

    def grow(self, n: int) -> None:
        """Make room for clients up to ``n - 1`` (new ones start ineligible)."""
        if n > len(self._flags):
            flags = [i for i in range(len(self._flags)) if self._flags[i]]
            self._flags = bytearray(n)
            self._tree = [0] * (n + 1)
            self.count = 0
            for i in flags:
                self.set(i, True)

    def set(self, index: int, eligible: bool) -> None:
        """Mark ``index`` eligible or not (no-op if it already is)."""
        eligible = bool(eligible)
        if bool(self._flags[index]) == eligible:
            return
        self._flags[index] = eligible
        delta = 1 if eligible else -1
        self.count += delta
        position = index + 1
        while position < len(self._tree):
            self._tree[position] += delta
            position += position & -position

    def kth(self, k: int) -> int:
        """The ``k``-th smallest eligible index (``k`` from 0)."""
        if not 0 <= k < self.count:
            raise IndexError(f"k={k} outside [0, {self.count})")
        position, remaining = 0, k + 1
        step = 1 << (len(self._tree) - 1).bit_length()
        while step:
            nxt = position + step
            if nxt < len(self._tree) and self._tree[nxt] < remaining:
                position = nxt
                remaining -= self._tree[nxt]
            step >>= 1
        return position  # 1-based tree position + 1 of the answer = 0-based index


class Slots:
    """Who may get a new job: each client's jobs in flight against ``jobs_per_client``, kept as
    :class:`EligibleClients` so a draw costs O(log clients).

    A client is eligible when it has a free slot (or, ``pipelined``, always: the GI paper's late clients train
    while a late job is out), has training data, where nodes come and go (``tracked``) is online, and has not
    sent more than its share of the recent updates while other jobs are out (``over_share``).
    """

    def __init__(self, roster, jobs_per_client: int, pipelined: bool, tracked: bool) -> None:
        self.roster = roster
        self.jobs_per_client = jobs_per_client
        self.pipelined = pipelined
        self.tracked = tracked
        self.busy: Counter[int] = Counter()  # client -> jobs in flight
        self.in_flight = 0
        self.eligible = EligibleClients()
        #: ``over_share(client)``: the client sent more than its share of recent updates (the update bound's rate
        #: window); it then gets no new job while another job is out, so a fast node cannot take the run's
        #: updates (and their versions) away from the others. ``None``: every idle client may get one.
        self.over_share = None
        self.held_back: set[int] = set()  # clients over their share, waiting for it to fall
        self.held_back_checks = 0  # dispatch checks that found a client over its share

    def __len__(self) -> int:
        return len(self.eligible)

    def update(self, clients) -> None:
        """Re-evaluate whether each of ``clients`` may get a new job."""
        roster = self.roster
        for i in clients:
            may = ((self.pipelined or self.busy[i] < self.jobs_per_client) and i not in roster.no_data
                   and (not self.tracked or roster.nodes[i] in roster.online))
            if may and self.over_share is not None and self.in_flight > self.busy[i] and self.over_share(i):
                self.held_back.add(i)
                self.held_back_checks += 1
                may = False
            else:
                self.held_back.discard(i)
            self.eligible.set(i, may)

    def update_all(self) -> None:
        """Take in every client of the roster (it may have grown) and re-evaluate each."""
        self.eligible.grow(len(self.roster))
        self.update(range(len(self.roster)))

    def refresh(self) -> bool:
        """Where nodes come and go: follow who is online and take in nodes that joined; True if any changed."""
        if not self.tracked:
            return False
        changed = self.roster.refresh()
        if changed:
            self.eligible.grow(len(self.roster))
            self.update(changed)
        return bool(changed)

    def take(self, client: int) -> None:
        """A job to ``client`` is in flight."""
        self.busy[client] += 1
        self.in_flight += 1
        self.update((client,))

    def free(self, client: int) -> None:
        """A job of ``client`` is done (accepted, rejected or lost)."""
        self.busy[client] -= 1
        self.in_flight -= 1
        self.update((client,))

    def draw(self, rng, want: int) -> list[int]:
        """Up to ``want`` eligible clients, without replacement: positions among the eligible clients in index
        order, so the same draws as from the list of them."""
        idle = self.eligible.count
        return [self.eligible.kth(int(p)) for p in rng.choice(idle, size=min(want, idle), replace=False)]


class Dispatcher:
    """Sends the engine's jobs; it shares the engine's :class:`EngineState` (jobs in flight, dispatch numbers,
    the client draw, the round's train config)."""

    def __init__(self, grid: GridLike, strategy: Strategy, codec: ModelCodec, config: EngineConfig,
                 keys: MessageKeys, clock: Clock, roster: Roster, state: EngineState) -> None:
        self.grid, self.strategy, self.codec, self.config, self.keys = grid, strategy, codec, config, keys
        self.clock, self.roster, self.state = clock, roster, state
        self.slots = Slots(roster, config.jobs_per_client, config.pipeline_late_clients and strategy.synchronous,
                           clock.nodes_come_and_go)
        # cap-in-flight acts where jobs queue for a worker, for an asynchronous strategy (a synchronous round is its
        # cohort)
        self._capped = config.cap_in_flight and clock.jobs_queue and not strategy.synchronous
        # a strategy that may send a client another model than the global one (its class's dispatch_model, or one
        # set on the instance)
        self._looks_ahead = strategy.looks_ahead or "dispatch_model" in vars(strategy)

    def discover_clients(self, resumed_clients: int = 0) -> list[int]:
        """Wait for nodes, ask each for its ``partition-id`` and fix the client order.

        Clients are ordered by partition id, so a seeded run picks the same data
        whatever node ids the SuperLink assigned. Nodes that do not answer the
        query (e.g. stock ClientApps) follow, ordered by node id. A resumed run
        (``resumed_clients``: the checkpoint's) waits for all of its clients, not only
        for those that fill the concurrency: it can go on only with the same ones.
        """
        wanted = -(-self.config.concurrency // self.config.jobs_per_client)  # nodes that fill every slot
        if resumed_clients:  # no settling on fewer: the resumed run can go on only with the same clients
            wanted = max(wanted, resumed_clients)
            nodes = wait_for_nodes(self.grid, wanted, self.config.wait_for_nodes,
                                   on_wait=lambda connected: log.info(
                                       "resuming a run of %d client(s), %d node(s) connected: waiting up to %.0fs "
                                       "(wait-for-nodes) for the others", resumed_clients, connected,
                                       self.config.wait_for_nodes))
        else:
            nodes = wait_for_nodes(self.grid, wanted, self.config.wait_for_nodes, on_wait=lambda connected: log.info(
                "%d node(s) connected, %d fill the concurrency of %d: waiting up to %.0fs (wait-for-nodes) for more, "
                "or until none joined for %.0fs", connected, wanted, self.config.concurrency,
                self.config.wait_for_nodes, NODE_SETTLE_S), settle=NODE_SETTLE_S)
        if not nodes:
            raise NoNodesConnected(f"no SuperNode connected within wait-for-nodes={self.config.wait_for_nodes}s")
        if len(nodes) < wanted:
            log.info("concurrency %d capped at %d job(s) in flight: %d node(s) x %d job(s) each%s",
                     self.config.concurrency, len(nodes) * self.config.jobs_per_client, len(nodes),
                     self.config.jobs_per_client, "; nodes that join later get jobs too" if
                     self.clock.nodes_come_and_go else "")
        # a node's first answer may wait for its worker to start: allow it as long as a job (timeout)
        self.roster.start(nodes, max(self.config.wait_for_nodes, self.config.timeout))
        self.state.stats.unidentified_nodes = self.roster.unidentified
        self.slots.update_all()
        return list(self.roster.nodes)

    def refresh_nodes(self) -> None:
        """Where nodes come and go (wall clock): follow who is online and take in nodes that joined."""
        if self.slots.refresh():
            self.state.stats.unidentified_nodes = self.roster.unidentified

    def round_open(self) -> bool:
        """Synchronous strategies: is some in-flight job due in the current round?

        Without a ``round-deadline`` a round waits for every job. With one
        (virtual clock), jobs finishing after ``round start + deadline`` are late:
        the round closes without them and they arrive, stale, in a later round
        (the semi-asynchronous setting of the gradient-inversion paper, Sec. 3).
        """
        if not self.config.round_deadline:
            return bool(self.state.in_flight)
        due = self.state.round_start + self.config.round_deadline
        return any(job.finish <= due for job in self.state.in_flight.values())

    def top_up(self, rounds_done: int) -> None:
        """Fill free slots: draw up to the free slots among the eligible clients, without replacement, and push their
        jobs in one call; with ``jobs-per-client`` > 1 a client picked once may be picked again in a next draw (one
        draw picks each client at most once), until the slots are full or no client has room."""
        state, synchronous = self.state, self.strategy.synchronous
        while not (synchronous and self.round_open()):
            if self.clock.nodes_come_and_go:
                self.refresh_nodes()
            late = len(state.in_flight) if synchronous else 0  # late jobs belong to earlier rounds
            want = (self.in_flight_limit() if self._capped else self.config.concurrency) - len(state.in_flight) + late
            # a pipelined late client trains again while its late job is out (the GI paper's delayed clients train
            # every round; at this point every job still in flight is late, the round having closed)
            if want <= 0 or not self.slots.eligible.count or self.holding():
                return
            state.held_since = -1.0
            start = state.round_start = self.clock.now(state.now)
            jobs = []
            for client in self.slots.draw(state.pick_rng, want):
                version = state.versions.acquire()
                seq = state.seq
                state.seq += 1
                duration, clock_keys = self.clock.new_job(client)
                config = self._config_for(client, rounds_done + 1)
                config[protocol.MODEL_VERSION] = version
                config[protocol.JOB_SEED] = protocol.job_seed(self.config.seed, protocol.ENGINE_STREAM, seq)
                config[protocol.DISPATCH_TIME] = float(start)  # the clock the job starts at (drifting data follows it)
                config.update(clock_keys)
                custom = self.strategy.dispatch_model(client, state.versions.current) if self._looks_ahead else None
                if custom is not None:  # an extrapolated model may hold negative BatchNorm variances
                    custom, _ = self.codec.clamp_variances(custom)
                jobs.append(Job("", self.roster.nodes[client], client, version, start, start + duration, seq, 0.0,
                                sent_model=custom, request=config))
            pushed = self.push(jobs)
            state.stats.dispatched += pushed
            if not pushed or self.config.jobs_per_client == 1:
                return

    def in_flight_limit(self) -> int:
        """``cap-in-flight``: an asynchronous strategy's jobs in flight on the wall clock are capped at what the
        workers can start soon (:meth:`WallClock.in_flight_cap`), so no job waits in a queue growing stale;
        ``concurrency`` stays what the strategy was configured for (FedBuff's buffer, the pace)."""
        concurrency = self.config.concurrency
        cap = self.clock.in_flight_cap(concurrency)
        if cap < concurrency:
            self.state.stats.count_in_flight_cap(cap)
        return cap

    def holding(self) -> bool:
        """``dispatch-hold``: whether free slots wait for the strategy's next version, due (the in-flight job that
        completes it, by the clock's estimate) within the clock's hold window of when they began to wait:
        ``dispatch-hold`` x a job's duration, plus on the wall clock the time jobs wait to start where replies
        report ``train-seconds`` (a job queued for a worker has not begun: its model can be chosen later at no
        cost). Never for a synchronous strategy, one that cannot say when it steps, or a version the jobs in
        flight cannot complete."""
        state, hold = self.state, self.config.dispatch_hold
        pending = self.strategy.arrivals_to_next_version() if hold > 0 and not self.strategy.synchronous else 0
        if pending <= 0 or len(state.in_flight) < pending:
            return False
        expected = self.clock.next_version(state.in_flight, pending, hold)
        if expected is None:
            return False
        due, window = expected
        now = self.clock.now(state.now)
        since = now if state.held_since < 0 else state.held_since
        if max(due, now) - since > window:  # overdue: expect it now
            return False
        if state.held_since < 0:
            state.stats.held_dispatches += 1
        state.held_since = since
        return True

    def push(self, jobs: list[Job]) -> int:
        """Send ``jobs`` (model: the one sent, else its version's record) in one ``push_messages`` call and put
        those the SuperLink took in flight; returns how many it took."""
        messages = []
        for job in jobs:
            arrays = self.codec.to_record(job.sent_model) if job.sent_model is not None \
                else self.state.versions.record(job.version)
            content = RecordDict({self.keys.arrays: arrays, self.keys.config: ConfigRecord(job.request)})
            messages.append(Message(content, dst_node_id=job.node_id, message_type=MessageType.TRAIN,
                                    ttl=self.config.timeout))
        pushing = time.monotonic()
        try:
            message_ids = list(self.grid.push_messages(messages)) if messages else []
        except BaseException:  # the run ends here (the SuperLink gone, an interrupt): the jobs never went out
            for job in jobs:
                self.state.versions.release(job.version)
            raise
        sent = time.monotonic()
        if message_ids and self.state.stats.first_push_wall is None:
            self.state.stats.first_push_wall = pushing
        for job, message_id in zip(jobs, message_ids):
            job.message_id, job.sent_wall, job.push_began = message_id, sent, pushing
            self.state.in_flight[message_id] = job
            self.slots.take(job.client)
        for job in jobs[len(message_ids):]:  # refused by the SuperLink
            self.state.versions.release(job.version)
            self.state.stats.reject("push-refused")
            log.warning("job %d to client %d rejected: the SuperLink refused the push (push-refused)", job.seq,
                        job.client)
        return len(message_ids)

    def resend_after_outage(self, job: Job, reply: Message | None) -> bool:
        """A job a SuperLink outage lost is no failure of its client: it was out while the SuperLink could not be
        reached (``grid.down_during``, the run's :class:`~asyncfl.server_app.transport.Link`) and came back lost,
        timed out or as the SuperLink's "unavailable" error (from when its push began: a push an outage cut may leave
        a message the restarted SuperLink does not have). Counted apart (``outage_jobs``) and, when its node is
        online, sent again at once (True): as it was on the virtual clock, so the run stays the one its seed gives;
        with the model in use now on the wall clock. Otherwise marked (``job.outage``: the engine frees its slot
        without counting a failure) and its client gets a job once its node is back. False for any other job."""
        if reply is not None and not (reply.has_error() and reply.error.code in UNAVAILABLE_CODES):
            return False
        down_during = getattr(self.grid, "down_during", None)
        if down_during is None or not down_during(job.push_began):  # a push the outage cut counts too
            return False
        self.state.stats.outage_jobs += 1
        if self.clock.nodes_come_and_go and job.node_id not in self.roster.online:
            job.outage = True
            return False
        if self.clock.nodes_come_and_go and job.sent_model is None and job.request is not None:
            self.state.versions.release(job.version)
            job.version = job.request[protocol.MODEL_VERSION] = self.state.versions.acquire()
            job.start = self.clock.now(self.state.now)
            job.request[protocol.DISPATCH_TIME] = float(job.start)
        log.info("job %d to client %d was lost to the SuperLink outage: sent again", job.seq, job.client)
        self.slots.free(job.client)
        self.state.stats.outage_resent += self.push([job])  # a refusal is counted there (push-refused)
        return True

    def _config_for(self, client: int, round_: int) -> dict:
        """The train config of a job to ``client``: what the strategy's ``configure_train`` said for the round in
        progress (Flower's hook, called once per round), ``server-round`` being that round (a schedule on it
        advances with client work, as under FedAvg)."""
        state = self.state
        if state.round_configs is None or state.round_configs[0] != round_:
            if not self.strategy.overrides("configure_train"):  # Flower's default: no messages to build
                state.train_config[protocol.SERVER_ROUND] = round_
                state.round_configs = (round_, {}, dict(state.train_config))
            else:
                by_node = configs_by_node(self.strategy.configure_train(
                    round_, self.state.versions.record(self.state.versions.version), state.train_config, self.grid),
                    self.keys.config)
                # by client index: node ids change when a run is resumed
                by_client = {self.roster.index_of[node]: config for node, config in by_node.items()
                             if node in self.roster.index_of}
                default = next(iter(by_node.values()), dict(state.train_config))
                state.round_configs = (round_, by_client, default)
        _, by_client, default = state.round_configs
        config = dict(by_client.get(client, default))
        config.setdefault(protocol.SERVER_ROUND, round_)
        return config
