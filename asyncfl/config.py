"""Run configuration: parse Flower's flat run-config once into frozen dataclasses.

Every key has a default in ``pyproject.toml`` (Flower rejects unknown keys).
Validation happens here, before any work starts, with messages that name the
valid choices.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from asyncfl.data.datasets import DATASETS
from asyncfl.data.drift import DriftConfig, check_source
from asyncfl.data.partition import PARTITIONINGS
from asyncfl.models.zoo import MODELS
from asyncfl.simulation.categories import RuntimeCategories
from asyncfl.decentralized.settings import GOSSIP_METHODS, GossipConfig
from asyncfl.simulation.intertwined import IntertwinedDelays
from asyncfl.simulation.delays import COMPONENTS, ComponentDelay, DelayModel, parse_tiers
from asyncfl.simulation.presets import DELAY_PRESETS, with_gamma

STRATEGIES = ("fedavg", "fedasync", "fedbuff", "afl-dw", "ca2fl", "fadas", "fedfa", "fedadt", "fedecho", "fedrevive",
              "dd-fedrevive", "stale-weighted", "dc-asgd", "w-pred", "asyn-tiers", "gi-compensation") + GOSSIP_METHODS
REVIVE_PROPORTIONS = ("proxy", "true")
#: FedEcho's unlabeled distillation sets: a cross-dataset set or the server's hold-out rows.
DISTILL_SETS = ("digits", "cifar10", "cifar100", "holdout")
_CHANNELS = {"mnist5k": 1, "digits": 1, "mnist": 1, "fashion-mnist": 1, "cifar10": 3, "cifar100": 3, "svhn": 3}
CLOCKS = ("virtual", "wall")
OPTIMIZERS = ("sgd", "adam")


class ConfigError(ValueError):
    """A run-config value is invalid; the message says which and what is valid."""


def _choice(key: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(valid)}")
    return value


def _positive(key: str, value: float, allow_zero: bool = False) -> float:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")
    return value


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
class EngineConfig:
    """How the engine schedules jobs, stops and evaluates."""

    clock: str
    concurrency: int
    max_arrivals: int
    max_virtual_time: float
    eval_every: float
    target_accuracy: tuple[float, ...]
    job_timeout: float
    wait_for_nodes: float
    seed: int
    delay_preset: str
    delays: DelayModel | RuntimeCategories | IntertwinedDelays
    eval_batch_size: int
    progress: bool
    emulate_delay_scale: float = 0.0
    overlap: bool = False
    server_time_scale: float = 0.0
    round_deadline: float = 0.0
    pipeline_late_clients: bool = False
    max_versions: int = 0  # stop once the server model reaches this version (0 = no cap); Flower's num_rounds
    eval_every_versions: int = 0  # also evaluate every this many server versions (0 = by clock only)

    def __post_init__(self) -> None:
        """Settings that exclude or need each other (checked for the run-config and for ``start()`` alike)."""
        if self.pipeline_late_clients and self.round_deadline <= 0:
            raise ConfigError("pipeline-late-clients (pipeline_late_clients) lets clients whose job missed the round "
                              "deadline train again; it needs round-deadline > 0 (semi-asynchronous rounds)")
        if self.round_deadline > 0 and self.clock != "virtual":
            raise ConfigError("round-deadline (round_deadline: semi-asynchronous rounds) needs clock = 'virtual'; "
                              "set it to 0 for wall-clock runs")
        if isinstance(self.delays, IntertwinedDelays) and self.clock != "virtual":
            raise ConfigError("delay-model 'intertwined' is a simulation scenario; it needs clock = 'virtual'")
        if self.overlap and self.server_time_scale > 0:
            raise ConfigError("overlap-server-compute (overlap_server_compute) hides server time from clients; set "
                              "server-time-scale (server_time_scale) = 0 with it, or turn overlap off to charge server "
                              "time to the virtual clock")
        if self.max_arrivals == 0 and self.max_virtual_time == 0 and self.max_versions == 0:
            raise ConfigError("set max-arrivals > 0 or max-virtual-time > 0, or the run never stops")
        if self.eval_every <= 0 and self.eval_every_versions <= 0:
            raise ConfigError("set eval-every > 0 (clock units) or evaluate every so many versions")


@dataclass(frozen=True)
class OutputConfig:
    """Where results go."""

    output_dir: str
    run_name: str


@dataclass(frozen=True)
class RunConfig:
    """The whole run-config, typed."""

    strategy: str
    strategy_params: Mapping[str, Any]
    data: DataConfig
    train: TrainConfig
    engine: EngineConfig
    output: OutputConfig
    gossip: GossipConfig | None = None  # set for decentralized methods (pushcen and the gossip baselines)
    drift: DriftConfig = field(default_factory=DriftConfig)  # variant data (off by default)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (for ``config.json``)."""
        out = asdict(self)
        out["strategy_params"] = dict(self.strategy_params)
        return out


