"""The async engine: the only code that talks to Flower's Grid.

One loop serves every method. It keeps ``concurrency`` jobs in flight (or, for synchronous strategies, runs
cohorts of that size), pulls every reply into a local queue (pulls are destructive), accepts replies in clock
order, validates them, hands them to the strategy as :class:`~asyncfl.strategies.base.Arrival` objects and
evaluates the global model on a schedule.

A reply takes one path, step by step (``docs/engine.md``): pulled (:meth:`AsyncEngine._pull`),
picked by the clock, read into an Arrival or a rejection (:func:`~asyncfl.server_app.codec.read_reply`),
counted, handed to the strategy (:meth:`AsyncEngine.accept`), made a version, the round closed
(:meth:`AsyncEngine._close_rounds`), rows written (:class:`~asyncfl.server_app.scoring.Scoring`).
Everything the loop changes is one :class:`~asyncfl.server_app.engine_state.EngineState`; a checkpoint
is that plus the strategy's and the parts' own state (:mod:`~asyncfl.server_app.resume`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from asyncfl import protocol
from asyncfl.callbacks import Callback, VersionInfo
from asyncfl.errors import NothingToDispatch
from asyncfl.options import EngineConfig
from asyncfl.server_app import journal
from asyncfl.server_app.clock import clock_for
from asyncfl.server_app.codec import ModelCodec, RejectedReply, read_reply
from asyncfl.server_app.dispatch import Dispatcher, Slots
from asyncfl.server_app.engine_state import (EngineState, EngineStats, FederatedEvaluator, GridLike, Job, Recorder,
                                             TrainMetricsSink, VersionStore)
from asyncfl.server_app.pacing import PollPacer
from asyncfl.server_app.participants import ParticipantBounds
from asyncfl.server_app.resume import resume_from, snapshot
from asyncfl.server_app.roster import Roster
from asyncfl.server_app.scoring import EvaluateFn, ModelState, Scoring, TailAverage
from asyncfl.server_app.transport import SuperLinkUnreachable, guarded
from asyncfl.server_app.trusted_direction import TrustedDirection
from asyncfl.simulation.presets import delay_sampler
from asyncfl.strategies.arrival import Arrival
from asyncfl.strategies.flower_options import MessageKeys

if TYPE_CHECKING:  # the engine drives any Strategy; it needs the class only for annotations
    from asyncfl.server_app.checkpoint import Checkpoints  # noqa: F401 (annotation)
    from asyncfl.strategies.base import Strategy

log = logging.getLogger("asyncfl.engine")


class AsyncEngine:
    """Runs one strategy against a Grid until a stop condition.

    Parameters
    ----------
    grid : GridLike
        Flower's Grid (or a fake with the same three methods); its calls wait out a SuperLink outage (a
        :class:`~asyncfl.server_app.transport.Link` around it, unless it is one).
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
    trusted_direction : TrustedDirection, optional
        The server's descent on its trusted data, which every update is checked against (``trusted_train_fn``).
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
        trusted_direction: TrustedDirection | None = None,
    ) -> None:
        grid = self.grid = guarded(grid, config.timeout)
        self.strategy = strategy
        self.codec = codec
        self.config = config
        self.state = EngineState(VersionStore(codec, initial), np.random.default_rng([config.seed, 3]),
                                 train_config=ConfigRecord(dict(train_config)))
        # the run's counters and stored versions: the state's own objects (a resume loads into them, never
        # replaces them), named here so that the reply path reads them without an accessor call each time
        self.stats: EngineStats = self.state.stats
        self.versions: VersionStore = self.state.versions
        self.evaluate_fn = evaluate_fn
        self.recorder = recorder
        self.keys = keys or MessageKeys()
        self.train_metrics = train_metrics
        self.federated_eval = federated_eval
        self.delays = delay_sampler(config.delay_model, config.seed)
        self.clock = clock_for(config, self.delays, grid)  # a job's timeout does not run while the SuperLink is away
        # a deployment asks every node at once, a simulation one first (asyncfl.server_app.discovery)
        self.roster = Roster(grid, self.delays, config.identify_nodes, probe_first=not self.clock.nodes_come_and_go)
        self._puller = self.clock.puller(grid, config.concurrency)
        self.dispatcher = Dispatcher(grid, strategy, codec, config, self.keys, self.clock, self.roster, self.state)
        self.slots: Slots = self.dispatcher.slots  # who may get a new job
        self.bounds = ParticipantBounds(config.update_norm_bound, config.update_norm_action, codec.bound_groups(),
                                        self.dispatcher.slots, strategy, trusted_direction)
        self.callbacks = list(callbacks)
        self._last_told: tuple | None = None  # (version, round, the tail average's window)
        self._owners_told = 0
        #: Why the run ended ("running" until it does), for summary.json and the closing line (launch).
        self.stop_reason = "not started"
        self.scoring = Scoring(config.evaluate_every_time, config.evaluate_every, evaluate_fn, self.stats, recorder,
                               federated_eval, on_row=self._tell_evaluation if self.callbacks else None,
                               changed_only=self.clock.nodes_come_and_go,  # wall-clock points come regardless
                               tail=TailAverage(config.tail_average_rounds, codec.to_record))
        self._pacer = PollPacer()
        self.checkpoints = checkpoints
        self._journaling = checkpoints is not None and self.clock.nodes_come_and_go  # replies cannot be had again
        self._refill_first = self.clock.nodes_come_and_go and not strategy.synchronous  # wall clock, asynchronous
        #: A resumed run takes in its journal's replies (nothing recorded again, nothing dispatched meanwhile).
        self.replaying = False
        if self._journaling:
            checkpoints.journaling = True
        self._resume = resume

    def discover_clients(self) -> list[int]:
        """Wait for nodes and fix the client order (:meth:`Dispatcher.discover_clients`)."""
        return self.dispatcher.discover_clients()

    def push(self, jobs: list[Job]) -> int:
        """Send ``jobs`` and put those the SuperLink took in flight (:meth:`Dispatcher.push`)."""
        return self.dispatcher.push(jobs)

    # ------------------------------------------------------------------ loop
    def run(self) -> EngineStats:
        """Run until ``max-arrivals`` accepted arrivals or ``max-time``."""
        if not len(self.roster):
            self.dispatcher.discover_clients(len(self._resume["clients"]["sizes"]) if self._resume else 0)
        self._tell_owners()
        self.bounds.start(list(self.roster.sizes))
        self.strategy.trained_entries = self.codec.trained_entries()
        self.strategy.on_start(len(self.roster), concurrency=self.config.concurrency)
        if self._resume is not None:
            resume_from(self, self._resume)
        else:
            self.score_until(0.0)
            if not self.stats.evaluations:  # evaluation by versions only: score the initial model too
                self.scoring.score(0.0, self._model_state())
        state, unreachable = self.state, None
        self.stop_reason = "running"
        try:
            while not self._should_stop():
                if self.checkpoints is not None and self.checkpoints.due(self.versions.version):
                    self._checkpoint()
                self.dispatcher.top_up(self.state.rounds_closed)
                if not state.in_flight:
                    self._wait_for_an_online_node()
                job, reply = self._next_completion()
                if state.failures_in_a_row:  # a streak of failed jobs goes on: is every job out failing?
                    state.check_not_all_failing(self.config.concurrency, self.config.timeout)
                if self.config.max_time and job.finish > self.config.max_time:
                    state.now = self.config.max_time
                    self.score_until(state.now)
                    self.stop_reason = f"max-time {self.config.max_time:g} reached"
                    break
                if self.scoring.every_time:  # the clock's evaluation points (rounds are scored where they close)
                    self.score_until(job.finish)
                state.now = max(state.now, job.finish)  # server time (server-time-scale) may have moved it ahead
                self._complete(job, reply)
                if self.recorder is not None:
                    self.recorder.on_progress(state.now, self.stats.arrivals)
        except SuperLinkUnreachable as exc:  # ends as any stop does (checkpoint, last row), then says why
            unreachable, self.stop_reason = exc, f"superlink unreachable: {exc}"
            self.grid.end()
        if self._puller is not None:  # the puller's own counts, read once the loop that pulls has ended
            self.stats.reply_pulls, self.stats.reply_miss_gap = self._puller.pulls, self._puller.miss_gap
        if self.checkpoints is not None:  # the stopped run's state: resume it with a later stop to extend it
            self._checkpoint()
            self.checkpoints.close()
        self.scoring.final(state.now, self._model_state())
        self._abandon_in_flight()
        if self.federated_eval is not None:
            self.federated_eval.finish()
        if unreachable is not None:
            raise unreachable
        return self.stats

    def _wait_for_an_online_node(self) -> None:
        """Where nodes come and go, every node may be gone for a while: wait up to ``wait-for-nodes`` for one."""
        # after an outage, nodes may take until the outage limit to come back to a restarted SuperLink
        wait = max(self.config.wait_for_nodes, self.grid.recovery_wait()) if self.clock.nodes_come_and_go else 0.0
        deadline = time.monotonic() + wait
        while not self.state.in_flight and time.monotonic() < deadline:
            time.sleep(self.roster.refresh_every)
            self.dispatcher.top_up(self.state.rounds_closed)
        if not self.state.in_flight:
            raise NothingToDispatch("no job could be dispatched: no idle client online")

    def _tell_owners(self) -> None:
        """A strategy that keys state by who owns the data (the DP ledger) learns each new client's owner."""
        bind = getattr(self.strategy, "bind_owners", None)
        if bind is not None and len(self.roster.owners) != self._owners_told:
            bind(dict(self.roster.owners))
            self._owners_told = len(self.roster.owners)

    def _last_arrival(self) -> bool:
        return bool(self.config.max_arrivals) and self.stats.arrivals + 1 >= self.config.max_arrivals

    def _should_stop(self) -> bool:
        max_arrivals, num_rounds = self.config.max_arrivals, self.config.num_rounds
        if max_arrivals and self.stats.arrivals >= max_arrivals:
            self.stop_reason = f"max-arrivals {max_arrivals} reached"
        elif num_rounds and self.state.rounds_closed >= num_rounds:  # every round due is closed here
            self.stop_reason = f"num-rounds {num_rounds} reached"
        return self.stop_reason != "running"

    # ------------------------------------------------------- the reply path
    def _pull(self) -> int:
        """Step 1: pull every waiting reply into the inbox (a pull is destructive: a reply is pulled once)."""
        state = self.state
        waiting = [mid for mid in state.in_flight if mid not in state.inbox]
        if not waiting:
            return 0
        got = 0
        replies = (self.grid.pull_messages(waiting) if self._puller is None
                   else self._puller.poll(waiting, {mid: state.in_flight[mid].client for mid in waiting}))
        for reply in replies:
            reply_to = reply.metadata.reply_to_message_id
            # the first reply stays: a later one for the same job (a second pull after the SuperLink delivered
            # and deleted it) can only be Flower's "message unavailable" error, which must not replace it
            if reply_to in state.in_flight and reply_to not in state.inbox:
                state.inbox[reply_to] = reply
                state.pulled_at[reply_to] = time.monotonic()
                got += 1
        return got

    def _next_completion(self) -> tuple[Job, Message | None]:
        """Step 2: block until the clock says which job is accepted next; ``None`` reply = lost."""
        waited = False  # the pacer backs off only while this call waits: a pick after a wait polls fast again
        while True:
            started = time.perf_counter()
            got = self._pull()
            pull_seconds = time.perf_counter() - started
            if self.federated_eval is not None:
                self.federated_eval.poll()
            if self.clock.nodes_come_and_go:  # who is online; nodes that joined (and whose data they hold)
                self.dispatcher.refresh_nodes()
                self._tell_owners()
            picked = self.clock.pick(self.state.in_flight, self.state.inbox, self.roster.online, self.state.now,
                                     self.config.timeout)
            if picked is not None:
                if waited:
                    self._pacer.progress()
                return picked
            if self.state.held_since >= 0:  # wall clock: free slots held past their wait go out now
                self.dispatcher.top_up(self.state.rounds_closed)
            self._pacer.wait(pull_seconds, got)
            waited = True

    def _complete(self, job: Job, reply: Message | None) -> None:
        """Steps 3-6 for one job: free its slot, read its reply (and bound its update's norm), count it, hand an
        arrival to the strategy; a synchronous round ends when its last job is in."""
        state, started = self.state, time.perf_counter()
        del state.in_flight[job.message_id]
        if self._puller is not None:
            self._puller.forget(job.message_id)
        if self.grid.outages and self.dispatcher.resend_after_outage(job, reply):  # lost by the SuperLink: sent again
            return
        self.slots.free(job.client)
        base = job.sent_model if job.sent_model is not None else self.versions.models[job.version]
        try:
            self.take_in(job, reply, base)
        finally:
            self.versions.release(job.version)
        if self.strategy.synchronous and not self.dispatcher.round_open():
            if self._journaling:
                self.checkpoints.record({"kind": "round-end"})
            self.end_round()
        self.stats.server_seconds += time.perf_counter() - started

    def take_in(self, job: Job, reply: Message | None, base: np.ndarray,
                refused: RejectedReply | None = None) -> None:
        """Steps 3-5 for ``job``'s reply (``base``: the model it was sent), live or replayed from the wall clock's
        journal (:func:`~asyncfl.server_app.journal.replay`), which records it first: read, bound, count, accept.
        ``refused``: the reply's rejection, decided before it is read (one the journal cannot hold)."""
        state = self.state
        if self._journaling and not self.replaying:
            refused = journal.record_event(self.checkpoints, job, reply, state, self.codec, self.keys)
        # 3. read it: an Arrival, or the rejection saying why it gives nothing
        outcome = refused or read_reply(job, reply, self.codec, self.keys, self.versions.version, base,
                                        self.config.timeout)
        if isinstance(outcome, Arrival):  # 3b. the participant's bounds
            outcome = self.bounds.apply(outcome, job.sent_model is None)
            if self.slots.held_back:  # the shares moved: a held-back client whose share fell may get jobs again
                self.slots.update(list(self.slots.held_back))
        # 4. count it: a rejection by reason, in the failure streak unless an outage lost it; an arrival's
        # transport, compute time and train metrics
        pulled_wall = state.pulled_at.pop(job.message_id, None)
        if isinstance(outcome, RejectedReply):
            state.count_failure(job, outcome)
            return
        state.failures_in_a_row = 0
        state.failing_clients.clear()
        content = reply.content
        metrics = protocol.reply_metrics(content)
        state.stats.metrics_trimmed += isinstance(metrics, protocol.TrimmedMetrics)
        worker = content.config_records.get(protocol.WORKER_RECORD) or {}
        train_seconds = protocol.train_seconds(metrics)
        self.stats.count_reply(job, content, self.keys.arrays, train_seconds, pulled_wall, worker.get(protocol.RAY_NODE))
        # the wall clock learns how long jobs queue (dispatch-hold, cap-in-flight); its estimates are not in a
        # checkpoint, so a resumed run starts them afresh rather than from replayed jobs in flight it does not have
        if train_seconds is not None and not self.replaying:
            self.clock.observe_train_seconds(job, train_seconds, len(state.in_flight) + 1, worker.get(protocol.PROCESS))
        if self.train_metrics is not None and metrics is not None:  # weighted by the count as checked and capped
            self.train_metrics.add(RecordDict({"metrics": MetricRecord({**metrics,
                                                                        self.keys.weight: outcome.num_examples})}))
        # 5. the strategy takes it in
        if (self.config.overlap_server_compute and not self.strategy.synchronous and not self.replaying
                and not self._last_arrival()):
            # the freed slot gets the pre-update model: server compute hidden, +1 staleness
            self.dispatcher.top_up(state.rounds_closed)
        self.accept(outcome)

    def accept(self, arrival: Arrival) -> None:
        """Step 5: the strategy takes ``arrival`` in; the model it returns, if any, becomes the next version."""
        compute_started = time.perf_counter()
        new_model = self.strategy.on_arrival(arrival, self.versions.current)
        self.state.now += (time.perf_counter() - compute_started) * self.clock.server_time_scale
        self.stats.count_arrival(arrival.client_index, arrival.staleness, time.monotonic())
        if new_model is not None:
            self._advance(new_model)
        self._close_rounds()

    def end_round(self) -> None:
        """A synchronous strategy's round has all its jobs in: its ``on_round_end`` may make a version."""
        new_model = self.strategy.on_round_end(self.versions.current)
        if new_model is not None:
            self._advance(new_model)
        self._close_rounds()

    def _advance(self, new_model: np.ndarray) -> None:
        """Make ``new_model`` the next server version (every strategy's and override's path): refused when not finite,
        BatchNorm variances clamped to >= 0 (:meth:`ModelCodec.clamp_variances`); tell the callbacks."""
        if not np.isfinite(new_model).all():  # the run stops: a NaN model would only be scored and sent out
            by = f"{type(self.strategy).__name__}.aggregate_train" if self.strategy.aggregation_hook else "strategy"
            raise FloatingPointError(f"{by} produced a non-finite model after arrival {self.stats.arrivals}")
        if self.codec.variance_segments:
            new_model, clamped = self.codec.clamp_variances(new_model)
            self.stats.clamped_variances += clamped
        version = self.versions.advance(new_model)
        if self.callbacks:
            info = VersionInfo(version, self._model_state().round, self.stats.arrivals, self.state.now,
                               lambda: self.versions.record(version))
            for callback in self.callbacks:
                callback.on_version(info)

    def _close_rounds(self) -> None:
        """Step 6, the one place a round closes: aggregate its train metrics, score it when the round schedule
        says so. A round is ``round-arrivals`` accepted updates, or a server version when that is 0."""
        while self.state.rounds_closed < self.state.rounds(self.config.round_arrivals)[0]:
            self.state.rounds_closed += 1
            if self.train_metrics is not None:
                self.train_metrics.on_round(self.state.rounds_closed)
            if self._refill_first and not self.replaying and not self._should_stop():  # no node waits for a score
                self.dispatcher.top_up(self.state.rounds_closed)
            self.scoring.round_closed(self.state.rounds_closed, self.state.now, self._model_state)

    # ------------------------------------------------------------- evaluate
    def _model_state(self) -> ModelState:
        version, (done, current) = self.versions.version, self.state.rounds(self.config.round_arrivals)
        return ModelState(version, current, self.versions.current, lambda: self.versions.record(version),
                          self.clients, rounds_done=done)

    def score_until(self, clock: float) -> None:
        """Step 7 on the clock's schedule: score every ``evaluate-every-time`` point up to ``clock``."""
        passed = self.scoring.until(clock, self._model_state)
        if self._journaling and passed:
            # a replay passes these points here, between the same events: on the wall clock a point can be
            # reached by a failed job or a stop, which the journal's arrivals alone would not reproduce
            self.checkpoints.record({"kind": "scored", "until": clock})

    def _tell_evaluation(self, state: ModelState, row: dict) -> None:
        told = (state.version, state.round, self.scoring.tail.identity(state.version))
        if told == self._last_told:  # the stop's row scores the model the last scheduled row scored
            return
        self._last_told = told
        info = VersionInfo(state.version, state.round, self.stats.arrivals, row["time"], state.record)
        for callback in self.callbacks:
            callback.on_evaluation(info, dict(row))

    def _abandon_in_flight(self) -> None:
        for job in list(self.state.in_flight.values()):
            self.versions.release(job.version)
        self.state.in_flight.clear()
        self.state.inbox.clear()

    # ------------------------------------------------------------ checkpoint
    def _checkpoint(self) -> None:
        path = self.checkpoints.save(lambda: snapshot(self), self.versions.version, self.stats.arrivals)
        log.debug("checkpoint %s", path)

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
        return self.state.now

    @property
    def global_model(self) -> np.ndarray:
        """The current global model (flat)."""
        return self.versions.current
