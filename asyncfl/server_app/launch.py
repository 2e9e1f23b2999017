"""``Strategy.start``: Flower's entry point, run on the asynchronous engine.

A Flower ServerApp calls ``strategy.start(grid, initial_arrays, num_rounds, ...)`` and
gets a ``Result``. This module turns those arguments into the engine's parts (codec,
clock settings, server-side and federated evaluation, metric aggregation, optional run
folder), runs it, and packs what happened into an :class:`AsyncResult`: Flower's
``Result`` keyed by server version, plus the asynchronous figures in ``summary``.
"""

from __future__ import annotations

import logging
import math
import resource
import signal
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common.logger import log as flwr_log
from flwr.serverapp.strategy import Result
from flwr.supercore.exit import add_exit_handler

from asyncfl.callbacks import Callback
from asyncfl.options import EngineConfig, RunOptions
from asyncfl.errors import CheckpointError, ClientAppsFailing, ConfigError, NoNodesConnected, NothingToDispatch
from asyncfl.server_app import checkpoint
from asyncfl.server_app.client_metrics import FederatedEvaluation, TrainMetrics, rounds_from_state, rounds_state
from asyncfl.server_app.codec import ModelCodec
from asyncfl.server_app.engine import AsyncEngine
from asyncfl.server_app.trusted_direction import TrustedDirection, TrustedTrainFn
from asyncfl.server_app.transport import Link, SuperLinkUnreachable, outage_limit, wait_for_nodes
from asyncfl.server_app.recorder import RunRecorder, affected_class_summary, run_summary
from asyncfl.server_app.scoring import ModelState
from asyncfl.state import capture, restore
from asyncfl.strategies.train_hook import TrainHook, check_overrides

if TYPE_CHECKING:
    from asyncfl.strategies.base import Strategy

ACCURACY_KEYS = ("accuracy", "acc", "eval-acc", "eval_acc", "eval-accuracy", "eval_accuracy")
LOSS_KEYS = ("loss", "eval-loss", "eval_loss")
CLASS_ACCURACY_KEY = "class-accuracy"


@dataclass(repr=False)  # keep Flower's report as the repr
class AsyncResult(Result):
    """Flower's ``Result`` (metric dicts keyed by server version) plus the asynchronous run's ``summary``:
    arrivals, staleness histogram/mean/max, rejected updates by reason, server ms per arrival, timing."""

    summary: dict = field(default_factory=dict)


class ServerEvaluation:
    """Adapts a Flower ``evaluate_fn(server_round, ArrayRecord) -> MetricRecord | None`` to the engine's evaluator.

    Every MetricRecord it returns is kept in ``by_round``; its accuracy and loss entries
    (first of :data:`ACCURACY_KEYS` / :data:`LOSS_KEYS`; NaN when absent) become the run's curves,
    and a ``class-accuracy`` list, if present, the per-class columns. An ``evaluate_fn`` whose test
    data changes over time (variant data) may have a ``select(clock) -> key`` method: it is told
    the clock before each evaluation, and a model is re-scored when the key changes.
    """

    def __init__(self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None], codec: ModelCodec) -> None:
        self.evaluate_fn = evaluate_fn
        self.codec = codec
        self.by_round: dict[int, MetricRecord] = {}
        if hasattr(evaluate_fn, "select"):
            self.select = evaluate_fn.select

    def state_dict(self) -> dict:
        """The scores so far, and the user's evaluator's own state when it declares ``state_attributes`` (the
        built-in app's best accuracy so far): a checkpoint's part."""
        inner = self.evaluate_fn
        return {"by_round": rounds_state(self.by_round),
                "evaluate_fn": capture(inner) if hasattr(type(inner), "state_attributes") else None}

    def load_state_dict(self, state: dict) -> None:
        self.by_round = rounds_from_state(state["by_round"])
        if state["evaluate_fn"] is not None:
            restore(self.evaluate_fn, state["evaluate_fn"], "evaluate_fn")

    def score(self, state: ModelState, arrivals: int) -> tuple:
        """``(loss, accuracy[, per-class accuracy])`` of the model in ``state``, scored at round ``state.round``."""
        round_ = state.round
        metrics = self.evaluate_fn(round_, self.codec.to_record(state.model))
        if metrics is None:
            return math.nan, math.nan
        self.by_round[round_] = metrics
        flwr_log(logging.INFO, "server-side evaluation of round %d (server version %d, %d arrivals): %s", round_,
                 state.version, arrivals, dict(metrics))
        scores = (_first_number(metrics, LOSS_KEYS), _first_number(metrics, ACCURACY_KEYS))
        per_class = metrics.get(CLASS_ACCURACY_KEY)
        return (*scores, list(per_class)) if isinstance(per_class, list) else scores


