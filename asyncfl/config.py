"""Run configuration: parse Flower's flat run-config once into frozen dataclasses.

This module holds the keys every run shares (data, local training, engine, output);
each strategy's own keys (``fedbuff.*``) are parsed by its config dataclass, beside
the strategy class (:mod:`asyncfl.strategies.settings`), found through
:mod:`asyncfl.strategies.registry`. Every key has a default in ``pyproject.toml``
(Flower rejects unknown keys). Validation happens once, before any work starts,
with messages that name the valid choices.
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from asyncfl.data.datasets import DATASETS, check_files
from asyncfl.data.readers import DatasetNotFoundError
from asyncfl.data.drift import DriftConfig, check_source
from asyncfl.data.partition import PARTITIONINGS
from asyncfl.models.zoo import MODELS
from asyncfl.simulation.categories import RuntimeCategories
from asyncfl.decentralized.settings import GOSSIP_METHODS, GossipConfig
from asyncfl.simulation.intertwined import IntertwinedDelays
from asyncfl.simulation.delays import COMPONENTS, ComponentDelay, DelayModel, parse_tiers
from asyncfl.simulation.presets import DELAY_PRESETS, with_gamma
from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class
from asyncfl.client_app.drills import check_drill
from asyncfl.options import CLOCKS, EngineConfig, RunOptions, current_keys
from asyncfl.strategies.settings import ConfigError, StrategyConfig

STRATEGIES = tuple(STRATEGY_CLASSES) + GOSSIP_METHODS
OPTIMIZERS = ("sgd", "adam")

#: The built-in app's own values where they are not the library's defaults (``RunOptions``, and Flower's
#: ``timeout`` in ``Strategy.start``): it is a seeded simulation on embedded data that stops by itself and
#: writes as it goes. Its pyproject.toml holds these; every other option there has the library's default
#: ("" for None), which tests/test_options.py checks key by key.
BUILTIN_APP_CHOICES = {
    "clock": "virtual", "delay-model": "fedrevive-default", "seed": 42,  # a seeded simulation
    "concurrency": 10, "max-arrivals": 300,  # stops by itself; K = 10 of the SuperNodes in flight
    "evaluate-every": 0, "evaluate-every-time": 2.0,  # scored by the clock: its runs have no Flower rounds
    "target-accuracy": "0.8,0.9", "progress": True,  # time-to-target figures; a progress line every 2 s
    "output-dir": "outputs", "checkpoint-every": 10,  # written as it goes, resumable
    "identify-nodes": True,  # its own ClientApp answers the identity query, so it asks on either clock
    "wait-for-nodes": 30.0, "timeout": 300.0,  # simulated nodes connect at once and jobs take seconds
    "dispatch-hold": 0.0,  # the studies' stored runs ran without FedBuff's hold (the library's FedBuff: 0.1)
}

__all__ = ["ConfigError", "DataConfig", "EngineConfig", "OutputConfig", "RunConfig", "TrainConfig",
           "parse_run_config", "STRATEGIES", "CLOCKS", "OPTIMIZERS"]


def _choice(key: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(valid)}")
    return value


def _positive(key: str, value: float, allow_zero: bool = False) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value} must be a finite number {'>= 0' if allow_zero else '> 0'}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")
    return value


def _int(cfg: Mapping[str, Any], key: str, default: Any = None) -> int:
    """``cfg[key]`` (``default`` where a stored run config predates the key) as a whole number, or the key's
    one-line error."""
    value = cfg[key] if default is None else cfg.get(key, default)
    whole = isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if not whole:
        raise ConfigError(f"{key}={value!r} must be a whole number")
    return int(value)


def _float(cfg: Mapping[str, Any], key: str) -> float:
    """``cfg[key]`` as a number, or the key's one-line error."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}={value!r} must be a number")
    return float(value)


def _at_least_one(key: str, value: int) -> int:
    if value < 1:
        raise ConfigError(f"{key}={value} must be >= 1")
    return value


