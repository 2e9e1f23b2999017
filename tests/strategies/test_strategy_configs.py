"""Each strategy's config dataclass: one place for its knobs, their checks and their run-config keys."""

import inspect
from dataclasses import fields
from pathlib import Path

import pytest

from asyncfl.config import parse_run_config
from asyncfl.strategies import FedBuff
from asyncfl.strategies.fedasync import FedAsyncConfig
from asyncfl.strategies.fedbuff import FedBuffConfig
from asyncfl.strategies.fedecho import FedEchoConfig
from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class
from asyncfl.strategies.settings import ConfigError
from tests.test_config import defaults

ROOT = Path(__file__).resolve().parents[2]
# run-config tables that belong to the built-in app's shared keys or to the gossip relay, not to a strategy class
SHARED_PREFIXES = ("delay.", "intertwined.", "drift.", "gossip.", "swift.", "pushcen.", "divshare.", "model.")


def constructor_defaults(cls) -> dict:
    """Keyword defaults of ``cls`` and of the parents its ``**options`` are passed on to."""
    out = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass):
            out.update({name: p.default for name, p in inspect.signature(klass.__init__).parameters.items()
                        if p.default is not inspect.Parameter.empty})
    return out


@pytest.mark.parametrize("name", list(STRATEGY_CLASSES))
def test_constructor_keywords_are_the_config_fields_with_the_same_defaults(name):
    cls = strategy_class(name)
    keywords = cls.config_class().keywords()
    assert keywords, name
    offered = constructor_defaults(cls)
    for field_name, default in keywords.items():
        assert field_name in offered, f"{cls.__name__} lacks keyword {field_name}"
        assert offered[field_name] == default, f"{cls.__name__}({field_name}=...) default differs from its config"


def test_a_constructor_passes_its_knobs_on_by_name_and_one_that_lacks_a_knob_is_named():
    strategy = FedBuff(buffer_size=3, pace="stable", fraction_train=0.5)
    assert (strategy.config.buffer_size, strategy.config.pace, strategy.config.server_lr) == (3, "stable", 0.0)

    class Forgetful(FedBuff):
        def __init__(self, buffer_size: int = 0) -> None:
            FedBuffConfig.from_arguments(locals())

    with pytest.raises(TypeError, match="FedBuffConfig: the strategy's constructor has no keyword server_lr, "
                                        "staleness_weighting, pace, aggregation, compensation"):
        Forgetful()


def test_every_strategy_knob_has_a_run_config_default_and_every_strategy_key_is_read():
    cfg = defaults()
    read = set()
    for name in STRATEGY_CLASSES:
        config_class = strategy_class(name).config_class
        for spec in fields(config_class):
            key = config_class.key_of(spec.name)
            assert key in cfg, f"{key} ({config_class.__name__}.{spec.name}) has no default in pyproject.toml"
            read.add(key)
    unread = [k for k in cfg if "." in k and not k.startswith(SHARED_PREFIXES) and k not in read]
    assert unread == []


def test_every_strategy_knobs_pyproject_value_is_its_declared_default():
    # one default per knob: the config dataclass declares it; the app's pyproject (which Flower reads) repeats it
    from asyncfl.config import same_value

    cfg = defaults()
    for name in STRATEGY_CLASSES:
        config_class = strategy_class(name).config_class
        for spec in fields(config_class):
            declared = "" if spec.default is None else spec.default
            key = config_class.key_of(spec.name)
            assert same_value(cfg[key], declared), f"pyproject {key} = {cfg[key]!r}, declared {spec.default!r}"


def test_values_are_typed_and_checked_with_the_keyword_the_key_and_what_is_valid():
    assert FedBuffConfig(buffer_size=5.0).buffer_size == 5  # an integral float from TOML is an int
    assert isinstance(FedAsyncConfig(staleness_decay=1).staleness_decay, float)
    with pytest.raises(ConfigError, match=r"FedBuff: buffer_size=2.5 must be int \(run-config fedbuff.buffer-size\)"):
        FedBuffConfig(buffer_size=2.5)
    with pytest.raises(ConfigError, match="buffer_size=True must be int"):
        FedBuffConfig(buffer_size=True)
    with pytest.raises(ConfigError, match=r"buffer_size=-1 must be >= 0 \(run-config fedbuff.buffer-size\)"):
        FedBuff(buffer_size=-1)
    with pytest.raises(ConfigError, match="alpha=0.0 must be > 0 and <= 1"):
        FedAsyncConfig(alpha=0.0)
    with pytest.raises(ConfigError, match="staleness='exp' is not valid; choose one of: constant, polynomial, hinge"):
        FedAsyncConfig(staleness="exp")
    with pytest.raises(ConfigError, match="must be a finite number"):
        FedBuffConfig(server_lr=float("nan"))


def test_from_run_config_reads_the_prefixed_keys_and_defaults_what_is_missing():
    config = FedBuffConfig.from_run_config({"fedbuff.buffer-size": 3, "fedbuff.server-lr": 0.5, "strategy": "x"})
    assert config == FedBuffConfig(buffer_size=3, server_lr=0.5, staleness_weighting="none")
    assert config.to_run_config() == {"fedbuff.buffer-size": 3, "fedbuff.server-lr": 0.5,
                                      "fedbuff.staleness-weighting": "none", "fedbuff.pace": "measured",
                                      "fedbuff.aggregation": "mean", "fedbuff.compensation": "none"}


def test_built_in_data_choices_are_not_constructor_keywords():
    config = FedEchoConfig(distill_set="holdout", distill_size=10)
    assert "distill_set" not in config.keywords() and "distill_size" not in config.keywords()
    with pytest.raises(ConfigError, match="distill_set='holdout' 'holdout' needs server-holdout > 0"):
        config.check_run_config({"dataset": "mnist5k", "server-holdout": 0.0})


def test_the_shared_server_lr_key_of_the_fedavg_baselines():
    cfg = parse_run_config(defaults(strategy="dc-asgd", **{"fedavg.server-lr": 0.5,
                                                           "dc-asgd.compensation-strength": 2.0}))
    assert cfg.strategy_config.server_lr == 0.5 and cfg.strategy_config.compensation_strength == 2.0
    assert strategy_class("w-pred").config_class.key_of("compensation_strength") == "w-pred.compensation-strength"