def _first_number(metrics: MetricRecord, keys: tuple[str, ...]) -> float:
    for key in keys:
        if key in metrics and isinstance(metrics[key], (int, float)):
            return float(metrics[key])
    return math.nan


class _ToFlowerLog(logging.Handler):
    """Re-logs asyncfl's records on Flower's logger, whose output ``flwr run --stream`` relays."""

    def emit(self, record: logging.LogRecord) -> None:
        flwr_log(record.levelno, "%s", record.getMessage())


def log_through_flower() -> None:
    """A library run: unless the app configured logging itself, asyncfl's lines (a rejected update and its
    reason, node discovery) appear where Flower's do, INFO included."""
    ours = logging.getLogger("asyncfl")
    if not ours.handlers and not logging.getLogger().handlers:
        ours.addHandler(_ToFlowerLog())
        ours.setLevel(logging.INFO)
        ours.propagate = False


def codec_and_model(initial_arrays: ArrayRecord) -> tuple[ModelCodec, np.ndarray]:
    """The layout of ``initial_arrays`` (names, shapes, dtypes) and the model as one flat float32 vector."""
    if not isinstance(initial_arrays, ArrayRecord) or len(initial_arrays) == 0:
        raise ConfigError("initial_arrays must be a non-empty flwr.app.ArrayRecord, e.g. "
                         "ArrayRecord(model.state_dict())")
    state = OrderedDict((name, array.numpy()) for name, array in initial_arrays.items())
    for name, array in state.items():
        if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
            raise ConfigError(f"initial_arrays[{name!r}] has dtype {array.dtype}; only numeric arrays can be averaged")
    codec = ModelCodec.from_state(state)
    return codec, codec.flatten(list(state.values()))


def _wait_for_first_nodes(grid, minimum: int, timeout: float) -> list[int]:
    """Flower's wait for ``min_available_nodes`` (with its log line); at least one node must come."""
    nodes = wait_for_nodes(grid, minimum, timeout, on_wait=lambda connected: flwr_log(
        logging.INFO, "Waiting for nodes to connect: %d connected (minimum required: %d)", connected, minimum))
    if not nodes:
        raise NoNodesConnected(f"no node connected within {timeout:.0f}s")
    return nodes


def start_strategy(strategy: Strategy, grid, initial_arrays: ArrayRecord, num_rounds: int, timeout: float,
                   train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None,
                   evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None, options: RunOptions,
                   run_config: dict | None = None, callbacks: Sequence[Callback] = (),
                   trusted_train_fn: TrustedTrainFn | None = None) -> AsyncResult:
    """Run ``strategy`` on ``grid`` until a stop condition (see :meth:`Strategy.start`); ``options`` were checked
    when they were made, and with ``num_rounds`` and ``timeout`` here, before the first message is sent.

    1. check what Flower's arguments add to the options, wait for the first nodes, resolve the engine's settings;
    2. build the run's parts (:class:`_Run`: the engine, its link to the SuperLink, evaluation, run folder);
    3. run the engine until a stop, summary.json written however it ends;
    4. pack Flower's ``Result`` with the summary, and log the closing lines.
    """
    options.check_run(num_rounds, timeout)
    options.check_strategy(type(strategy), strategy.name)
    if trusted_train_fn is not None and not callable(trusted_train_fn):
        raise ConfigError(f"trusted_train_fn={trusted_train_fn!r} must be a function (server_version, ArrayRecord) -> "
                          "ArrayRecord that trains the model on the server's trusted data, or None")
    if run_config is not None and "engine" in run_config:
        raise ConfigError("run_config has a key 'engine': config.json keeps that key for the engine's settings as the "
                          "run resolves them; rename yours")
    check_overrides(strategy)
    log_through_flower()
    run = _Run.build(strategy, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn,
                     options, run_config, callbacks, trusted_train_fn)
    run.execute()
    scored = run.engine.scoring.tail.mean(run.engine.versions.version, run.engine.global_model)  # the last row's model
    result = AsyncResult(
        arrays=run.codec.to_record(scored),
        train_metrics_clientapp=run.train_metrics.by_round,
        evaluate_metrics_clientapp=run.federated.by_round if run.federated is not None else {},
        evaluate_metrics_serverapp=run.server_eval.by_round if run.server_eval is not None else {},
        summary=run.summary(),
    )
    run.log_closing(result)
    return result


