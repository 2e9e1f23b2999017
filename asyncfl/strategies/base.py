"""The strategy interface: react to one client arrival, never touch Grid or clocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from asyncfl.strategies.arrival import Arrival  # noqa: F401  (re-exported: strategies import it from here)
from asyncfl.strategies.flower_options import FlowerOptions
from asyncfl.strategies.pace import BUFFER_BOUNDS, auto_buffer_size, paced_server_lr
from asyncfl.strategies.response import ResponseMeter
from asyncfl.strategies.settings import StrategyConfig

if TYPE_CHECKING:  # the engine side is imported only when a run starts
    from collections.abc import Iterable, Sequence

    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid

    from asyncfl.callbacks import Callback
    from asyncfl.options import RunOptions
    from asyncfl.server_app.launch import AsyncResult
    from asyncfl.strategies.resources import StrategyResources

_DEFAULT_OPTIONS = FlowerOptions()


def _same(a: Any, b: Any) -> bool:
    """Knob values equal (arrays and nested values compared by content)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return bool(a == b)


def check_saved_strategy(state: dict, class_name: str, config: Any) -> None:
    """Refuse a checkpoint's strategy ``state`` unless it is ``class_name``'s, saved with ``config``'s knobs.

    A knob the checkpoint does not record (added to the method later) counts as equal when ``config``
    has it at its default, which reproduces what the saved run did. The message names each knob by its
    keyword and, for the built-in app, its run-config key.

    Raises
    ------
    StateError
        Saying what differs.
    """
    from asyncfl.state import StateError, capture, restore

    if state.get("class") != class_name:
        raise StateError(f"the checkpoint's strategy is {state.get('class')}, this run's is {class_name}")
    ours = restore(None, capture(config.keywords()))
    theirs = restore(None, state["config"])
    defaults = type(config).defaults() if hasattr(type(config), "defaults") else {}
    differ = sorted(k for k in set(ours) | set(theirs) if not _same(ours.get(k), theirs.get(k))
                    and not (k not in theirs and k in defaults and _same(ours.get(k), defaults[k])))
    if differ:
        def key(k: str) -> str:
            try:
                return f" (run-config {type(config).key_of(k)})"
            except (AttributeError, StopIteration):
                return ""

        raise StateError(f"the checkpoint's {class_name} has other settings: " + ", ".join(
            f"{k}={theirs.get(k)!r} there, {ours.get(k)!r} here{key(k)}" for k in differ))


