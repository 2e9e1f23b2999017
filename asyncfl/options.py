"""How a run is scheduled, stopped and evaluated: :class:`RunOptions`, checked in one place.

``RunOptions`` is the one list of the engine's options. Its field names are the
keyword arguments of ``Strategy.start`` (after Flower's seven parameters), and each
field names its run-config key beside it, so the library and the built-in app read
the same options with the same checks, and adding an option is one field here plus
its default in ``pyproject.toml``. The engine gets an :class:`EngineConfig`: the
options resolved against the run (the nodes that came, Flower's ``num_rounds`` and
``timeout``).

This module imports no run-config parser, data or models, so importing the engine
loads none of them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from asyncfl.simulation.categories import RuntimeCategories
from asyncfl.simulation.delays import DelayModel
from asyncfl.simulation.intertwined import IntertwinedDelays
from asyncfl.simulation.presets import DELAY_PRESETS
from asyncfl.strategies.settings import ConfigError, Knobs, knob

#: ``virtual``: simulation, replies accepted in the order of drawn durations; ``wall``: real arrival order.
CLOCKS = ("virtual", "wall")
#: What happens to an update beyond ``update_norm_bound`` (:class:`asyncfl.server_app.participants.UpdateNormBound`).
UPDATE_NORM_ACTIONS = ("clip", "reject")
log = logging.getLogger("asyncfl")
DELAY_TYPES = (DelayModel, RuntimeCategories, IntertwinedDelays)

#: Run-config keys an option had before it took its own name's kebab case (issue 58; runs stored before then).
#: A config that still uses one is read as the new key, with one line saying so.
RENAMED_KEYS = {"max-virtual-time": "max-time", "eval-every": "evaluate-every-time", "job-timeout": "timeout"}
#: ``Strategy.start`` keywords renamed the same way.
RENAMED_KEYWORDS = {"delays": "delay_model"}
#: Longest wait for the first nodes (``min_available_nodes``) and for nodes to reach the concurrency, when
#: ``wait_for_nodes`` is None.
NODE_WAIT_CAP_S = 60.0


def current_keys(config: Mapping[str, Any], where: str = "run-config",
                 known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config`` with every old spelling of :data:`RENAMED_KEYS` under its current key, each said in one line
    (once per process and place). ``known``: the app's keys; then only a key the app does not have, whose new
    name it has, is renamed (another Flower app may have a key of its own spelled so).

    Raises
    ------
    ConfigError
        When the old and the new key are both set, to different values.
    """
    current = dict(config)
    for old, new in RENAMED_KEYS.items():
        if old not in current or (known is not None and (old in known or new not in known)):
            continue
        value = current.pop(old)
        if new in current and current[new] != value:
            raise ConfigError(f"{where}: {old}={value!r} and {new}={current[new]!r} are one setting ({old} is its "
                              f"old name): keep {new} only")
        current[new] = value
        if (where, old) not in _SAID:
            _SAID.add((where, old))
            log.warning("%s: key %r is now %r (read as %s=%r)", where, old, new, new, value)
    return current


_SAID: set[tuple[str, str]] = set()