@dataclass
class _Run:
    """One ``start()`` call's parts: what the engine runs with, and what its summary and closing lines read."""

    name: str
    strategy: Strategy
    config: EngineConfig
    codec: ModelCodec
    link: Link
    engine: AsyncEngine
    train_metrics: TrainMetrics
    server_eval: ServerEvaluation | None
    federated: FederatedEvaluation | None
    recorder: RunRecorder | None
    checkpoints: checkpoint.Checkpoints | None
    resumed_from: Path | None
    started: float = 0.0

    @classmethod
    def build(cls, strategy: Strategy, grid, initial_arrays: ArrayRecord, num_rounds: int, timeout: float,
              train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None, evaluate_fn,
              options: RunOptions, run_config: dict | None, callbacks: Sequence[Callback],
              trusted_train_fn: TrustedTrainFn | None = None) -> "_Run":
        """Wait for the first nodes, resolve the settings against them, and build every part of the run."""
        node_wait = options.node_wait(timeout)
        asynchronous = not strategy.synchronous
        codec, initial = codec_and_model(initial_arrays)
        flower = strategy.flower
        resume, resumed_from = _read_resume(options)  # a wrong resume_from fails before any wait
        if options.checkpoint_every and not strategy.checkpointable:
            raise CheckpointError(f"checkpoint_every={options.checkpoint_every}: {strategy.name} does not say what "
                                  "its state is (state_attributes, or state_dict/load_state_dict), so it cannot be "
                                  "checkpointed")
        nodes = _wait_for_first_nodes(grid, flower.min_available_nodes, node_wait)
        cohort = flower.train_nodes(len(nodes))  # what Flower's FedAvg would train per round on these nodes
        concurrency, round_arrivals = options.concurrency or cohort, cohort if asynchronous else 0
        if resume is not None:  # what the first nodes would decide was decided by the run that wrote the checkpoint
            saved = checkpoint.saved_settings(resume)
            concurrency = options.concurrency or saved.get("concurrency", concurrency)
            if asynchronous and saved.get("round_arrivals", round_arrivals) != round_arrivals:
                flwr_log(logging.INFO, "resuming: a round is %d updates, as in the checkpoint's run (%d with the "
                         "%d node(s) connected now)", saved["round_arrivals"], round_arrivals, len(nodes))
            round_arrivals = saved.get("round_arrivals", round_arrivals)
        config = options.engine_config(num_rounds=num_rounds, timeout=timeout, concurrency=concurrency,
                                       round_arrivals=round_arrivals, node_wait=node_wait,
                                       auto_hold=strategy.auto_dispatch_hold)
        server_eval = ServerEvaluation(evaluate_fn, codec) if evaluate_fn is not None else None
        train_metrics = TrainMetrics(flower.weighted_by_key, flower.train_metrics_aggr_fn, callbacks)
        # from here on every Grid call waits out a SuperLink outage, up to 3 x timeout (transport.Link)
        link = Link(grid, outage_limit(timeout))
        federated = (FederatedEvaluation(link, flower, dict(evaluate_config or {}), options.seed, timeout, strategy,
                                         callbacks) if flower.evaluates_on_clients else None)
        if resume is not None:
            checkpoint.check_fits(resume, strategy, codec, config,  # before anything in a run folder changes
                                  trusted=trusted_train_fn is not None)
        folder = _run_folder(options, strategy.name, resumed_from)
        recorder = None
        if folder is not None:
            recorder = RunRecorder(folder, _run_settings(strategy.name, config, flower, num_rounds, run_config),
                                   config.target_accuracy, options.progress, options.max_arrivals, options.max_time,
                                   resuming=resume is not None, clock=options.clock)
        checkpoints = _checkpoints(options, folder)
        engine = AsyncEngine(link, strategy, codec, initial, config, dict(train_config or {}), server_eval, recorder,
                             keys=flower.keys, train_metrics=train_metrics, federated_eval=federated,
                             checkpoints=checkpoints, resume=resume, callbacks=callbacks,
                             trusted_direction=TrustedDirection(trusted_train_fn, codec, config.concurrency + 1)
                             if trusted_train_fn is not None else None)
        # how many of those jobs the nodes can hold is said once the engine has waited for its nodes (Dispatcher)
        flwr_log(logging.INFO, "Starting %s (asyncfl, %s clock): concurrency %d, %d node(s) connected so far; "
                 "stop at %s", strategy.name, options.clock, config.concurrency, len(nodes),
                 _stops_text(num_rounds, options.max_arrivals, options.max_time, config.round_arrivals,
                             flower.fraction_train))
        return cls(strategy.name, strategy, config, codec, link, engine, train_metrics, server_eval,
                   federated, recorder, checkpoints, resumed_from, time.monotonic())

    def execute(self) -> None:
        """Run the engine until a stop; however it ends (a stop, an error, a signal), summary.json says why."""
        engine, recorder, strategy = self.engine, self.recorder, self.strategy
        if recorder is not None:
            recorder.summary_source = self.summary
        # Flower's ServerApp process exits on a signal (Ctrl-C, a stop, or its own SIGINT once the SuperLink refuses
        # the run's task, e.g. after an outage) and kills itself 5 s later, maybe before `finally` below runs:
        # summary.json is written first, from Flower's exit handlers (no-op once the run has ended; cleared then,
        # so nothing stays held)
        on_exit = [lambda: _summary_on_exit(engine, recorder, self.summary, self.link)] if recorder is not None else []
        if on_exit:
            add_exit_handler(lambda: on_exit and on_exit[0](), run_before_force_exit=True)
        if strategy.overrides("aggregate_train"):  # Flower's hook, called at the method's aggregation step
            strategy.aggregation_hook = TrainHook(self.codec, strategy.flower.keys,
                                                  lambda: _round_of_step(engine, self.config.round_arrivals),
                                                  lambda client: engine.roster.nodes[client])
        refused = False  # a resume refused (other nodes): the folder stays the dead run's, untouched
        try:
            with _sigterm_interrupts(), self.link.watching():  # Flower's own Grid retries inside a call: counted
                engine.run()
            self.train_metrics.close(engine.state.rounds(self.config.round_arrivals)[1])
        except BaseException as exc:  # the reason goes into summary.json; the exception goes on to the caller
            refused = isinstance(exc, CheckpointError)
            note = self.link.outage_note() if isinstance(exc, (KeyboardInterrupt, SystemExit)) else ""  # Flower's
            engine.stop_reason = stop_reason_of(exc) + note
            flwr_log(logging.ERROR, "%s stopped: %s", self.name, engine.stop_reason)
            raise
        finally:
            self.link.end()  # a pull still waiting in a thread returns; the Grid is the app's again
            on_exit.clear()
            strategy.aggregation_hook = None  # a Flower loop of the app's own may use the strategy next
            if recorder is not None and not refused:
                recorder.write_summary(self.summary())
                recorder.write_clients(engine.stats.by_client)
                recorder.plot()

    def summary(self) -> dict:
        """``summary.json`` (and ``AsyncResult.summary``) as of now."""
        engine, config, strategy = self.engine, self.config, self.strategy
        rows = engine.stats.evaluations
        affected = getattr(config.delay_model, "affected_class", None)  # the intertwined scenario's late class
        extra = {**(strategy.summary() or {}), **(affected_class_summary(rows, affected) if affected is not None else {})}
        out = run_summary(self.name, engine.stats, engine.versions.version, extra, engine.now, rows,
                          config.target_accuracy, self.started)
        # rounds: from 1 as Flower's, a partial last one included (rounds-complete: the whole ones)
        out["rounds-complete"], out["rounds"] = engine.state.rounds(config.round_arrivals)
        out["updates-per-round"] = config.round_arrivals or None  # None: a round is a server version
        out["peak-stored-versions"] = engine.versions.peak_versions
        out["clients"] = len(engine.clients)
        if hasattr(engine.delays, "counts"):
            out["delay-categories"] = engine.delays.counts()
        out["server-peak-rss-mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        if self.federated is not None and self.federated.rejected:
            out["evaluate-rejected-by-reason"] = dict(sorted(self.federated.rejected.items()))
        out.update(engine.bounds.summary())
        # outages of the SuperLink: how many, how long; the jobs they lost are no client's failure
        out.update(self.link.summary(), **{"jobs-lost-to-outage": engine.stats.outage_jobs,
                                           "jobs-resent-after-outage": engine.stats.outage_resent})
        if self.checkpoints is not None:
            out.update(self.checkpoints.summary())
        if self.resumed_from is not None:
            out["resumed-from"] = str(self.resumed_from)
        out["stop-reason"], out["finished"] = _how_it_ended(engine.stop_reason)
        return out

    def log_closing(self, result: AsyncResult) -> None:
        """The closing lines: how the run ended and its figures in one line, then Flower's report by round."""
        s, config = result.summary, self.config
        per_round = _rounds_text(s["rounds"], s["rounds-complete"], s["arrivals"], config.round_arrivals)
        held = f", {s['held-dispatches']} dispatch(es) held for the next version" if s.get("held-dispatches") else ""
        if config.clock == "wall" and s.get("client-train-s-mean") is not None and s.get("job-round-trip-s-mean"):
            held += (f", jobs trained {s['client-train-s-mean']:.2f}s of a {s['job-round-trip-s-mean']:.2f}s round "
                     "trip (means)")
        if s.get("in-flight-cap-mean") is not None:
            held += (f", jobs in flight capped at {s['in-flight-cap-mean']:.1f} (mean; least {s['in-flight-cap-min']}) "
                     f"of concurrency {config.concurrency} (cap-in-flight)")
        flwr_log(logging.INFO, "%s finished in %.1fs (%s): %s, %d arrivals, %d server versions, %d rejected, "
                 "mean staleness %.2f%s", self.name, s["wall-seconds"], s["stop-reason"], per_round,
                 s["arrivals"], s["server-versions"], s["rejected-updates"], s["staleness-mean"], held)
        evaluations = len(self.engine.stats.evaluations)
        if self.server_eval is not None and self.recorder is not None and evaluations > len(self.server_eval.by_round):
            flwr_log(logging.INFO, "%d server-side evaluations, the last of each round below; every one: %s",
                     evaluations, self.recorder.folder / "metrics.csv")
        for line in str(result).splitlines():  # Flower's closing report, keyed by round
            flwr_log(logging.INFO, "\t%s", line)


def _read_resume(options: RunOptions) -> tuple[dict | None, Path | None]:
    """``(the checkpoint's state with its journal, its path)`` to resume from; ``(None, None)`` for a fresh run."""
    if not options.resume_from:
        return None, None
    resumed_from, resume, skipped = checkpoint.newest_readable(options.resume_from)
    for problem in skipped:
        flwr_log(logging.WARNING, "%s: resuming from the newest one that reads, %s", problem, resumed_from.name)
    checkpoint.saved_settings(resume, say=True)  # what the resumed run will take is checked before any wait
    resume["journal"] = checkpoint.read_journal(resumed_from)
    return resume, resumed_from


def _checkpoints(options: RunOptions, folder: Path | None) -> checkpoint.Checkpoints | None:
    """Where and how often the run's state is written (``checkpoint_every``); None when never."""
    if not options.checkpoint_every:
        return None
    where = options.checkpoint_dir or (folder / checkpoint.FOLDER if folder is not None else None)
    return checkpoint.Checkpoints(Path(where).expanduser().resolve(), options.checkpoint_every,
                                  options.checkpoint_keep)


def _summary_on_exit(engine: AsyncEngine, recorder: RunRecorder, summary: Callable[[], dict], link: Link) -> None:
    """Flower's exit on a signal while the run goes on: summary.json says so (and names a recent SuperLink outage)."""
    if engine.stop_reason == "running":
        out = summary()
        out["stop-reason"] = ("interrupted (the ServerApp process is exiting on a signal: Ctrl-C, a stop, or Flower's "
                              "own)" + link.outage_note())
        recorder.write_summary(out)


def _round_of_step(engine: AsyncEngine, per_round: int) -> int:
    """The round an aggregation step belongs to (``aggregate_train``'s ``server_round``): asynchronously the round
    of the arrival the strategy is taking in (the engine counts it after the strategy took it), synchronously
    the round whose end makes the next version."""
    if per_round:
        return -(-(engine.stats.arrivals + 1) // per_round)
    return engine.versions.version + 1


#: ``summary.json``'s ``stop-reason`` while the run goes on: what a run killed outright (SIGKILL) leaves.
RUNNING = "running (no end recorded: the run goes on, or was killed)"


def _how_it_ended(stop_reason: str) -> tuple[str, bool]:
    """``(stop-reason, finished)`` for ``summary.json``: finished when one of the run's own stops was reached."""
    if stop_reason == "running":
        return RUNNING, False
    return stop_reason, stop_reason.endswith(" reached")


@contextmanager
def _sigterm_interrupts():
    """SIGTERM stops the run as Ctrl-C does (``KeyboardInterrupt``), so that summary.json says so, where the
    process has no handler of its own for it (Flower's ServerApp process has one: it exits by ``SystemExit``)."""
    own = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if own:
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        if own:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_reason_of(exc: BaseException) -> str:
    """What ended a run that raised, in a line: interrupted, every node failing, no node to send to, or the error."""
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted ({exc.args[0] if exc.args else 'Ctrl-C'})"
    if isinstance(exc, SystemExit):  # Flower's ServerApp process exits so on SIGINT / SIGTERM ("Task stopped")
        return f"interrupted (the process was told to exit, code {exc.code}: Ctrl-C, a signal or a stop)"
    kind = {ClientAppsFailing: "all nodes failing", NothingToDispatch: "no node to dispatch to",
            SuperLinkUnreachable: "superlink unreachable"}.get(type(exc), "error")
    return f"{kind}: {type(exc).__name__}: {str(exc)[:300]}"


def _rounds_text(rounds: int, complete: int, arrivals: int, per_round: int) -> str:
    """``"3 rounds (of 8 updates)"``, the last one's share when it is partial (``"1 round (partial: 5 of 8
    updates)"``); a synchronous strategy's rounds are its server versions."""
    text = f"{rounds} round{'s' if rounds != 1 else ''}"
    if not per_round:
        return text
    if rounds > complete:
        return f"{text} (the last partial: {arrivals - complete * per_round} of {per_round} updates)"
    return f"{text} (of {per_round} updates)"


def _run_folder(options: RunOptions, name: str, resumed_from: Path | None) -> Path | None:
    """``<output_dir>/<run_name>``; when resuming without an output_dir, the run folder the checkpoint is in."""
    if options.output_dir is not None:
        return Path(options.output_dir).expanduser().resolve() / (
            options.run_name or f"{name.lower()}-{time.strftime('%Y%m%d-%H%M%S')}")
    if resumed_from is not None and resumed_from.parent.name == checkpoint.FOLDER:
        return resumed_from.parent.parent.resolve()
    return None


def _stops_text(num_rounds: int, max_arrivals: int, max_time: float, round_arrivals: int,
               fraction_train: float) -> str:
    if round_arrivals:
        rounds = (f"{num_rounds} rounds = {num_rounds * round_arrivals} accepted updates (a round is {round_arrivals} "
                  f"updates, the cohort FedAvg trains with fraction_train={fraction_train:g}; server versions are "
                  "counted apart)")
    else:
        rounds = f"{num_rounds} rounds (server versions)"
    parts = [rounds if num_rounds else "",
             f"{max_arrivals} arrivals" if max_arrivals else "", f"time {max_time:g}" if max_time else ""]
    return " or ".join(p for p in parts if p)


def _run_settings(name: str, config: EngineConfig, options, num_rounds: int, run_config: dict | None) -> dict:
    """What ``config.json`` records: the caller's ``run_config`` (the built-in app's, typed) or, for a library run,
    the strategy and its Flower options; and the engine's settings as this run resolved them."""
    settings = run_config if run_config is not None else {
        "strategy": name, "num_rounds": num_rounds,
        "flower_options": {k: v for k, v in vars(options).items() if not callable(v)}}
    return {**settings, "engine": asdict(config)}