class Strategy(ABC):
    """A server-side method: turns arrivals into new global models.

    Subclasses implement :meth:`on_arrival`. The engine owns the global model;
    a strategy returns a new flat vector when it wants the server version to
    advance, or ``None`` to keep the current one. A subclass's knobs are the fields
    of its :attr:`config_class` (validated there); its constructor takes them as
    keywords and keeps the validated values in :attr:`config`.

    Every strategy also takes the keyword arguments of Flower's ``FedAvg``
    (``fraction_train``, ``fraction_evaluate``, ``min_train_nodes``,
    ``min_evaluate_nodes``, ``min_available_nodes``, ``weighted_by_key``,
    ``arrayrecord_key``, ``configrecord_key``, ``train_metrics_aggr_fn``,
    ``evaluate_metrics_aggr_fn``); :mod:`asyncfl.strategies.flower_options` says
    what each means in an asynchronous run. :meth:`start` has Flower's
    ``Strategy.start`` signature.
    """

    #: The method's knobs: a :class:`StrategyConfig` dataclass beside the class.
    config_class: type[StrategyConfig] = StrategyConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and init.__doc__ is None:  # help() would say "Initialize self" for the constructor
            init.__doc__ = (f"Build {cls.__name__}: its knobs are the keywords above (Parameters, checked by "
                            f"{cls.config_class.__name__}); Flower's FedAvg keywords (fraction_train, "
                            "fraction_evaluate, min_available_nodes, ...) pass through.")

    def __init__(self, **flower_options: Any) -> None:
        valid = [f.name for f in fields(FlowerOptions)]
        unknown = sorted(set(flower_options) - set(valid))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s) {', '.join(unknown)}; "
                            f"besides its own, it accepts Flower's FedAvg options: {', '.join(valid)}")
        self._flower = FlowerOptions(**flower_options)

    @classmethod
    def from_config(cls, config: StrategyConfig, resources: "StrategyResources | None" = None,
                    **flower_options: Any) -> "Strategy":
        """The built-in app's way in: this strategy from its parsed run-config section.

        Methods that run a network on the server override this to take their model and
        data from ``resources`` (the built-in app's model zoo and dataset).
        """
        if not isinstance(config, cls.config_class):
            raise TypeError(f"{cls.__name__}.from_config needs a {cls.config_class.__name__}, "
                            f"got {type(config).__name__}")
        return cls(**config.keywords(), **flower_options)

    @property
    def name(self) -> str:
        """What runs call this strategy (``summary.json``'s ``strategy``): the class name unless set
        (the built-in app sets its run-config name, e.g. ``fedbuff``)."""
        return self.__dict__.get("_name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def flower(self) -> FlowerOptions:
        """The Flower ``FedAvg`` options this strategy was built with (defaults when none were given)."""
        return self.__dict__.get("_flower", _DEFAULT_OPTIONS)

    #: Jobs in flight (``K``), as the engine told :meth:`on_start`; ``None`` before a run.
    concurrency: int | None = None

    #: Entries of the flat model that are trained (BatchNorm statistics and integer counters excluded), as the
    #: engine sets it before :meth:`on_start`; ``None``: every entry (or not known).
    trained_entries: np.ndarray | None = None

    #: Set by a strategy whose automatic step follows the clients' measured response
    #: (:mod:`asyncfl.strategies.response`); ``None``: the stable pace for any client.
    response_meter: "ResponseMeter | None" = None

    def _measure_response(self, pace: str, server_lr: float) -> None:
        """Keep a :class:`~asyncfl.strategies.response.ResponseMeter` when the automatic step (``server_lr=0``)
        follows the clients' measured response (``pace="measured"``)."""
        self.response_meter = ResponseMeter() if pace == "measured" and not server_lr else None

    def _observe_response(self, arrival: Arrival) -> None:
        """Feed ``arrival`` to the response meter, if any (on the trained entries only)."""
        if self.response_meter is not None:
            self.response_meter.observe(arrival, self.trained_entries)

    def _pace_summary(self) -> dict[str, float | int | None]:
        """The measured pace's figures for :meth:`summary` (none without a meter)."""
        return self.response_meter.summary() if self.response_meter is not None else {}

    def _paced_lr(self, configured: float, updates_per_step: int = 1, extra_delay: float = 0.0) -> float:
        """The server learning rate to use: ``configured``, or when it is 0 (auto) the stable pace for ``K`` jobs
        in flight, ``min(1, B * g(K, B))``, scaled by ``2 / lambda_bound`` when a response meter measures the
        clients (:mod:`asyncfl.strategies.pace`), with ``extra_delay`` updates added to the delay ``d`` (CA2FL's
        :func:`~asyncfl.strategies.pace.cache_lag`). Before :meth:`on_start` (no ``K`` known) auto is 1."""
        if configured > 0:
            return configured
        meter = self.response_meter
        return paced_server_lr(updates_per_step, self.concurrency or updates_per_step,
                               meter.bound if meter is not None else 2.0, extra_delay)

    @property
    def buffer_size(self) -> int:
        """Updates per server step of a buffered method (FedBuff, CA2FL, FADAS, FedEcho: its ``config.buffer_size``),
        or when that is 0 (auto) ``K // 4`` within ``[2, 10]`` for ``K`` jobs in flight
        (:func:`asyncfl.strategies.pace.auto_buffer_size`). Before :meth:`on_start` auto is 2."""
        configured = getattr(self.config, "buffer_size", None)
        if configured is None:
            raise AttributeError(f"{type(self).__name__} does not buffer updates")
        if configured > 0:
            return configured
        return auto_buffer_size(self.concurrency) if self.concurrency else BUFFER_BOUNDS[0]

    #: When True the engine runs synchronous rounds: it dispatches a full cohort
    #: only when no job is in flight and calls :meth:`on_round_end` after the last
    #: reply of the round (accepted or lost).
    synchronous: bool = False

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        """Called once by the engine, after client discovery, before the first dispatch.

        ``concurrency`` is the number of jobs in flight (``K``): a delta-adding method's default
        server step is set from it (see :func:`asyncfl.strategies.pace.per_update_share`).
        """
        self.concurrency = concurrency

    @abstractmethod
    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        """React to one accepted arrival; return the new global model or ``None``."""

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        """The model to send ``client`` instead of the current global one (``None``: the global model).

        The arrival's ``base`` is then the model that was sent. Used by W-Pred's look-ahead.
        """
        return None

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        """Called by the engine when a synchronous round has no job left in flight."""
        return None

    def summary(self) -> dict[str, float | int | str]:
        """Strategy-specific figures for ``summary.json`` (Flower's ``summary()`` logs and returns None; an
        override of that shape is called too, and adds nothing)."""
        return {}

    # ------------------------------------------------------------ Flower's hooks
    def overrides(self, hook: str) -> bool:
        """Whether this strategy's class overrides ``hook`` (a Flower hook the engine then calls; it skips
        building requests for one that is not overridden)."""
        return getattr(type(self), hook) is not getattr(Strategy, hook)

    def configure_train(self, server_round: int, arrays: "ArrayRecord", config: "ConfigRecord",
                        grid: "Grid") -> "Iterable[Message]":
        """Flower's hook: the train requests of round ``server_round``, one per node.

        Called as Flower calls it: once per round of client work (see :meth:`start`'s
        ``num_rounds``), when the round's first job is dispatched, with the global model then
        in effect and the same ``train_config`` record every round (so an override that
        changes it in place, e.g. halving ``config["lr"]`` every 5 rounds, changes it for good,
        as under Flower's ``FedAvg``). Every job of the round carries the config of the
        returned message addressed to its node (or of the first message, for a node without
        one); the engine adds ``model-version``, ``job-seed`` and ``dispatch-time``. Which
        node trains when is the engine's choice (whoever is idle), not this method's; the
        arrays of the returned messages are not used (a job carries the model version it is
        sent with).

        Called by a Flower app's own loop instead (outside :meth:`start`), it returns what Flower's
        ``FedAvg`` would: requests to ``fraction_train`` of the nodes, each with a copy of ``config``
        plus ``server-round`` (:mod:`asyncfl.strategies.custom_loop`).
        """
        from flwr.common import MessageType

        from asyncfl import protocol

        if not self._in_start:  # a Flower app's own loop: Flower's sample, the caller's record left as it was
            from asyncfl.strategies.custom_loop import configure_train_messages

            return configure_train_messages(self, self._custom_loop, server_round, arrays, config, grid)
        config[protocol.SERVER_ROUND] = server_round
        return self._requests(arrays, config, grid, MessageType.TRAIN)

    def aggregate_train(self, server_round: int,
                        replies: "Iterable[Message]") -> "tuple[ArrayRecord | None, MetricRecord | None]":
        """Flower's hook, for a Flower app that runs its own loop instead of :meth:`start`.

        The round's replies go through the method's :meth:`on_arrival` in order, each with
        staleness 0 (they all trained from the model :meth:`configure_train` sent), and the
        model the method made comes back with the replies' train metrics aggregated as Flower's
        (:mod:`asyncfl.strategies.custom_loop`). Such a loop is synchronous; :meth:`start` never
        calls this hook.
        """
        return self._custom_loop.aggregate(server_round, replies)

    @property
    def _custom_loop(self):
        from asyncfl.strategies.custom_loop import SynchronousRounds

        if "_rounds" not in self.__dict__:
            self.__dict__["_rounds"] = SynchronousRounds(self)
        return self.__dict__["_rounds"]

    @property
    def _in_start(self) -> bool:
        return self.__dict__.get("_starting", False)

    #: The attributes that change as arrivals come in (buffers, caches, moments, networks, random
    #: generators): what :meth:`state_dict` saves; ``()`` for a method without any. A subclass with
    #: more state names it here, or overrides :meth:`state_dict` / :meth:`load_state_dict` (as a torch
    #: ``Module`` does). ``None`` (a strategy that has not said): it cannot be checkpointed.
    state_attributes: tuple[str, ...] | None = None

    @property
    def checkpointable(self) -> bool:
        """Whether this strategy says what its state is (:attr:`state_attributes`, or its own :meth:`state_dict`)."""
        return self.state_attributes is not None or type(self).state_dict is not Strategy.state_dict

    def state_dict(self) -> dict:
        """Everything that makes this strategy's next updates what they will be, as a plain copy.

        A fresh strategy built with the same keywords, started with :meth:`on_start` and given
        this dict through :meth:`load_state_dict` makes the same updates from the same arrivals:
        what a checkpoint saves and a resumed run restores. Contents: the class, its knobs
        (a checkpoint refuses another class or other knobs) and :attr:`state_attributes`.
        """
        from asyncfl.state import StateError, capture

        if self.state_attributes is None:
            raise StateError(f"{type(self).__qualname__} does not say what its state is, so it cannot be "
                             "checkpointed: give it a state_attributes tuple (() when it keeps none), or "
                             "state_dict()/load_state_dict() methods")
        self._settle()
        return {"class": type(self).__qualname__, "config": capture(self.config.keywords(), "config"),
                "state": {name: capture(getattr(self, name), name) for name in self.state_attributes}}

    def load_state_dict(self, state: dict) -> None:
        """Take the state :meth:`state_dict` saved (after :meth:`on_start`, before the first arrival).

        Raises
        ------
        StateError
            When ``state`` is another class's, or was saved with other knobs (naming what differs).
        """
        from asyncfl.state import restore

        self.check_state(state)
        for name in self.state_attributes:
            setattr(self, name, restore(getattr(self, name, None), state["state"][name], name))

    def configure_evaluate(self, server_round: int, arrays: "ArrayRecord", config: "ConfigRecord",
                           grid: "Grid") -> "Iterable[Message]":
        """Flower's hook: the federated-evaluation requests of round ``server_round``, one per node.

        Called at each federated evaluation point (``fraction_evaluate > 0``) with the model in
        effect then and the same ``evaluate_config`` record every time. Each sampled node gets the
        config of the returned message addressed to it (the sample itself is the engine's, seeded);
        ``server-round`` and ``model-version`` are added.
        """
        from flwr.common import MessageType

        if not self._in_start:  # a Flower app's own loop: Flower's sample of fraction_evaluate of the nodes
            from asyncfl.strategies.custom_loop import evaluate_messages

            return evaluate_messages(self, self._custom_loop, server_round, arrays, config, grid)
        return self._requests(arrays, config, grid, MessageType.EVALUATE)

    def _requests(self, arrays: "ArrayRecord", config: "ConfigRecord", grid: "Grid", message_type: str) -> list:
        """One ``message_type`` message per node of ``grid``, all carrying ``arrays`` and ``config`` (as Flower's
        ``FedAvg`` builds them, under this strategy's record keys)."""
        from flwr.app import Message, RecordDict

        content = RecordDict({self.flower.arrayrecord_key: arrays, self.flower.configrecord_key: config})
        return [Message(content, dst_node_id=node, message_type=message_type) for node in grid.get_node_ids()]

    def aggregate_evaluate(self, server_round: int, replies: "Iterable[Message]") -> "MetricRecord | None":
        """Flower's hook: one round's federated-evaluation replies -> its ``evaluate_metrics_clientapp`` entry.

        Default: ``evaluate_metrics_aggr_fn`` over the replies (Flower's weighted average by
        ``weighted_by_key``). Called when every reply of the point is in or lost; each reply's
        content holds its metric record under ``"metrics"``.
        """
        from asyncfl.server_app.client_metrics import aggregate_replies

        flower = self.flower
        return aggregate_replies([reply.content for reply in replies], flower.weighted_by_key,
                                 flower.evaluate_metrics_aggr_fn, "evaluate")

    def check_state(self, state: dict) -> None:
        """Raise :class:`~asyncfl.state.StateError` unless ``state`` is this class's, saved with the same knobs
        and holding every one of :attr:`state_attributes` (the message says what differs)."""
        from asyncfl.state import StateError

        ours_name = type(self).__qualname__
        check_saved_strategy(state, ours_name, self.config)
        missing = sorted(set(self.state_attributes or ()) - set(state["state"]))
        if missing:
            raise StateError(f"the checkpoint's {ours_name} state lacks {', '.join(missing)}")

    def _settle(self) -> None:
        """Finish any background work (a thread computing logits or teachers) so the state is complete."""

    def start(
        self,
        grid: "Grid",
        initial_arrays: "ArrayRecord",
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: "ConfigRecord | None" = None,
        evaluate_config: "ConfigRecord | None" = None,
        evaluate_fn: "Callable[[int, ArrayRecord], MetricRecord | None] | None" = None,
        *,
        options: "RunOptions | None" = None,
        run_config: dict | None = None,
        callbacks: "Sequence[Callback]" = (),
        **option_keywords: Any,
    ) -> "AsyncResult":
        """Run this strategy asynchronously on ``grid``: Flower's ``Strategy.start`` parameters, plus run options.

        Parameters
        ----------
        grid : Grid
            Flower's Grid, as the ServerApp's ``main`` receives it.
        initial_arrays : ArrayRecord
            The initial global model: any layout and dtypes (integer buffers included).
        num_rounds : int
            Rounds of client work, as in Flower (0 = no cap). A round is what Flower's ``FedAvg``
            trains with the same arguments: ``cohort = max(min_train_nodes, int(fraction_train *
            nodes))`` client updates. An asynchronous strategy stops after ``num_rounds * cohort``
            accepted updates, whatever number of server versions it makes of them (FedBuff one per
            ``buffer_size`` updates, FedAsync one per update), so swapping Flower's ``FedAvg`` for it
            keeps the client-compute budget. A synchronous strategy (:class:`FedAvg`) runs
            ``num_rounds`` rounds, one server version each. Server versions are reported apart
            (``summary["server-versions"]``, ``metrics.csv``'s ``server_version``).
        timeout : float
            Seconds a job may take before it counts as lost; also the longest wait for nodes.
        train_config, evaluate_config : ConfigRecord, optional
            Sent with every train / evaluate request (``model-version`` and ``server-round`` are added).
        evaluate_fn : callable, optional
            ``(server_round, ArrayRecord) -> MetricRecord | None``, called on the initial model
            (round 0) and at the end of every ``evaluate_every`` rounds with the model in effect
            then; its ``accuracy``/``loss`` entries (if any) feed the run folder's curves.
        options : RunOptions, optional
            The asynchronous run's options (clock, delays, concurrency, stops, run folder, ...):
            :class:`asyncfl.options.RunOptions`, which documents each one.
        run_config : dict, optional
            What the run folder's ``config.json`` records (default: the strategy's name, Flower
            options and the resolved engine settings).
        callbacks : sequence of asyncfl.Callback, optional
            Told of every new server version and every evaluation (logging, an experiment
            tracker, best-model files): :mod:`asyncfl.callbacks`.
        **option_keywords
            Any :class:`~asyncfl.options.RunOptions` field by name (``clock="virtual"``,
            ``delays="fedrevive-default"``, ``seed=1``, ...), changing ``options`` or the defaults.
            An unknown name raises ``TypeError`` listing the valid ones; invalid values raise
            :class:`~asyncfl.strategies.settings.ConfigError` before any message is sent.

        Returns
        -------
        AsyncResult
            Flower's ``Result`` (final arrays; train, federated-evaluate and server-evaluate
            metrics keyed by round, as Flower's are, so a plot of ``FedAvg``'s result and of this
            one share their x axis: equal keys, equal client work) plus ``summary``: rounds,
            server versions, staleness, rejections, timing.
        """
        from asyncfl.options import RunOptions
        from asyncfl.server_app.launch import start_strategy

        run_options = RunOptions.from_keywords(options, **option_keywords)
        self.__dict__["_starting"] = True  # Flower's hooks are the engine's from here (not a custom loop's)
        try:
            return start_strategy(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
                                  evaluate_fn, run_options, run_config, callbacks)
        finally:
            self.__dict__["_starting"] = False


def _register_with_flower() -> None:
    """``isinstance(FedBuff(), flwr.serverapp.strategy.Strategy)`` holds: asyncfl's strategies have Flower's five
    methods (``configure_train``, ``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``, ``summary``)
    and its ``start`` signature, so code that checks for a Flower strategy takes them."""
    from flwr.serverapp.strategy import Strategy as FlowerStrategy

    FlowerStrategy.register(Strategy)


_register_with_flower()