def _parse_targets(text: str) -> tuple[float, ...]:
    if not str(text).strip():
        return ()
    try:
        targets = tuple(float(t) for t in str(text).split(","))
    except ValueError as exc:
        raise ConfigError(f"target-accuracy={text!r}: write comma-separated fractions like '0.8,0.9'") from exc
    for t in targets:
        if not 0.0 < t <= 1.0:
            raise ConfigError(f"target-accuracy values must be in (0, 1], got {t}")
    return targets


def _parse_delays(cfg: Mapping[str, Any]) -> tuple[str, DelayModel | RuntimeCategories | IntertwinedDelays]:
    preset = str(cfg["delay-model"])
    valid = tuple(DELAY_PRESETS) + ("intertwined", "custom")
    _choice("delay-model", preset, valid)
    if preset == "intertwined":
        try:
            return preset, IntertwinedDelays(
                affected_class=int(cfg["intertwined.class"]), delayed_clients=int(cfg["intertwined.clients"]),
                staleness=int(cfg["intertwined.staleness"]), on_time=float(cfg["intertwined.on-time"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if preset != "custom":
        gamma = float(cfg["delay.gamma"])
        if not 0.0 <= gamma <= 1.0:
            raise ConfigError(f"delay.gamma={gamma} must be in [0, 1]")
        return preset, with_gamma(DELAY_PRESETS[preset], gamma)
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
    return preset, DelayModel(**parts)


def _strategy_params(cfg: Mapping[str, Any], strategy: str) -> dict[str, Any]:
    # server side only: a ClientApp parses with strategy_settings=False and never imports the strategies
    from asyncfl.strategies.fedbuff import STALENESS_WEIGHTINGS
    from asyncfl.strategies.staleness import BETA_SCHEDULES, FEDASYNC_STALENESS_FUNCTIONS

    if strategy == "fedavg":
        return {"server_lr": float(cfg["fedavg.server-lr"])}
    if strategy == "fedasync":
        alpha = float(cfg["fedasync.alpha"])
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"fedasync.alpha={alpha} must be in (0, 1]")
        return {
            "alpha": alpha,
            "staleness": _choice("fedasync.staleness", str(cfg["fedasync.staleness"]), FEDASYNC_STALENESS_FUNCTIONS),
            "a": _positive("fedasync.a", float(cfg["fedasync.a"]), allow_zero=True),
            "b": _positive("fedasync.b", float(cfg["fedasync.b"]), allow_zero=True),
        }
    if strategy == "fedbuff":
        return {
            "buffer_size": _at_least_one("fedbuff.buffer-size", int(cfg["fedbuff.buffer-size"])),
            "server_lr": _positive("fedbuff.server-lr", float(cfg["fedbuff.server-lr"])),
            "staleness_weighting": _choice(
                "fedbuff.staleness-weighting", str(cfg["fedbuff.staleness-weighting"]), STALENESS_WEIGHTINGS
            ),
        }
    if strategy == "ca2fl":
        return {
            "buffer_size": _at_least_one("ca2fl.buffer-size", int(cfg["ca2fl.buffer-size"])),
            "server_lr": _positive("ca2fl.server-lr", float(cfg["ca2fl.server-lr"])),
        }
    if strategy == "fadas":
        beta1, beta2 = float(cfg["fadas.beta1"]), float(cfg["fadas.beta2"])
        for key, value in (("fadas.beta1", beta1), ("fadas.beta2", beta2)):
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{key}={value} must be in [0, 1)")
        return {
            "buffer_size": _at_least_one("fadas.buffer-size", int(cfg["fadas.buffer-size"])),
            "server_lr": _positive("fadas.server-lr", float(cfg["fadas.server-lr"])),
            "beta1": beta1,
            "beta2": beta2,
            "eps": _positive("fadas.eps", float(cfg["fadas.eps"])),
            "tau_c": int(_positive("fadas.tau-c", int(cfg["fadas.tau-c"]), allow_zero=True)),
        }
    if strategy == "fedadt":
        fraction = float(cfg["fedadt.server-fraction"])
        if not 0.0 < fraction < 1.0:
            raise ConfigError(f"fedadt.server-fraction={fraction} must be in (0, 1)")
        alpha_min, alpha_max = float(cfg["fedadt.alpha-min"]), float(cfg["fedadt.alpha-max"])
        if not 0.0 <= alpha_min <= alpha_max <= 1.0:
            raise ConfigError(f"need 0 <= fedadt.alpha-min ({alpha_min}) <= fedadt.alpha-max ({alpha_max}) <= 1")
        return {
            "server_fraction": fraction,
            "temperature": _positive("fedadt.temperature", float(cfg["fedadt.temperature"])),
            "alpha_min": alpha_min,
            "alpha_max": alpha_max,
            "t_g": _at_least_one("fedadt.t-g", int(cfg["fedadt.t-g"])),
            "kd_lr": _positive("fedadt.kd-lr", float(cfg["fedadt.kd-lr"])),
            "kd_batch_size": _at_least_one("fedadt.kd-batch-size", int(cfg["fedadt.kd-batch-size"])),
        }
    if strategy == "fedecho":
        return _fedecho_params(cfg)
    if strategy in ("fedrevive", "dd-fedrevive"):
        return _fedrevive_params(cfg, strategy)
    if strategy == "fedfa":
        return {"queue_size": _at_least_one("fedfa.queue-size", int(cfg["fedfa.queue-size"]))}
    if strategy in GOSSIP_METHODS:
        return {}
    if strategy in ("stale-weighted", "dc-asgd", "w-pred", "asyn-tiers", "gi-compensation"):
        return _semi_async_params(cfg, strategy)
    if strategy != "afl-dw":  # a name added to STRATEGIES without its settings here must not pass as AFL-DW
        raise ConfigError(f"strategy={strategy!r} has no run-config settings; valid: {', '.join(STRATEGIES)}")
    beta_constant = float(cfg["afl-dw.beta-constant"])
    if not 0.0 <= beta_constant <= 1.0:
        raise ConfigError(f"afl-dw.beta-constant={beta_constant} must be in [0, 1]")
    return {
        "server_lr": _positive("afl-dw.server-lr", float(cfg["afl-dw.server-lr"])),
        "beta": _choice("afl-dw.beta", str(cfg["afl-dw.beta"]), BETA_SCHEDULES),
        "tau_max": _positive("afl-dw.tau-max", float(cfg["afl-dw.tau-max"])),
        "beta_constant": beta_constant,
    }


def _semi_async_params(cfg: Mapping[str, Any], strategy: str) -> dict[str, Any]:
    """FedAvg-based baselines of the gradient-inversion paper; they share ``fedavg.server-lr``."""
    from asyncfl.strategies.gi.inversion import InversionConfig
    from asyncfl.strategies.gi.switching import SWITCH_RULES

    params: dict[str, Any] = {"server_lr": _positive("fedavg.server-lr", float(cfg["fedavg.server-lr"]))}
    if strategy == "stale-weighted":
        params["a"] = _positive("stale-weighted.a", float(cfg["stale-weighted.a"]), allow_zero=True)
        params["b"] = float(cfg["stale-weighted.b"])
    elif strategy == "dc-asgd":
        params["lam"] = _positive("dc-asgd.lambda", float(cfg["dc-asgd.lambda"]), allow_zero=True)
    elif strategy == "w-pred":
        params["lam"] = _positive("w-pred.lambda", float(cfg["w-pred.lambda"]), allow_zero=True)
        params["beta"] = float(cfg["w-pred.beta"])
        if not 0.0 <= params["beta"] < 1.0:
            raise ConfigError(f"w-pred.beta={params['beta']} must be in [0, 1)")
    elif strategy == "asyn-tiers":
        params["boundary"] = int(_positive("asyn-tiers.boundary", int(cfg["asyn-tiers.boundary"]), allow_zero=True))
    else:
        try:
            params["inversion"] = InversionConfig(
                rec_fraction=float(cfg["gi.rec-fraction"]), max_rec=int(cfg["gi.max-rec"]),
                iterations=int(cfg["gi.iterations"]), warm_iterations=int(cfg["gi.warm-iterations"]),
                lr=float(cfg["gi.lr"]), keep_fraction=float(cfg["gi.keep-fraction"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        params["switch_window"] = _positive("gi.switch-window", float(cfg["gi.switch-window"]), allow_zero=True)
        params["switch_rule"] = _choice("gi.switch-rule", str(cfg["gi.switch-rule"]), SWITCH_RULES)
        params["switch_comparisons"] = _at_least_one("gi.switch-comparisons", int(cfg["gi.switch-comparisons"]))
        params["uniqueness"] = bool(cfg["gi.uniqueness"])
    return params


def _fedecho_params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    alpha_min, alpha_max = float(cfg["fedecho.alpha-min"]), float(cfg["fedecho.alpha-max"])
    if not 0.0 <= alpha_min <= alpha_max <= 1.0:
        raise ConfigError(f"need 0 <= fedecho.alpha-min ({alpha_min}) <= fedecho.alpha-max ({alpha_max}) <= 1 "
                          "(equal values give a fixed alpha)")
    distill_set = _choice("fedecho.distill-set", str(cfg["fedecho.distill-set"]), DISTILL_SETS)
    dataset = str(cfg["dataset"])
    if distill_set == "holdout" and not float(cfg["server-holdout"]) > 0.0:
        raise ConfigError("fedecho.distill-set='holdout' needs server-holdout > 0 (the fraction of the training "
                          "split the server keeps and the clients never see)")
    if distill_set == "digits" and _CHANNELS[dataset] != 1:
        raise ConfigError(f"fedecho.distill-set='digits' is grayscale; dataset {dataset!r} has "
                          f"{_CHANNELS[dataset]} channels: use cifar10/cifar100 or holdout")
    if distill_set in ("cifar10", "cifar100") and (_CHANNELS[dataset] != 3 or distill_set == dataset):
        raise ConfigError(f"fedecho.distill-set={distill_set!r} needs another 3-channel 32x32 dataset "
                          f"(cifar10, cifar100, svhn), not {dataset!r}")
    if distill_set == "digits" and dataset == "digits":
        raise ConfigError("fedecho.distill-set='digits' with dataset 'digits' would distil on the clients' own "
                          "data: use holdout")
    return {
        "buffer_size": _at_least_one("fedecho.buffer-size", int(cfg["fedecho.buffer-size"])),
        "server_lr": _positive("fedecho.server-lr", float(cfg["fedecho.server-lr"])),
        "distill_set": distill_set,
        "distill_size": _at_least_one("fedecho.distill-size", int(cfg["fedecho.distill-size"])),
        "distill_steps": int(_positive("fedecho.distill-steps", int(cfg["fedecho.distill-steps"]), allow_zero=True)),
        "distill_batch_size": _at_least_one("fedecho.distill-batch-size", int(cfg["fedecho.distill-batch-size"])),
        "distill_lr": _positive("fedecho.distill-lr", float(cfg["fedecho.distill-lr"])),
        "alpha_min": alpha_min,
        "alpha_max": alpha_max,
        "clip": _positive("fedecho.clip", float(cfg["fedecho.clip"])),
    }


def _fedrevive_params(cfg: Mapping[str, Any], strategy: str) -> dict[str, Any]:
    from asyncfl.strategies.staleness import BETA_SCHEDULES

    p = "fedrevive."
    beta_constant = float(cfg[p + "beta-constant"])
    meta_lambda = float(cfg[p + "meta-lambda"])
    if not 0.0 <= beta_constant <= 1.0:
        raise ConfigError(f"fedrevive.beta-constant={beta_constant} must be in [0, 1]")
    if not 0.0 < meta_lambda <= 1.0:
        raise ConfigError(f"fedrevive.meta-lambda={meta_lambda} must be in (0, 1]")
    if strategy == "dd-fedrevive" and not float(cfg["server-holdout"]) > 0.0:
        raise ConfigError("strategy 'dd-fedrevive' distils on real labeled server data: set server-holdout > 0")
    positive = {key: _positive(p + key, float(cfg[p + key])) for key in
                ("server-lr", "tau-max", "t-probe", "kd-lr", "temperature", "generator-lr", "latent-lr")}
    counts = {key: _at_least_one(p + key, int(cfg[p + key])) for key in
              ("buffer-size", "t-est", "t-gen", "kd-steps", "kd-batch-size", "pool-capacity", "latent-dim",
               "synth-batch-size", "synth-steps")}
    starts = {key: int(_positive(p + key, int(cfg[p + key]), allow_zero=True)) for key in ("synth-start", "kd-start")}
    alphas = {key: _positive(p + key, float(cfg[p + key]), allow_zero=True) for key in
              ("alpha-target", "alpha-feature", "alpha-adv")}
    return {
        "server_lr": positive["server-lr"], "beta": _choice(p + "beta", str(cfg[p + "beta"]), BETA_SCHEDULES),
        "tau_max": positive["tau-max"], "beta_constant": beta_constant, "buffer_size": counts["buffer-size"],
        "t_est": counts["t-est"], "t_probe": positive["t-probe"], "t_gen": counts["t-gen"],
        "synth_start": starts["synth-start"], "kd_start": starts["kd-start"], "kd_steps": counts["kd-steps"],
        "kd_batch_size": counts["kd-batch-size"], "kd_lr": positive["kd-lr"], "temperature": positive["temperature"],
        "pool_capacity": counts["pool-capacity"], "latent_dim": counts["latent-dim"],
        "synth_batch_size": counts["synth-batch-size"], "synth_steps": counts["synth-steps"],
        "generator_lr": positive["generator-lr"], "latent_lr": positive["latent-lr"],
        "alpha_target": alphas["alpha-target"], "alpha_feature": alphas["alpha-feature"],
        "alpha_adv": alphas["alpha-adv"], "meta_lambda": meta_lambda,
        "proportions": _choice(p + "proportions", str(cfg[p + "proportions"]), REVIVE_PROPORTIONS),
    }


def parse_run_config(cfg: Mapping[str, Any], strategy_settings: bool = True) -> RunConfig:
    """Validate Flower's flat ``context.run_config`` into a :class:`RunConfig`.

    ``strategy_settings=False`` (the ClientApp) skips the server strategy's own keys, so a
    client process never imports the server-side methods; ``strategy_params`` is then empty.

    Raises
    ------
    ConfigError
        For a missing key or an invalid value, naming the valid choices.
    """
    try:
        return _parse(cfg, strategy_settings)
    except KeyError as exc:
        raise ConfigError(f"run-config lacks key {exc.args[0]!r}; every knob needs a default in pyproject.toml") from exc


def _parse(cfg: Mapping[str, Any], strategy_settings: bool = True) -> RunConfig:
    strategy = _choice("strategy", str(cfg["strategy"]), STRATEGIES)
    data = DataConfig(
        dataset=_choice("dataset", str(cfg["dataset"]), DATASETS),
        data_dir=str(cfg["data-dir"]),
        partitioning=_choice("partitioning", str(cfg["partitioning"]), PARTITIONINGS),
        dirichlet_alpha=_positive("dirichlet-alpha", float(cfg["dirichlet-alpha"])),
        shards_per_client=int(_positive("shards-per-client", int(cfg["shards-per-client"]))),
        test_fraction=float(cfg["test-fraction"]),
        model=_choice("model", str(cfg["model"]), MODELS),
        batchnorm=bool(cfg["model.batchnorm"]),
        server_holdout=float(cfg["server-holdout"]),
    )
    if not 0.0 <= data.server_holdout < 1.0:
        raise ConfigError(f"server-holdout={data.server_holdout} must be in [0, 1)")
    if not 0.0 < data.test_fraction < 1.0:
        raise ConfigError(f"test-fraction={data.test_fraction} must be in (0, 1)")
    train = TrainConfig(
        local_steps=int(_positive("local-steps", int(cfg["local-steps"]), allow_zero=True)),
        local_epochs=int(_positive("local-epochs", int(cfg["local-epochs"]), allow_zero=True)),
        optimizer=_choice("optimizer", str(cfg["optimizer"]), OPTIMIZERS),
        lr=_positive("lr", float(cfg["lr"])),
        momentum=_positive("momentum", float(cfg["momentum"]), allow_zero=True),
        weight_decay=_positive("weight-decay", float(cfg["weight-decay"]), allow_zero=True),
        batch_size=int(_positive("batch-size", int(cfg["batch-size"]))),
    )
    if train.local_steps == 0 and train.local_epochs == 0:
        raise ConfigError("set local-steps > 0 or local-epochs > 0 (both are 0)")
    if strategy == "gi-compensation" and train.optimizer != "sgd":
        raise ConfigError("gi-compensation replays the clients' SGD program (the paper: inversion fails under Adam); "
                          f"set optimizer = 'sgd' (got {train.optimizer!r})")
    delay_preset, delays = _parse_delays(cfg)
    engine = EngineConfig(
        clock=_choice("clock", str(cfg["clock"]), CLOCKS),
        concurrency=int(_positive("concurrency", int(cfg["concurrency"]))),
        max_arrivals=int(_positive("max-arrivals", int(cfg["max-arrivals"]), allow_zero=True)),
        max_virtual_time=_positive("max-virtual-time", float(cfg["max-virtual-time"]), allow_zero=True),
        eval_every=_positive("eval-every", float(cfg["eval-every"])),
        target_accuracy=_parse_targets(cfg["target-accuracy"]),
        job_timeout=_positive("job-timeout", float(cfg["job-timeout"])),
        wait_for_nodes=_positive("wait-for-nodes", float(cfg["wait-for-nodes"]), allow_zero=True),
        seed=int(cfg["seed"]),
        delay_preset=delay_preset,
        delays=delays,
        eval_batch_size=int(_positive("eval-batch-size", int(cfg["eval-batch-size"]))),
        progress=bool(cfg["progress"]),
        emulate_delay_scale=_positive("emulate-delay-scale", float(cfg["emulate-delay-scale"]), allow_zero=True),
        overlap=bool(cfg["overlap-server-compute"]),
        server_time_scale=_positive("server-time-scale", float(cfg["server-time-scale"]), allow_zero=True),
        round_deadline=_positive("round-deadline", float(cfg["round-deadline"]), allow_zero=True),
        pipeline_late_clients=bool(cfg["pipeline-late-clients"]),
    )
    output = OutputConfig(output_dir=str(cfg["output-dir"]), run_name=str(cfg["run-name"]))
    gossip = _gossip(cfg, strategy, engine) if strategy in GOSSIP_METHODS else None
    drift = _drift(cfg, data, gossip)
    params = _strategy_params(cfg, strategy) if strategy_settings else {}
    return RunConfig(strategy, params, data, train, engine, output, gossip, drift)


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


def _gossip(cfg: Mapping[str, Any], strategy: str, engine: EngineConfig) -> GossipConfig:
    if engine.clock != "virtual" or engine.max_virtual_time <= 0:
        raise ConfigError(f"{strategy} runs on the gossip relay's virtual clock: set clock = 'virtual' and "
                          "max-virtual-time > 0 (the horizon)")
    try:
        return GossipConfig(
            method=strategy, out_degree=int(cfg["gossip.out-degree"]), buffer_capacity=int(cfg["gossip.buffer-capacity"]),
            dedup=bool(cfg["gossip.dedup"]), delayed_fraction=float(cfg["gossip.delayed-fraction"]),
            eval_points=int(cfg["gossip.eval-points"]), horizon=engine.max_virtual_time,
            link_delay=float(cfg["gossip.link-delay"]), local_test_fraction=float(cfg["gossip.local-test-fraction"]),
            k=int(cfg["pushcen.k"]), lam=float(cfg["pushcen.lambda"]), topology=str(cfg["gossip.topology"]),
            cache_size=int(cfg["swift.cache-size"]))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