@dataclass(frozen=True)
class DataConfig:
    """What each client trains on and how the training set is split."""

    dataset: str
    data_dir: str
    partitioning: str
    dirichlet_alpha: float
    shards_per_client: int
    test_fraction: float
    model: str
    batchnorm: bool
    server_holdout: float = 0.0
    track_statistics: bool = False  # cnn only: FedRevive's reference layers (statistics recorded, not normalised)
    samples_per_client: int = 32  # partitioning "sampled" / "dirichlet-sampled": rows each client draws
    max_samples_per_client: int = 0  # > 0: a seeded subsample of at most this many rows of each partition
    eval_batch_size: int = 64  # the built-in app's server-side evaluation, in chunks of this many samples


@dataclass(frozen=True)
class TrainConfig:
    """Local-training knobs sent with every train request."""

    local_steps: int
    local_epochs: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int

    def to_message_config(self) -> dict[str, Any]:
        """The kebab-case keys the ClientApp reads from the request's ConfigRecord."""
        return {
            "local-steps": self.local_steps,
            "local-epochs": self.local_epochs,
            "optimizer": self.optimizer,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight-decay": self.weight_decay,
            "batch-size": self.batch_size,
        }


@dataclass(frozen=True)
class OutputConfig:
    """Where results go."""

    output_dir: str
    run_name: str


@dataclass(frozen=True)
class RunConfig:
    """The whole run-config, typed."""

    strategy: str
    strategy_config: StrategyConfig | None  # the strategy's own keys; None for gossip methods and in a ClientApp
    data: DataConfig
    train: TrainConfig
    options: RunOptions  # what the built-in app passes to Strategy.start (the run resolves them once, in start)
    timeout: float  # seconds a job may take (Flower's timeout; run-config timeout)
    output: OutputConfig
    gossip: GossipConfig | None = None  # set for decentralized methods (pushcen and the gossip baselines)
    drift: DriftConfig = field(default_factory=DriftConfig)  # variant data (off by default)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (for ``config.json``)."""
        return asdict(self)