def _renamed_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` with every old name of :data:`RENAMED_KEYWORDS` under its new one, said in one line."""
    for old, new in RENAMED_KEYWORDS.items():
        if old in keywords:
            if new in keywords:
                raise TypeError(f"{old}= and {new}= are one option ({old} is its old name): pass {new}= only")
            log.warning("RunOptions / start(%s=...) is now %s=...", old, new)
            keywords[new] = keywords.pop(old)
    return keywords


@dataclass(frozen=True)
class RunOptions(Knobs):
    """The asynchronous run's options: ``Strategy.start``'s keyword arguments, and run-config keys.

    Parameters
    ----------
    max_arrivals : int
        Stop after this many accepted updates (0 = off). Run-config ``max-arrivals``.
    max_time : float
        Stop at this clock time: virtual units or wall seconds (0 = off). ``max-time``.
    concurrency : int, optional
        Jobs in flight (``K``); None: ``max(min_train_nodes, int(fraction_train * nodes))``, the
        cohort Flower's FedAvg would train. ``concurrency``.
    clock : {"wall", "virtual"}
        ``wall`` (deployments; arrival order is real) or ``virtual`` (simulation: replies are
        accepted in the order of durations drawn from ``delay_model``; same seed, same run). ``clock``.
    delay_model : DelayModel or str, optional
        The virtual clock's delay model, or a preset name (:data:`asyncfl.simulation.presets.DELAY_PRESETS`);
        required with ``clock="virtual"``. ``delay-model`` and the ``delay.*`` keys.
    seed : int
        Seeds client sampling, job seeds and the delay draws. ``seed``.
    evaluate_every : int
        Evaluate (server side and federated) every this many rounds (0 = by clock only). ``evaluate-every``.
    evaluate_every_time : float
        Also evaluate at every multiple of this clock time (0 = off). ``evaluate-every-time``.
    tail_average_rounds : int
        The model a run scores and returns (its evaluations, callbacks, federated evaluation and
        ``Result.arrays``) is the mean of the current model and the models at the ends of the
        ``tail_average_rounds - 1`` rounds before it (Polyak and Juditsky, 1992, "Acceleration of
        stochastic approximation by averaging", over a window of rounds: the average of the iterates
        smooths the swing of a model that moves between evaluations). Clients always train the current
        model. 1 (default) = the current model; at most 100 (the server holds that many models).
        ``tail-average-rounds``.
    target_accuracy : tuple of float
        Accuracies whose first clock time the summary reports (``time-to-target``). ``target-accuracy``
        (comma-separated).
    progress : bool
        Log a progress line every 2 s (needs ``output_dir``). ``progress``.
    overlap_server_compute : bool
        Dispatch the freed slot's next job before the server update (FedRevive Sec. 2.3).
        ``overlap-server-compute``.
    dispatch_hold : float, optional
        Asynchronous strategies that know how many arrivals make their next version (FedBuff's free buffer
        places, FedAsync's one): a freed slot waits for that version when it is due within this fraction of
        a job's duration, counted from when the slot freed, so the next job starts from the model with its
        client's update in it. At equal speeds, where the buffer's arrivals come together, this costs no
        time; a slow buffer is never waited for. 0 = dispatch at once; None: the strategy's own
        ``auto_dispatch_hold`` (FedBuff 0.1, others 0). ``dispatch-hold``.
    cap_in_flight : bool
        Wall clock, asynchronous strategies: keep in flight only the jobs the workers can start soon, the
        measured parallelism + 1 (jobs in flight x (train + the shortest wait to start) / round trip, over
        the latest replies that report ``train-seconds``; :func:`asyncfl.report_train_seconds`), never more
        than ``concurrency``. Where ClientApps share a few workers (a simulation on a small machine), jobs
        beyond those wait in a queue and grow stale there for no gain in throughput. ``concurrency`` still
        sets the strategy (FedBuff's buffer, the pace). A stock ClientApp reports nothing: inside Flower's
        simulation runtime its Ray actors are counted instead and the cap is that count + 1; in a deployment
        without ``train-seconds`` replies, on the virtual clock and in synchronous rounds it does nothing.
        ``cap-in-flight``.
    server_time_scale : float
        Virtual clock: charge server compute at this many units per second (0 = free, the papers'
        convention). ``server-time-scale``.
    round_deadline : float
        Synchronous strategies, virtual clock: a round closes at its start + this; later jobs arrive
        stale in a later round (the gradient-inversion paper's setting; 0 = off). ``round-deadline``.
    pipeline_late_clients : bool
        With ``round_deadline``: a late client may train again while its late job is out.
        ``pipeline-late-clients``.
    jobs_per_client : int
        Wall clock: jobs one client may have out at once (2 queues its next job at the SuperLink).
        ``jobs-per-client``.
    wait_for_nodes : float, optional
        Seconds to wait for ``concurrency`` nodes to connect; None: ``min(timeout, 60)``. ``wait-for-nodes``.
    identify_nodes : bool, optional
        Ask every node for its ``partition-id`` and example count before the first job (client order
        then does not depend on node ids); None: only on the virtual clock or with
        ``emulate_delay_scale``. ``identify-nodes``.
    emulate_delay_scale : float
        Wall clock: each train request carries ``emulate-seconds`` = a duration drawn from ``delay_model``
        times this (0 = off). ``emulate-delay-scale``.
    output_dir, run_name : str, optional
        The run folder ``<output_dir>/<run_name>`` (metrics.csv, summary.json, accuracy.png), written
        as the run goes; no folder when ``output_dir`` is None. ``output-dir``, ``run-name``.
    checkpoint_every : int
        Write the server's whole state every this many server versions, and when the run stops
        (0 = never). ``checkpoint-every``.
    checkpoint_dir : str, optional
        Where checkpoints go; None (or ""): ``<run folder>/checkpoints``. ``checkpoint-dir``.
    checkpoint_keep : int
        How many of the newest checkpoints to keep (default 1: each is written whole under a temporary name
        and renamed, so the newest is complete; the older ones only cost disk). ``checkpoint-keep``.
    update_norm_bound : float
        Bound each arriving update's movement of the model (its norm x the strategy's staleness weight for it)
        at this multiple of the recent clients' median movement (a tenth of the model's own norm before three
        clients are known), less for a client over its share of the recent updates: no single node moves the
        model far, so one faulty node cannot send it to chance (:class:`asyncfl.server_app.participants.UpdateNormBound`).
        0 = off. ``update-norm-bound``.
    update_norm_action : {"clip", "reject"}
        An update beyond the bound is scaled back to it (``clip``) or rejected with reason ``update-norm``.
        ``update-norm-action``.
    resume_from : str, optional
        Go on from a checkpoint: a checkpoint file, a folder of them or a run folder (its newest).
        The strategy, model layout and scheduling settings must be the checkpoint's (a mismatch is
        refused, saying what differs); stops may change, so a finished run can be extended. What the
        first nodes decide in a fresh run (the cohort a round stands for, an unset ``concurrency``) is
        the checkpoint's, and the run waits (``wait_for_nodes``) for all the checkpoint's clients. The
        run folder defaults to the checkpoint's. ``resume-from``.
    """

    label: ClassVar[str] = "run option"
    prefix: ClassVar[str] = ""

    max_arrivals: int = knob(0, minimum=0)
    max_time: float = knob(0.0, minimum=0)
    concurrency: int | None = knob(None, minimum=1)
    clock: str = knob("wall", choices=CLOCKS)
    delay_model: Any = knob(None)
    seed: int = knob(0)
    evaluate_every: int = knob(1, minimum=0)
    evaluate_every_time: float = knob(0.0, minimum=0)
    tail_average_rounds: int = knob(1, minimum=1, maximum=100)
    target_accuracy: tuple = knob(())
    progress: bool = knob(False)
    overlap_server_compute: bool = knob(False)
    dispatch_hold: float | None = knob(None, minimum=0)
    cap_in_flight: bool = knob(True)
    server_time_scale: float = knob(0.0, minimum=0)
    round_deadline: float = knob(0.0, minimum=0)
    pipeline_late_clients: bool = knob(False)
    jobs_per_client: int = knob(1, minimum=1)
    wait_for_nodes: float | None = knob(None, minimum=0)
    identify_nodes: bool | None = knob(None)
    emulate_delay_scale: float = knob(0.0, minimum=0)
    output_dir: str | None = knob(None)
    run_name: str = knob("")
    checkpoint_every: int = knob(0, minimum=0)
    checkpoint_dir: str | None = knob(None)
    checkpoint_keep: int = knob(1, minimum=1)
    resume_from: str | None = knob(None)
    update_norm_bound: float = knob(3.0, minimum=0)
    update_norm_action: str = knob("clip", choices=UPDATE_NORM_ACTIONS)

    @property
    def delays(self) -> Any:
        """The old name of :attr:`delay_model` (still read)."""
        return self.delay_model

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names: ``Strategy.start``'s keyword arguments after Flower's seven."""
        return tuple(spec.name for spec in dataclasses.fields(cls))

    @classmethod
    def from_keywords(cls, base: "RunOptions | None" = None, **keywords: Any) -> "RunOptions":
        """``base`` (default: the defaults) with ``keywords`` changed; an unknown name lists the valid ones, an old
        name (:data:`RENAMED_KEYWORDS`) is read as its new one with a line saying so."""
        keywords = _renamed_keywords(keywords)
        unknown = sorted(set(keywords) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(cls.names())}")
        if base is not None and not isinstance(base, RunOptions):
            raise TypeError(f"options must be an asyncfl.RunOptions, got {type(base).__name__}")
        return dataclasses.replace(base, **keywords) if base is not None else cls(**keywords)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], delay_model: Any = None) -> "RunOptions":
        """The built-in app's options: every field from its key (``delay_model``: the model the caller parsed
        from ``delay-model`` and ``delay.*``; ``target-accuracy``: comma-separated fractions)."""
        values = {spec.name: run_config[cls.key_of(spec.name)] for spec in dataclasses.fields(cls)
                  if cls.key_of(spec.name) in run_config and spec.name not in ("delay_model", "target_accuracy")}
        if "target-accuracy" in run_config:
            values["target_accuracy"] = parse_targets(run_config["target-accuracy"])
        return cls(**values, delay_model=delay_model)

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Conditions between options (single values are checked from the fields' ranges)."""
        object.__setattr__(self, "target_accuracy", parse_targets(self.target_accuracy))  # a list becomes a tuple
        _whole("concurrency", self.concurrency, minimum=1, optional=True)  # the other integers are typed fields
        if self.identify_nodes is not None and not isinstance(self.identify_nodes, bool):
            raise ConfigError(f"identify-nodes (identify_nodes) = {self.identify_nodes!r} must be true or false "
                              "(or None in start(): the clock decides)")
        for target in self.target_accuracy:
            if not 0.0 < target <= 1.0:
                raise ConfigError(f"target-accuracy values must be in (0, 1], got {target}")
        if self.evaluate_every < 1 and self.evaluate_every_time <= 0:
            raise ConfigError(f"evaluate-every-time (evaluate_every_time) = {self.evaluate_every_time:g} and "
                              f"evaluate-every (evaluate_every) = {self.evaluate_every} leave the run without "
                              "evaluation: set evaluate-every-time > 0 (clock units between evaluations) or "
                              "evaluate-every >= 1 (rounds)")
        resolve_delays(self.clock, self.delay_model)
        if self.emulate_delay_scale > 0 and (self.clock != "wall" or self.delay_model is None):
            raise ConfigError(f"emulate-delay-scale (emulate_delay_scale) = {self.emulate_delay_scale:g} needs "
                              "clock='wall' and a delay model to draw durations from (delay-model; delay_model=)")
        if self.pipeline_late_clients and self.round_deadline <= 0:
            raise ConfigError("pipeline-late-clients (pipeline_late_clients) lets clients whose job missed the round "
                              "deadline train again; it needs round-deadline > 0 (semi-asynchronous rounds)")
        if self.round_deadline > 0 and self.clock != "virtual":
            raise ConfigError("round-deadline (round_deadline: semi-asynchronous rounds) needs clock = 'virtual'; "
                              "set it to 0 for wall-clock runs")
        if isinstance(self.delay_model, IntertwinedDelays) and self.clock != "virtual":
            raise ConfigError("delay-model 'intertwined' is a simulation scenario; it needs clock = 'virtual'")
        if self.overlap_server_compute and (self.dispatch_hold or 0) > 0:
            raise ConfigError("overlap-server-compute (overlap_server_compute) dispatches a freed slot before the server "
                              "update and dispatch-hold (dispatch_hold) makes it wait for the next one: set one of "
                              "them off")
        if self.overlap_server_compute and self.server_time_scale > 0:
            raise ConfigError("overlap-server-compute (overlap_server_compute) hides server time from clients; set "
                              "server-time-scale (server_time_scale) = 0 with it, or turn overlap off to charge server "
                              "time to the virtual clock")
        if self.checkpoint_every and not (self.checkpoint_dir or self.output_dir or self.resume_from):
            raise ConfigError(f"checkpoint-every (checkpoint_every) = {self.checkpoint_every} needs a place to "
                              "write, and output-dir (output_dir) and checkpoint-dir (checkpoint_dir) are empty: set "
                              "output-dir (checkpoints go to <run folder>/checkpoints), checkpoint-dir, or "
                              "checkpoint-every = 0 for none")
        if self.update_norm_bound == 0 and self.update_norm_action != "clip":
            raise ConfigError(f"update-norm-action (update_norm_action) = {self.update_norm_action!r} would be "
                              "ignored: update-norm-bound (update_norm_bound) = 0 turns the bound off; set a bound "
                              "> 1 (default 3) or leave the action out")
        if 0 < self.update_norm_bound <= 1:
            raise ConfigError(f"update-norm-bound (update_norm_bound) = {self.update_norm_bound:g} would bound "
                              "honest updates at or below the typical one; use a multiple > 1 of the recent median "
                              "norm (default 3), or 0 to turn the bound off")
        if not 0 <= self.seed < 2 ** 63:
            raise ConfigError(f"seed = {self.seed} is out of range: a seed is a whole number from 0 to 2^63 - 1 "
                              "(Flower carries run-config integers as 64-bit)")
        if self.jobs_per_client > 1 and self.cap_in_flight:
            raise ConfigError(f"jobs-per-client (jobs_per_client) = {self.jobs_per_client} queues each client's next "
                              "job on purpose, and cap-in-flight (cap_in_flight, on by default) keeps jobs out of "
                              "queues: set cap-in-flight = false with it")
        if self.jobs_per_client > 1 and self.clock != "wall":
            raise ConfigError("jobs-per-client (jobs_per_client) > 1 queues a client's next job at the SuperLink while "
                              "it trains; that is a deployment setting and needs clock = 'wall' (the virtual clock "
                              "draws every job's duration from its dispatch)")

    def check_strategy(self, strategy_type: type | None, name: str) -> None:
        """The options against the strategy that runs them (``None``: a gossip method, which has no server
        versions): a setting it would ignore is refused."""
        if (self.dispatch_hold or 0) > 0 and (strategy_type is None or not strategy_type.says_when_it_steps()):
            raise ConfigError(f"dispatch-hold (dispatch_hold) = {self.dispatch_hold:g} waits for the strategy's next "
                              f"version, and {name} cannot say when that comes; it works with FedBuff and FedAsync: "
                              "use one of them or set dispatch-hold = 0")

    def check_run(self, num_rounds: int, timeout: float, has_rounds: bool = True) -> None:
        """The options together with Flower's ``num_rounds`` and ``timeout``: the run must be able to stop.

        ``has_rounds=False``: the run has no rounds (the built-in app stops by ``max-arrivals`` or
        ``max-time`` only), and a refusal names those keys alone.
        """
        _whole("num_rounds", num_rounds, minimum=0, key=None)
        if timeout <= 0:
            raise ConfigError(f"timeout={timeout} must be > 0 (seconds a job may take; run-config timeout)")
        if num_rounds or self.max_arrivals or self.max_time:
            return
        stops = "set max-arrivals > 0 or max-time > 0 (both are 0)"
        if has_rounds:  # a Flower app's own ServerApp, whose rounds come from its own run-config
            stops = ("num_rounds, max_arrivals and max_time are all 0: set one > 0 (Flower's examples pass run-config "
                     "num-server-rounds as num_rounds)")
        raise ConfigError(f"the run never stops: {stops}")

    # ------------------------------------------------------------- resolution
    def node_wait(self, timeout: float) -> float:
        """Seconds to wait for nodes: ``wait_for_nodes``, or when it is None the shorter of ``timeout`` and
        :data:`NODE_WAIT_CAP_S`."""
        return min(timeout, NODE_WAIT_CAP_S) if self.wait_for_nodes is None else self.wait_for_nodes

    def engine_config(self, *, num_rounds: int, timeout: float, concurrency: int, round_arrivals: int,
                      node_wait: float, auto_hold: float = 0.0) -> "EngineConfig":
        """What the engine runs with, once the nodes are known (``concurrency``: resolved ``K``;
        ``round_arrivals``: accepted updates per round, 0 = a round is a server version; ``auto_hold``: the
        strategy's ``dispatch_hold`` when it is unset); call
        :meth:`check_run` first, before anything waits for nodes."""
        preset, model = resolve_delays(self.clock, self.delay_model)
        identify = (self.clock == "virtual" or self.emulate_delay_scale > 0) if self.identify_nodes is None \
            else self.identify_nodes
        hold = self.dispatch_hold if self.dispatch_hold is not None \
            else 0.0 if self.overlap_server_compute else auto_hold
        resolved = dict(concurrency=concurrency, delay_model=model, delay_preset=preset, identify_nodes=identify,
                        dispatch_hold=hold,
                        target_accuracy=tuple(self.target_accuracy), timeout=timeout, wait_for_nodes=node_wait,
                        num_rounds=num_rounds, round_arrivals=round_arrivals)
        as_set = {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(EngineConfig)
                  if spec.name in self.names() and spec.name not in resolved}  # one name from start() to the engine
        return EngineConfig(**as_set, **resolved)


_generated_init = RunOptions.__init__


def _init_with_old_names(self: RunOptions, *args: Any, **keywords: Any) -> None:
    _generated_init(self, *args, **_renamed_keywords(keywords))  # RunOptions(delays=...)


RunOptions.__init__ = _init_with_old_names  # type: ignore[method-assign]


def _whole(name: str, value: Any, minimum: int, optional: bool = False, key: str | None = "") -> None:
    """``value`` must be an integer >= ``minimum`` (``key``: its run-config key; "" = the name in kebab case)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        where = "" if key is None else f" (run-config {key or name.replace('_', '-')})"
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}" + (" or None" if optional else "") + where)


def parse_targets(text: Any) -> tuple[float, ...]:
    """``"0.8,0.9"`` -> ``(0.8, 0.9)``; a tuple or list passes through."""
    if isinstance(text, (tuple, list)):
        return tuple(float(t) for t in text)
    if not str(text).strip():
        return ()
    try:
        return tuple(float(t) for t in str(text).split(","))
    except ValueError as exc:
        raise ConfigError(f"target-accuracy={text!r}: write comma-separated fractions like '0.8,0.9'") from exc


def resolve_delays(clock: str, delay_model: Any) -> tuple[str, DelayModel | RuntimeCategories | IntertwinedDelays]:
    """The delay preset name and model for ``clock`` (the wall clock needs none)."""
    if clock not in CLOCKS:
        raise ConfigError(f"clock={clock!r} is not valid; choose one of: {', '.join(CLOCKS)}")
    if delay_model is None:
        if clock == "virtual":
            raise ConfigError("clock='virtual' draws each job's duration from a delay model: pass "
                              f"delay_model=<DelayModel> or a preset name ({', '.join(DELAY_PRESETS)})")
        return "uniform-speed", DELAY_PRESETS["uniform-speed"]
    if isinstance(delay_model, str):
        if delay_model not in DELAY_PRESETS:
            raise ConfigError(f"delay_model={delay_model!r} is not a preset; choose one of: "
                              f"{', '.join(DELAY_PRESETS)}")
        return delay_model, DELAY_PRESETS[delay_model]
    if isinstance(delay_model, DELAY_TYPES):  # a model equal to a preset (the built-in app parses one) is named by it
        return _preset_name(delay_model), delay_model
    raise ConfigError(f"delay_model must be a DelayModel, RuntimeCategories, IntertwinedDelays or a preset name, "
                      f"got {type(delay_model).__name__}")


def _preset_name(model: Any) -> str:
    """The preset ``model`` is (``"<preset> (gamma g)"`` for a category preset with another ``gamma``), else
    ``"custom"``."""
    for name, preset in DELAY_PRESETS.items():
        if preset == model:
            return name
        if isinstance(model, RuntimeCategories) and isinstance(preset, RuntimeCategories) \
                and dataclasses.replace(model, gamma=preset.gamma) == preset:
            return f"{name} (gamma {model.gamma:g})"
    return "custom"


#: Marks an EngineConfig field a resumed run must match (a checkpoint records it).
MATCH_ON_RESUME = {"resume": True}


def _resumed(default: Any = dataclasses.MISSING) -> Any:
    return dataclasses.field(default=default, metadata=MATCH_ON_RESUME)


@dataclass(frozen=True)
class EngineConfig:
    """The options resolved for one run: what :class:`~asyncfl.server_app.engine.AsyncEngine` reads.

    Built by :meth:`RunOptions.engine_config`, which checks everything a user sets; it has no
    defaults of its own (every default is :class:`RunOptions`'s), so a run built elsewhere
    cannot get settings no user runs. A field
    that is an option has the option's name (its run-config key: :meth:`RunOptions.key_of`);
    the values are resolved (``concurrency`` an integer, ``delay_model`` a model). The rest come
    from the run: ``num_rounds`` and ``timeout`` are Flower's,
    ``round_arrivals`` the cohort a round stands for. Fields marked :data:`MATCH_ON_RESUME`
    are recorded in checkpoints and must match when a run resumes.
    """

    clock: str = _resumed()
    concurrency: int = _resumed()
    max_arrivals: int
    max_time: float
    evaluate_every_time: float = _resumed()
    target_accuracy: tuple[float, ...]
    timeout: float  # seconds a job may take (Flower's timeout; run-config timeout)
    wait_for_nodes: float
    seed: int = _resumed()
    delay_preset: str  # a name for the record (config.json); a resumed run matches on the model itself
    delay_model: DelayModel | RuntimeCategories | IntertwinedDelays
    progress: bool
    emulate_delay_scale: float = _resumed()
    overlap_server_compute: bool = _resumed()
    dispatch_hold: float = _resumed()
    server_time_scale: float = _resumed()
    round_deadline: float = _resumed()
    pipeline_late_clients: bool = _resumed()
    num_rounds: int  # stop after this many rounds (0 = no cap); Flower's num_rounds
    evaluate_every: int = _resumed()  # also evaluate every this many rounds (0 = by clock only)
    tail_average_rounds: int = _resumed()  # the scored model: the mean over the current one and N - 1 round ends
    # a round is this many accepted updates (asynchronous strategies under Flower's num_rounds: the cohort
    # FedAvg would train); 0: a round is a server version (synchronous strategies)
    round_arrivals: int = _resumed()
    identify_nodes: bool = _resumed()  # ask nodes for partition id and size (query messages) before the first job
    jobs_per_client: int = _resumed()  # wall clock: jobs a client may have out at once (> 1 queues its next job)
    update_norm_bound: float = _resumed()  # bound each update's movement at this x the recent median (0 = off)
    update_norm_action: str = _resumed()  # "clip" or "reject"
    cap_in_flight: bool  # wall clock: jobs in flight capped at the measured parallelism + 1

    @classmethod
    def resume_fields(cls) -> tuple[str, ...]:
        """The fields a checkpoint records and a resumed run must match."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("resume"))
