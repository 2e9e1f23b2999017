"""The async engine: the only code that talks to Flower's Grid.

One loop serves every method. It keeps ``concurrency`` jobs in flight (or, for
synchronous strategies, runs cohorts of that size), pulls every reply into a
local queue (pulls are destructive), accepts replies in clock order, validates
them, hands them to the strategy as :class:`~asyncfl.strategies.base.Arrival`
objects and evaluates the global model on a schedule.

The parts around the loop live beside it: the clock (:mod:`~asyncfl.server_app.clock`:
virtual or wall time, which reply is accepted next), the roster of clients
(:mod:`~asyncfl.server_app.roster`), reply checks (:mod:`~asyncfl.server_app.replies`),
the scoring schedule (:mod:`~asyncfl.server_app.scoring`) and the Grid waits
(:mod:`~asyncfl.server_app.transport`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import MessageType

from asyncfl import protocol
from asyncfl.callbacks import Callback, VersionInfo
from asyncfl.errors import ClientAppsFailing, NoNodesConnected, NothingToDispatch
from asyncfl.options import EngineConfig
from asyncfl.server_app.clock import clock_for
from asyncfl.server_app.codec import ModelCodec
from asyncfl.server_app.eligible import EligibleClients
from asyncfl.server_app.jobs import EngineStats, FederatedEvaluator, GridLike, Job, Recorder, TrainMetricsSink
from asyncfl.server_app.pacing import PollPacer
from asyncfl.server_app.replies import RejectedReply, read_train_reply
from asyncfl.server_app.resumable import Resumable
from asyncfl.server_app.roster import Roster
from asyncfl.server_app.scoring import EvaluateFn, ModelState, Scoring
from asyncfl.server_app.transport import wait_for_nodes
from asyncfl.server_app.versions import VersionStore
from asyncfl.simulation.presets import delay_sampler
from asyncfl.strategies.arrival import Arrival
from asyncfl.strategies.flower_options import MessageKeys, configs_by_node

if TYPE_CHECKING:  # the engine drives any Strategy; it needs the class only for annotations
    from asyncfl.server_app.checkpoint import Checkpoints  # noqa: F401 (annotation)
    from asyncfl.strategies.base import Strategy

log = logging.getLogger("asyncfl.engine")


class AsyncEngine(Resumable):
    """Runs one strategy against a Grid until a stop condition.

    Parameters
    ----------
    grid : GridLike
        Flower's Grid (or a fake with the same three methods).
    strategy : Strategy
        The server-side method.
    codec : ModelCodec
        Layout of the global model.
    initial : np.ndarray
        Flat initial global model.
    config : EngineConfig
        Scheduling, stop and evaluation settings.
    train_config : dict
        Local-training keys sent in every train request's ConfigRecord.
    evaluate_fn : EvaluateFn or None
        Centralised evaluation of a flat model; ``None``: no server-side evaluation rows.
    recorder : Recorder, optional
        Receives evaluation rows and progress.
    keys : MessageKeys, optional
        Record keys of requests and replies (Flower's ``"arrays"``, ``"config"``, ``"num-examples"``).
    train_metrics : TrainMetricsSink, optional
        Receives each accepted reply's content and the end of every round.
    federated_eval : FederatedEvaluator, optional
        Evaluates the model on a sample of nodes at every evaluation point.
    checkpoints : Checkpoints, optional
        Writes :meth:`snapshot` every ``checkpoints.every`` server versions and when the run stops.
    resume : dict, optional
        A checkpoint's state (:func:`asyncfl.server_app.checkpoint.read`): the run goes on from it.
    callbacks : sequence of Callback
        Told of every new server version and every scored evaluation (:mod:`asyncfl.callbacks`).
    """

    def __init__(
        self,
        grid: GridLike,
        strategy: Strategy,
        codec: ModelCodec,
        initial: np.ndarray,
        config: EngineConfig,
        train_config: dict,
        evaluate_fn: EvaluateFn | None,
        recorder: Recorder | None = None,
        keys: MessageKeys | None = None,
        train_metrics: TrainMetricsSink | None = None,
        federated_eval: FederatedEvaluator | None = None,
        checkpoints: Checkpoints | None = None,
        resume: dict | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.grid = grid
        self.strategy = strategy
        self.codec = codec
        self.versions = VersionStore(codec, initial)
        self.config = config
        # one record for the whole run, as Flower passes it to configure_train every round (changes made there last)
        self.train_config = ConfigRecord(dict(train_config))
        self._round_configs: tuple[int, dict[int, dict], dict] | None = None  # round, client -> config, default
        self.evaluate_fn = evaluate_fn
        self.recorder = recorder
        self.keys = keys or MessageKeys()
        self.train_metrics = train_metrics
        self.federated_eval = federated_eval
        self.stats = EngineStats()
        self.delays = delay_sampler(config.delays, config.seed)
        self._pick_rng = np.random.default_rng([config.seed, 3])
        self._in_flight: dict[str, Job] = {}
        self._inbox: dict[str, Message] = {}
        self.roster = Roster(grid, self.delays, config.identify_nodes)
        self._pulled_at: dict[str, float] = {}
        self.clock = clock_for(config, self.delays)
        self._puller = self.clock.puller(grid, config.concurrency)
        self._busy: Counter[int] = Counter()  # client -> jobs in flight (> 1 only with pipelined late jobs)
        self._eligible = EligibleClients()  # clients a new job may go to (idle, with data, online)
        self._round_start = 0.0
        self._now = 0.0  # the clock at the last accepted event
        self.callbacks = list(callbacks)
        self._last_told: tuple[int, int] | None = None
        self.scoring = Scoring(config.eval_every, evaluate_fn, self.stats, recorder, federated_eval,
                               on_row=self._tell_evaluation if self.callbacks else None)
        self._seq = 0
        self._pacer = PollPacer()
        self._failures_in_a_row = 0
        self._expired_jobs = 0  # lost to job-timeout, or replies Flower dropped as older than their TTL
        self.checkpoints = checkpoints
        self._journaling = checkpoints is not None and self.clock.nodes_come_and_go  # replies cannot be had again
        if self._journaling:
            checkpoints.journaling = True
        self._resume = resume

    # ----------------------------------------------------------------- setup
    def discover_clients(self) -> list[int]:
        """Wait for nodes, ask each for its ``partition-id`` and fix the client order.

        Clients are ordered by partition id, so a seeded run picks the same data
        whatever node ids the SuperLink assigned. Nodes that do not answer the
        query (e.g. stock ClientApps) follow, ordered by node id.
        """
        wanted = -(-self.config.concurrency // self.config.jobs_per_client)  # nodes that fill every slot
        nodes = wait_for_nodes(self.grid, wanted, self.config.wait_for_nodes, on_wait=lambda connected: log.info(
            "%d node(s) connected, %d fill the concurrency of %d: waiting up to %.0fs (wait-for-nodes) for more",
            connected, wanted, self.config.concurrency, self.config.wait_for_nodes))
        if not nodes:
            raise NoNodesConnected(f"no SuperNode connected within wait-for-nodes={self.config.wait_for_nodes}s")
        # a node's first answer may wait for its worker to start: allow it as long as a job (job-timeout)
        self.roster.start(nodes, max(self.config.wait_for_nodes, self.config.job_timeout))
        self.stats.unidentified_nodes = self.roster.unidentified
        self._eligible.grow(len(self.roster))
        self._update_eligible(range(len(self.roster)))
        return self.clients

    def _update_eligible(self, clients) -> None:
        """Re-evaluate whether each of ``clients`` may get a new job: idle (or pipelined late clients, who may
        train while a late job is out), with training data, and online (wall clock)."""
        pipelined = self.config.pipeline_late_clients and self.strategy.synchronous
        tracked = self.clock.nodes_come_and_go
        slots = self.config.jobs_per_client
        for i in clients:
            self._eligible.set(i, (pipelined or self._busy[i] < slots) and i not in self.roster.no_data
                               and (not tracked or self.roster.nodes[i] in self.roster.online))

    def _refresh_nodes(self) -> None:
        """Where nodes come and go (wall clock): follow who is online and take in nodes that joined."""
        if not self.clock.nodes_come_and_go:
            return
        changed = self.roster.refresh()
        if changed:
            self.stats.unidentified_nodes = self.roster.unidentified
            self._eligible.grow(len(self.roster))
            self._update_eligible(changed)

    # ------------------------------------------------------------------ loop
    def run(self) -> EngineStats:
        """Run until ``max-arrivals`` accepted arrivals or ``max-virtual-time``."""
        if not len(self.roster):
            self.discover_clients()
        self.strategy.trained_entries = self.codec.trained_entries()
        self.strategy.on_start(len(self.roster), concurrency=self.config.concurrency)
        if self._resume is not None:
            self._restore(self._resume)
        else:
            self._evaluate_until(0.0)
            if not self.stats.evaluations:  # evaluation by versions only: score the initial model too
                self._record_evaluation(0.0)
        while not self._should_stop():
            if self.checkpoints is not None and self.checkpoints.due(self.versions.version):
                self._checkpoint()
            self._top_up()
            if not self._in_flight:
                self._wait_for_an_online_node()
            job, reply = self._next_completion()
            self._check_not_all_failing()
            if self.config.max_virtual_time and job.finish > self.config.max_virtual_time:
                self._now = self.config.max_virtual_time
                self._evaluate_until(self._now)
                break
            self._evaluate_until(job.finish)
            self._now = max(self._now, job.finish)  # server time (server-time-scale) may have moved it ahead
            self._complete(job, reply)
            if self.recorder is not None:
                self.recorder.on_progress(self._now, self.stats.arrivals)
        if self.checkpoints is not None:  # the stopped run's state: resume it with a later stop to extend it
            self._checkpoint()
            self.checkpoints.close()
        self.scoring.final(self._now, self._state(), by_rounds=bool(self.config.eval_every_rounds))
        self._abandon_in_flight()
        if self.federated_eval is not None:
            self.federated_eval.finish()
        return self.stats

    def _wait_for_an_online_node(self) -> None:
        """Where nodes come and go, every node may be gone for a while: wait up to ``wait-for-nodes`` for one."""
        deadline = time.monotonic() + (self.config.wait_for_nodes if self.clock.nodes_come_and_go else 0.0)
        while not self._in_flight and time.monotonic() < deadline:
            time.sleep(self.roster.refresh_every)
            self._top_up()
        if not self._in_flight:
            raise NothingToDispatch("no job could be dispatched: no idle client online")

    def _check_not_all_failing(self) -> None:
        """Abort when every one of many consecutive jobs failed: a broken ClientApp, not bad luck."""
        limit = 5 * self.config.concurrency + 10
        if self._failures_in_a_row >= limit:
            rejected = dict(self.stats.rejected)
            hint = (f"; most of them ran out of time (no reply, or Flower dropped a reply older than its message's "
                    f"TTL = job-timeout = {self.config.job_timeout:g} s): if the ClientApps are slow rather than "
                    "broken, raise job-timeout"
                    if self._expired_jobs * 2 >= sum(rejected.values()) else "")
            raise ClientAppsFailing(
                f"the last {limit} jobs all failed (rejected: {rejected}); "
                f"check the ClientApp logs: the run cannot make progress{hint}"
            )

    def _last_arrival(self) -> bool:
        return bool(self.config.max_arrivals) and self.stats.arrivals + 1 >= self.config.max_arrivals

    def _should_stop(self) -> bool:
        max_arrivals, max_rounds = self.config.max_arrivals, self.config.max_rounds
        return ((bool(max_arrivals) and self.stats.arrivals >= max_arrivals)
                or (bool(max_rounds) and self.round >= max_rounds))

    @property
    def round(self) -> int:
        """Rounds completed: accepted updates // ``round-arrivals`` (Flower's ``num_rounds`` under an
        asynchronous strategy), or server versions when ``round-arrivals`` is 0 (synchronous strategies)."""
        if self.config.round_arrivals:
            return self.stats.arrivals // self.config.round_arrivals
        return self.versions.version

    def _clock(self) -> float:
        return self.clock.now(self._now)

    # -------------------------------------------------------------- dispatch
    def _round_open(self) -> bool:
        """Synchronous strategies: is some in-flight job due in the current round?

        Without a ``round-deadline`` a round waits for every job. With one
        (virtual clock), jobs finishing after ``round start + deadline`` are late:
        the round closes without them and they arrive, stale, in a later round
        (the semi-asynchronous setting of the gradient-inversion paper, Sec. 3).
        """
        if not self.config.round_deadline:
            return bool(self._in_flight)
        due = self._round_start + self.config.round_deadline
        return any(job.finish <= due for job in self._in_flight.values())

    def _top_up(self) -> None:
        """Fill free slots; with ``jobs-per-client`` > 1 a client picked once may be picked again in a next
        draw (one draw picks each client at most once), until the slots are full or no client has room."""
        while self._dispatch_batch() and self.config.jobs_per_client > 1:
            pass

    def _dispatch_batch(self) -> int:
        """Draw up to the free slots among the eligible clients, without replacement, and push their jobs;
        returns how many were pushed."""
        if self.strategy.synchronous and self._round_open():
            return 0
        self._refresh_nodes()
        late = len(self._in_flight) if self.strategy.synchronous else 0  # late jobs belong to earlier rounds
        want = self.config.concurrency - len(self._in_flight) + late
        # a pipelined late client trains again while its late job is out (the GI paper's delayed clients train
        # every round; at this point every job still in flight is late, the round having closed)
        idle = len(self._eligible)
        if want <= 0 or not idle:
            return 0
        # positions among the eligible clients in index order: the same draws as from the list of them
        chosen = [self._eligible.kth(int(p)) for p in self._pick_rng.choice(idle, size=min(want, idle), replace=False)]
        start = self._clock()
        self._round_start = start
        messages, jobs = [], []
        for client in (int(c) for c in chosen):
            version = self.versions.acquire()
            seq = self._seq
            self._seq += 1
            duration = self.clock.job_duration(client)
            config = self._config_for(client)
            config[protocol.MODEL_VERSION] = version
            config[protocol.JOB_SEED] = protocol.job_seed(self.config.seed, protocol.ENGINE_STREAM, seq)
            config[protocol.DISPATCH_TIME] = float(start)  # the clock the job starts at (variant data drifts with it)
            config.update(self.clock.request_keys(client))
            custom = self.strategy.dispatch_model(client, self.versions.current)
            if custom is not None:  # an extrapolated model may hold negative BatchNorm variances
                custom, _ = self.codec.clamp_variances(custom)
            arrays = self.codec.to_record(custom) if custom is not None else self.versions.record(version)
            content = RecordDict({self.keys.arrays: arrays, self.keys.config: ConfigRecord(config)})
            messages.append(
                Message(
                    content,
                    dst_node_id=self.roster.nodes[client],
                    message_type=MessageType.TRAIN,
                    ttl=self.config.job_timeout,
                )
            )
            jobs.append(Job("", self.roster.nodes[client], client, version, start, start + duration, seq, 0.0,
                            sent_model=custom, request=config))
        pushing = time.monotonic()
        message_ids = list(self.grid.push_messages(messages))
        sent = time.monotonic()
        if message_ids and self.stats.first_push_wall is None:
            self.stats.first_push_wall = pushing
        for job, message_id in zip(jobs, message_ids):
            job.message_id, job.sent_wall = message_id, sent
            self._in_flight[message_id] = job
            self._busy[job.client] += 1
            self._update_eligible((job.client,))
        for job in jobs[len(message_ids) :]:  # refused by the SuperLink
            self.versions.release(job.version)
            self.stats.reject("push-refused")
            log.warning("job %d to client %d rejected: the SuperLink refused the push (push-refused)", job.seq,
                        job.client)
        self.stats.dispatched += len(message_ids)
        return len(message_ids)

    def _config_for(self, client: int) -> dict:
        """The train config of a job to ``client``: what the strategy's ``configure_train`` said for the round in
        progress (Flower's hook, called once per round), ``server-round`` being that round (a schedule on it
        advances with client work, as under FedAvg)."""
        round_ = self.round + 1
        if self._round_configs is None or self._round_configs[0] != round_:
            if not self.strategy.overrides("configure_train"):  # Flower's default: no messages to build
                self.train_config[protocol.SERVER_ROUND] = round_
                self._round_configs = (round_, {}, dict(self.train_config))
            else:
                by_node = configs_by_node(self.strategy.configure_train(
                    round_, self.versions.record(self.versions.version), self.train_config, self.grid), self.keys.config)
                # by client index: node ids change when a run is resumed
                by_client = {self.roster.index_of[node]: config for node, config in by_node.items()
                             if node in self.roster.index_of}
                default = next(iter(by_node.values()), dict(self.train_config))
                self._round_configs = (round_, by_client, default)
        _, by_client, default = self._round_configs
        config = dict(by_client.get(client, default))
        config.setdefault(protocol.SERVER_ROUND, round_)
        return config

    # -------------------------------------------------------------- receive
    def _pull(self) -> int:
        waiting = [mid for mid in self._in_flight if mid not in self._inbox]
        if not waiting:
            return 0
        got = 0
        replies = self._puller.poll(waiting) if self._puller is not None else self.grid.pull_messages(waiting)
        for reply in replies:
            reply_to = reply.metadata.reply_to_message_id
            if reply_to in self._in_flight:
                self._inbox[reply_to] = reply
                self._pulled_at[reply_to] = time.monotonic()
                got += 1
        return got

    def _next_completion(self) -> tuple[Job, Message | None]:
        """Block until the next job to accept is known; ``None`` reply = lost."""
        while True:
            started = time.perf_counter()
            got = self._pull()
            pull_seconds = time.perf_counter() - started
            if self.federated_eval is not None:
                self.federated_eval.poll()
            picked = self._pick_ready()
            if picked is not None:
                self._pacer.progress()
                return picked
            self._pacer.wait(pull_seconds, got)

    def _pick_ready(self) -> tuple[Job, Message | None] | None:
        self._refresh_nodes()
        return self.clock.pick(self._in_flight, self._inbox, self.roster.online, self._now, self.config.job_timeout)

    # ---------------------------------------------------------------- accept
    def _complete(self, job: Job, reply: Message | None) -> None:
        started = time.perf_counter()
        del self._in_flight[job.message_id]
        self._busy[job.client] -= 1
        self._update_eligible((job.client,))
        if self._puller is not None:
            self._puller.forget(job.message_id)
        try:
            arrival = self._to_arrival(job, reply)
            self._failures_in_a_row = 0 if arrival is not None else self._failures_in_a_row + 1
            if self._journaling:
                self._journal(job, arrival)
            if arrival is not None:
                if self.config.overlap and not self.strategy.synchronous and not self._last_arrival():
                    self._top_up()  # the freed slot gets the pre-update model: server compute hidden, +1 staleness
                compute_started = time.perf_counter()
                new_model = self.strategy.on_arrival(arrival, self.versions.current)
                self._now += self.clock.server_time(time.perf_counter() - compute_started)
                self._accepted(arrival, new_model)
        finally:
            self.versions.release(job.version)
        if self.strategy.synchronous and not self._round_open():
            if self._journaling:
                self.checkpoints.record({"kind": "round-end"})
            new_model = self.strategy.on_round_end(self.versions.current)
            if new_model is not None:
                self._advance(new_model)
        self.stats.server_seconds += time.perf_counter() - started

    def _to_arrival(self, job: Job, reply: Message | None) -> Arrival | None:
        if reply is None:
            if job.lost_reason == "node-offline":
                log.warning("job %s lost: client %d's node went offline", job.seq, job.client)
            else:
                log.warning("job %s to client %d lost (no reply in %.0fs)", job.seq, job.client, self.config.job_timeout)
                self._expired_jobs += 1
            self.stats.reject(job.lost_reason)
            return None
        try:
            weights = read_train_reply(reply, self.codec, self.keys)
        except RejectedReply as rejected:
            log.warning("client %d reply rejected (%s): %s", job.client, rejected.reason, rejected)
            self.stats.reject(rejected.reason)
            self._expired_jobs += rejected.expired
            return None
        content = reply.content
        metrics = self.keys.metrics_of(content)
        num_examples = int(metrics.get(self.keys.weight, 0)) if metrics is not None else 0
        train_loss = next((float(metrics[k]) for k in protocol.TRAIN_LOSS_ALIASES if k in metrics), float("nan")) \
            if metrics is not None else float("nan")
        self._record_transport(job, content, metrics)
        worker = content.config_records.get(protocol.WORKER_RECORD)
        if worker is not None and protocol.RAY_NODE in worker:
            node = str(worker[protocol.RAY_NODE])
            self.stats.by_worker[node] = self.stats.by_worker.get(node, 0) + 1
        if self.train_metrics is not None and metrics is not None:
            self.train_metrics.add(RecordDict({"metrics": metrics}))
        return Arrival(
            client_index=job.client,
            base_version=job.version,
            staleness=self.versions.version - job.version,
            weights=weights,
            base=job.sent_model if job.sent_model is not None else self.versions.model(job.version),
            num_examples=num_examples,
            train_loss=train_loss,
            time=job.finish,
        )

    def _record_transport(self, job: Job, content: RecordDict, metrics) -> None:
        """Bytes of the reply's arrays as serialized, its round trip, and the client's own compute time."""
        arrays = content.array_records[self.keys.arrays]
        self.stats.reply_bytes.append(sum(len(array.data) for array in arrays.values()))
        pulled = self._pulled_at.pop(job.message_id, None)
        if pulled is not None:
            self.stats.round_trip_seconds.append(pulled - job.sent_wall)
            tally = self.stats.tally(job.client)
            tally[2] += pulled - job.sent_wall
            tally[3] += 1
        if metrics is not None and "train-seconds" in metrics:
            self.stats.client_train_seconds.append(float(metrics["train-seconds"]))

    def _accepted(self, arrival: Arrival, new_model: np.ndarray | None) -> None:
        self.stats.arrivals += 1
        self.stats.last_arrival_wall = time.monotonic()
        self.stats.staleness.append(arrival.staleness)
        tally = self.stats.tally(arrival.client_index)
        tally[0] += 1
        tally[1] += arrival.staleness
        if new_model is not None:
            if not np.isfinite(new_model).all():
                raise FloatingPointError(f"strategy produced a non-finite model after arrival {self.stats.arrivals}")
            new_model, clamped = self.codec.clamp_variances(new_model)
            self.stats.clamped_variances += clamped
            self._advance(new_model)
        per_round = self.config.round_arrivals
        if per_round and self.stats.arrivals % per_round == 0:
            self._round_done()

    def _advance(self, new_model: np.ndarray) -> None:
        """Make ``new_model`` the next server version (a round, when rounds are versions)."""
        version = self.versions.advance(new_model)
        if self.callbacks:
            info = VersionInfo(version, self.round, self.stats.arrivals, self._now,
                               lambda: self.versions.record(version))
            for callback in self.callbacks:
                callback.on_version(info)
        if not self.config.round_arrivals:
            self._round_done()

    def _tell_evaluation(self, state: ModelState, row: dict) -> None:
        told = (state.version, state.round)
        if told == self._last_told:  # the stop's row scores the model the last scheduled row scored
            return
        self._last_told = told
        info = VersionInfo(state.version, state.round, self.stats.arrivals, row["time"], state.record)
        for callback in self.callbacks:
            callback.on_evaluation(info, dict(row))

    def _round_done(self) -> None:
        """Close round :attr:`round`: aggregate its train metrics; evaluate when the round schedule says so."""
        if self.train_metrics is not None:
            self.train_metrics.on_round(self.round)
        every = self.config.eval_every_rounds
        if every and self.round % every == 0:
            self._record_evaluation(self._now)

    # ------------------------------------------------------------- evaluate
    def _state(self) -> ModelState:
        version = self.versions.version
        return ModelState(version, self.round, self.versions.current, lambda: self.versions.record(version),
                          self.clients)

    def _evaluate_until(self, clock: float) -> None:
        scored = len(self.stats.evaluations)
        self.scoring.until(clock, self._state)
        if self._journaling and len(self.stats.evaluations) > scored:
            # a replay scores these points here, between the same events: on the wall clock a point can be
            # reached by a failed job or a stop, which the journal's arrivals alone would not reproduce
            self.checkpoints.record({"kind": "scored", "until": clock})

    def _record_evaluation(self, at: float) -> None:
        self.scoring.score(at, self._state())

    def _abandon_in_flight(self) -> None:
        for job in list(self._in_flight.values()):
            self.versions.release(job.version)
        self._in_flight.clear()
        self._inbox.clear()

    # -------------------------------------------------------------- summary
    @property
    def clients(self) -> list[int]:
        """Node id of each client index, in the deterministic client order."""
        return list(self.roster.nodes)

    @property
    def client_sizes(self) -> list[int]:
        """Each client's reported training-set size (the median where a node reported none)."""
        return list(self.roster.sizes)

    @property
    def now(self) -> float:
        """The clock at the last accepted event."""
        return self._now

    @property
    def global_model(self) -> np.ndarray:
        """The current global model (flat)."""
        return self.versions.current