def _parse_delays(cfg: Mapping[str, Any]) -> DelayModel | RuntimeCategories | IntertwinedDelays:
    preset = str(cfg["delay-model"])
    valid = tuple(DELAY_PRESETS) + ("intertwined", "custom")
    _choice("delay-model", preset, valid)
    if preset == "intertwined":
        try:
            return IntertwinedDelays(
                affected_class=_int(cfg, "intertwined.class"), delayed_clients=_int(cfg, "intertwined.clients"),
                staleness=_int(cfg, "intertwined.staleness"), on_time=_float(cfg, "intertwined.on-time"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if preset != "custom":
        gamma = _float(cfg, "delay.gamma")
        if not 0.0 <= gamma <= 1.0:
            raise ConfigError(f"delay.gamma={gamma} must be in [0, 1]")
        return with_gamma(DELAY_PRESETS[preset], gamma)
    parts = {}
    for component in COMPONENTS:
        prefix = f"delay.{component}"
        try:
            parts[component] = ComponentDelay(
                distribution=str(cfg[f"{prefix}.distribution"]),
                tiers=parse_tiers(str(cfg[f"{prefix}.tiers"])),
                spread=float(cfg[f"{prefix}.spread"]),
            )
        except ValueError as exc:
            raise ConfigError(f"{prefix}: {exc}") from exc
    return DelayModel(**parts)


def parse_run_config(cfg: Mapping[str, Any], strategy_settings: bool = True) -> RunConfig:
    """Validate Flower's flat ``context.run_config`` into a :class:`RunConfig`.

    ``strategy_settings=False`` (the ClientApp) skips the server strategy's own keys, so a
    client process never imports the server-side methods; ``strategy_config`` is then ``None``.

    Raises
    ------
    ConfigError
        For a missing key or an invalid value, naming the valid choices.
    """
    try:
        return _parse(current_keys(cfg), strategy_settings)
    except KeyError as exc:
        raise ConfigError(f"run-config lacks key {exc.args[0]!r}; every knob needs a default in pyproject.toml") from exc


def _parse(cfg: Mapping[str, Any], strategy_settings: bool = True) -> RunConfig:
    strategy = _choice("strategy", str(cfg["strategy"]), STRATEGIES)
    data = DataConfig(
        dataset=_choice("dataset", str(cfg["dataset"]), DATASETS),
        data_dir=str(cfg["data-dir"]),
        partitioning=_choice("partitioning", str(cfg["partitioning"]), PARTITIONINGS),
        dirichlet_alpha=_positive("dirichlet-alpha", _float(cfg, "dirichlet-alpha")),
        shards_per_client=int(_positive("shards-per-client", _int(cfg, "shards-per-client"))),
        test_fraction=_float(cfg, "test-fraction"),
        model=_choice("model", str(cfg["model"]), MODELS),
        batchnorm=bool(cfg["model.batchnorm"]),
        # a stored run config from before these keys existed: the defaults reproduce its runs
        track_statistics=bool(cfg.get("model.track-statistics", DataConfig.track_statistics)),
        server_holdout=_float(cfg, "server-holdout"),
        samples_per_client=_at_least_one("samples-per-client",
                                         _int(cfg, "samples-per-client", DataConfig.samples_per_client)),
        max_samples_per_client=int(_positive("max-samples-per-client", _int(
            cfg, "max-samples-per-client", DataConfig.max_samples_per_client), allow_zero=True)),
        eval_batch_size=int(_positive("eval-batch-size", _int(cfg, "eval-batch-size"))),
    )
    if not 0.0 <= data.server_holdout < 1.0:
        raise ConfigError(f"server-holdout={data.server_holdout} must be in [0, 1)")
    if not 0.0 < data.test_fraction < 1.0:
        raise ConfigError(f"test-fraction={data.test_fraction} must be in (0, 1)")
    if data.track_statistics and (data.model != "cnn" or data.batchnorm):
        raise ConfigError("model.track-statistics=true needs model='cnn' with model.batchnorm=false (statistics "
                          f"trackers stand where BatchNorm would); got model={data.model!r}, "
                          f"model.batchnorm={str(data.batchnorm).lower()}")
    train = TrainConfig(
        local_steps=int(_positive("local-steps", _int(cfg, "local-steps"), allow_zero=True)),
        local_epochs=int(_positive("local-epochs", _int(cfg, "local-epochs"), allow_zero=True)),
        optimizer=_choice("optimizer", str(cfg["optimizer"]), OPTIMIZERS),
        lr=_positive("lr", _float(cfg, "lr")),
        momentum=_positive("momentum", _float(cfg, "momentum"), allow_zero=True),
        weight_decay=_positive("weight-decay", _float(cfg, "weight-decay"), allow_zero=True),
        batch_size=int(_positive("batch-size", _int(cfg, "batch-size"))),
    )
    try:
        check_drill(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if train.local_steps == 0 and train.local_epochs == 0:
        raise ConfigError("set local-steps > 0 or local-epochs > 0 (both are 0)")
    options = RunOptions.from_run_config(cfg, delay_model=_parse_delays(cfg))
    timeout = _positive("timeout", _float(cfg, "timeout"))
    options.check_run(0, timeout, has_rounds=False)  # it stops by max-arrivals or max-time
    options.check_strategy(strategy_class(strategy) if strategy in STRATEGY_CLASSES else None, strategy)
    output = OutputConfig(output_dir=str(cfg["output-dir"]), run_name=str(cfg["run-name"]))
    gossip = _gossip(cfg, strategy, options) if strategy in GOSSIP_METHODS else None
    drift = _drift(cfg, data, gossip)
    strategy_config = None
    if strategy_settings and strategy in STRATEGY_CLASSES:
        strategy_config = strategy_class(strategy).config_class.from_run_config(cfg)
    try:  # last, once every value is valid: an on-disk dataset's files must be there before anything starts
        check_files(data.dataset, data.data_dir)
    except DatasetNotFoundError as exc:
        raise ConfigError(str(exc)) from exc
    return RunConfig(strategy, strategy_config, data, train, options, timeout, output, gossip, drift)


def same_value(a: Any, b: Any) -> bool:
    """Whether two run-config values are the same setting (``20`` and ``20.0`` are)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b


def foreign_settings(cfg: Mapping[str, Any], strategy: str) -> dict[str, list[str]]:
    """The knobs of methods other than ``strategy`` (server strategies and gossip methods) that ``cfg`` sets away
    from their defaults.

    Returns ``{run-config key: [strategies it belongs to]}``. Keys the strategy in use reads itself
    (``fedavg.server-lr``, shared by the FedAvg-based baselines) are its own, not foreign.
    """
    own: set[str] = set()
    if strategy in STRATEGY_CLASSES:
        config_class = strategy_class(strategy).config_class
        own = {config_class.key_of(spec.name) for spec in fields(config_class)}
    foreign: dict[str, list[str]] = {}
    for name in STRATEGY_CLASSES:
        config_class = strategy_class(name).config_class
        for spec in fields(config_class):
            key = config_class.key_of(spec.name)
            if key not in own and key in cfg and not same_value(cfg[key], spec.default):
                foreign.setdefault(key, []).append(name)
    for spec in fields(GossipConfig):  # gossip.* belongs to every gossip method, pushcen.* to pushcen alone
        key = GossipConfig.key_of(spec.name)
        table = key.split(".")[0]
        owners = [table] if table in GOSSIP_METHODS else list(GOSSIP_METHODS)
        if strategy not in owners and key in cfg and not same_value(cfg[key], spec.default):
            foreign.setdefault(key, []).extend(owners)
    return foreign


def other_strategy_message(key: str, value: Any, owners: list[str], strategy: str) -> str:
    """One line refusing ``key=value``, a knob of strategies ``owners`` (:func:`foreign_settings`), in a run of
    ``strategy``: the run would ignore it (``strategy='fedasync' fedbuff.buffer-size=3`` runs FedAsync as if it
    were not there), so the experiment would not be the one asked for. ``asyncfl run`` refuses it wherever it was
    set (:func:`asyncfl.cli.refuse_ignored_settings`)."""
    users = " or ".join(f"'{name}'" for name in dict.fromkeys(owners))
    return (f"{key}={value!r} is a setting of strategy {users}, but this run's strategy is '{strategy}', which "
            f"ignores it: drop the key or set strategy='{owners[0]}'")


def _drift(cfg: Mapping[str, Any], data: DataConfig, gossip: GossipConfig | None) -> DriftConfig:
    try:
        drift = DriftConfig(source=str(cfg.get("drift.source", "none")), rate=float(cfg.get("drift.rate", 0.0)))
        if drift.active:
            check_source(drift.source, data.dataset)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if drift.active and gossip is not None:
        raise ConfigError("drift.source applies to the server strategies (the gossip peers keep their data fixed)")
    return drift


def _gossip(cfg: Mapping[str, Any], strategy: str, options: RunOptions) -> GossipConfig:
    if options.clock != "virtual" or options.max_time <= 0:
        raise ConfigError(f"{strategy} runs on the gossip relay's virtual clock: set clock = 'virtual' and "
                          "max-time > 0 (the horizon)")
    if cfg.get("resume-from"):  # (checkpoint-every has a default in the built-in app: a gossip run writes none)
        raise ConfigError(f"resume-from={cfg['resume-from']!r}: the gossip relay ({strategy}) keeps no checkpoints "
                          "and cannot resume; drop the key")
    gossip = GossipConfig.from_run_config(cfg)
    if strategy != "divshare" and gossip.divshare_copies != GossipConfig.divshare_copies:
        raise ConfigError(other_strategy_message("divshare.copies", cfg["divshare.copies"], ["divshare"], strategy))
    return gossip
