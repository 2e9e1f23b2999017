"""The strategy interface: react to one client arrival, never touch Grid or clocks.

:class:`Strategy` is the method's interface (``on_start``, ``on_arrival``, ``dispatch_model``, ``on_round_end``,
``summary``) and ``start``; its other concerns are pieces of their own: the automatic step
(:class:`~asyncfl.strategies.pace.PacedSteps`), Flower's hooks (:mod:`asyncfl.strategies.hooks`) and checkpoint state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from asyncfl.strategies.arrival import Arrival  # noqa: F401  (re-exported: strategies import it from here)
from asyncfl.strategies.flower_options import FlowerOptions
from asyncfl.strategies.hooks import FlowerHooks
from asyncfl.strategies.pace import PacedSteps
from asyncfl.strategies.settings import StrategyConfig
from asyncfl.strategies.strategy_state import StrategyState

if TYPE_CHECKING:  # the engine side is imported only when a run starts
    from collections.abc import Sequence

    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp import Grid

    from asyncfl.callbacks import Callback
    from asyncfl.options import RunOptions
    from asyncfl.server_app.launch import AsyncResult
    from asyncfl.strategies.resources import StrategyResources

_DEFAULT_OPTIONS = FlowerOptions()


class Strategy(PacedSteps, FlowerHooks, StrategyState, ABC):
    """A server-side method: turns arrivals into new global models.

    Subclasses implement :meth:`on_arrival`: a new flat model advances the server version, ``None``
    keeps it (the engine owns the model). Knobs are the fields of :attr:`config_class` (validated
    there); the constructor takes them as keywords and keeps the checked values in :attr:`config`.

    Every strategy also takes Flower ``FedAvg``'s keyword arguments (``fraction_train``, ``min_available_nodes``,
    ...: :mod:`asyncfl.strategies.flower_options` says what each means here); :meth:`start` has Flower's signature.
    """

    #: The method's knobs: a :class:`StrategyConfig` dataclass beside the class.
    config_class: type[StrategyConfig] = StrategyConfig
    #: Its run-config ``strategy``, set in a built-in method's own body (where the registry finds it).
    run_config_name: str | None = None
    looks_ahead: bool = False  #: The class overrides :meth:`dispatch_model` (set per subclass): the engine asks it.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.looks_ahead = cls.dispatch_model is not Strategy.dispatch_model
        init = cls.__dict__.get("__init__")
        if init is not None and init.__doc__ is None:  # help() would say "Initialize self" for the constructor
            init.__doc__ = (f"Build {cls.__name__}: its knobs are the keywords above (Parameters, checked by "
                            f"{cls.config_class.__name__}); Flower's FedAvg keywords (fraction_train, "
                            "fraction_evaluate, min_available_nodes, ...) pass through.")

    def __init__(self, **flower_options: Any) -> None:
        self._flower = FlowerOptions.for_strategy(type(self).__name__, flower_options)

    @classmethod
    def from_config(cls, config: StrategyConfig, resources: "StrategyResources | None" = None,
                    **flower_options: Any) -> "Strategy":
        """The built-in app's way in, from the parsed run-config section (a server-side network: from ``resources``)."""
        if not isinstance(config, cls.config_class):
            raise TypeError(f"{cls.__name__}.from_config needs {cls.config_class.__name__}, not "
                            f"{type(config).__name__}")
        return cls(**config.keywords(), **flower_options)

    @property
    def name(self) -> str:
        """What runs call it (``summary.json``'s ``strategy``): the class name unless set (e.g. ``fedbuff``)."""
        return self.__dict__.get("_name") or type(self).__name__

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def flower(self) -> FlowerOptions:
        """The Flower ``FedAvg`` options this strategy was built with (defaults when none were given)."""
        return self.__dict__.get("_flower", _DEFAULT_OPTIONS)

    #: True: the engine runs synchronous rounds (a full cohort dispatched when none is in flight,
    #: :meth:`on_round_end` after the round's last reply, accepted or lost).
    synchronous: bool = False

    def on_start(self, num_clients: int, concurrency: int = 1) -> None:
        """Called once after discovery, before the first dispatch, with ``K`` jobs in flight (``concurrency``), which
        sets a delta-adding method's default step (:mod:`asyncfl.strategies.pace`); an override calls super()."""
        self._start_pacing(concurrency)

    @abstractmethod
    def on_arrival(self, arrival: Arrival, current: np.ndarray) -> np.ndarray | None:
        """React to one accepted arrival; return the new global model or ``None``."""

    def dispatch_model(self, client: int, current: np.ndarray) -> np.ndarray | None:
        """A model to send ``client`` instead of the global one (the arrival's ``base``; W-Pred's look-ahead)."""
        return None

    def update_coefficient(self, arrival: Arrival) -> float | None:
        """How much of ``arrival.delta`` the next server step adds, known without its content (DP calibrates its
        noise to it: :mod:`asyncfl.strategies.privacy`); None: the step is not such a weighted sum."""
        return None

    def on_round_end(self, current: np.ndarray) -> np.ndarray | None:
        """Called by the engine when a synchronous round has no job left in flight."""
        return None

    def summary(self) -> dict[str, float | int | str]:
        """Strategy-specific figures for ``summary.json`` (an override returning None, as Flower's, adds none)."""
        return {}

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
        trusted_train_fn: "Callable[[int, ArrayRecord], ArrayRecord] | None" = None,
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
            Rounds of client work, as in Flower (0 = no cap): a round is the cohort Flower's ``FedAvg``
            trains, ``max(min_train_nodes, int(fraction_train * nodes))`` updates, so an asynchronous
            strategy stops after ``num_rounds * cohort`` accepted updates (the same client work as
            ``FedAvg``) whatever number of server versions it makes of them (reported apart:
            ``summary["server-versions"]``). A synchronous strategy runs ``num_rounds`` versions.
        timeout : float
            Seconds a job may take before it counts as lost; also the longest wait for nodes.
        train_config, evaluate_config : ConfigRecord, optional
            Sent with every train / evaluate request (``model-version`` and ``server-round`` are added).
        evaluate_fn : callable, optional
            ``(server_round, ArrayRecord) -> MetricRecord | None``, called on the initial model
            (round 0) and every ``evaluate_every`` rounds; its ``accuracy``/``loss`` feed the run's curves.
        options : RunOptions, optional
            The asynchronous run's options (clock, delays, concurrency, stops, run folder, ...):
            :class:`asyncfl.options.RunOptions`, which documents each one.
        run_config : dict, optional
            What the run folder's ``config.json`` records (default: the strategy's name and Flower
            options); the engine's settings as the run resolves them are added under ``"engine"``.
        callbacks : sequence of asyncfl.Callback, optional
            Told of every new server version and every evaluation (tracking): :mod:`asyncfl.callbacks`.
        trusted_train_fn : callable, optional
            ``(server_version, ArrayRecord) -> ArrayRecord``: the model trained on data the server trusts;
            each update then loses any component against that descent (:mod:`~asyncfl.server_app.trusted_direction`).
        **option_keywords
            Any :class:`~asyncfl.options.RunOptions` field by name (``clock="virtual"``,
            ``delay_model="fedrevive-default"``, ``seed=1``, ...), changing ``options`` or the defaults.
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
                                  evaluate_fn, run_options, run_config, callbacks, trusted_train_fn)
        finally:
            self.__dict__["_starting"] = False


def _register_with_flower() -> None:
    """``isinstance(FedBuff(), flwr.serverapp.strategy.Strategy)``: they have Flower's five methods and start()."""
    from flwr.serverapp.strategy import Strategy as FlowerStrategy

    FlowerStrategy.register(Strategy)


_register_with_flower()
