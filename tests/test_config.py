"""Run-config parsing: defaults from pyproject parse; bad values name the valid ones."""

from pathlib import Path

import pytest
from flwr.common.config import flatten_dict, get_project_config

from asyncfl.config import ConfigError, parse_run_config
from asyncfl.options import resolve_delays

ROOT = Path(__file__).resolve().parents[1]


def defaults(**overrides):
    cfg = flatten_dict(get_project_config(ROOT)["tool"]["flwr"]["app"]["config"])
    cfg.update(overrides)
    return cfg


def test_pyproject_defaults_parse():
    cfg = parse_run_config(defaults())
    assert cfg.strategy == "fedbuff"
    assert cfg.strategy_config.buffer_size == 0  # automatic: concurrency // 4 within [2, 10]
    assert resolve_delays(cfg.options.clock, cfg.options.delay_model)[0] == "fedrevive-default"
    assert cfg.options.target_accuracy == (0.8, 0.9)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("strategy", "fedprox", "afl-dw, asyn-tiers, ca2fl, dc-asgd"),
        ("dataset", "imagenet", "mnist5k, digits"),
        ("model", "vgg", "cnn, lenet5, resnet18, mlp"),
        ("delay-model", "slow", "fedrevive-default, fedrevive-shifted"),
        ("clock", "lunar", "virtual, wall"),
        ("partitioning", "zipf", "dirichlet, iid, shards"),
        ("fedbuff.buffer-size", -1, "buffer-size"),
        ("concurrency", 0, "concurrency"),
        ("target-accuracy", "high", "comma-separated"),
        ("optimizer", "lion", "sgd, adam"),
    ],
)
def test_bad_values_are_rejected_with_valid_choices(key, value, message):
    cfg = defaults(**{key: value})
    if key == "fedbuff.buffer-size":
        cfg["strategy"] = "fedbuff"
    with pytest.raises(ConfigError, match=message):
        parse_run_config(cfg)


def test_statistics_trackers_need_the_cnn_without_batchnorm():
    assert parse_run_config(defaults(**{"model.track-statistics": True})).data.track_statistics
    for bad in ({"model": "lenet5"}, {"model.batchnorm": True}):
        with pytest.raises(ConfigError, match="model.track-statistics=true needs model='cnn'"):
            parse_run_config(defaults(**{"model.track-statistics": True, **bad}))


def test_custom_delay_model_is_parsed():
    cfg = parse_run_config(defaults(**{"delay-model": "custom", "delay.train.distribution": "lognormal",
                                       "delay.train.tiers": "0.5:1,0.5:3", "delay.train.spread": 0.4}))
    assert cfg.options.delay_model.train.distribution == "lognormal"
    assert cfg.options.delay_model.train.tiers == ((0.5, 1.0), (0.5, 3.0))
    assert resolve_delays(cfg.options.clock, cfg.options.delay_model)[0] == "custom"
    regamma = parse_run_config(defaults(**{"delay-model": "fedecho-large", "delay.gamma": 0.2}))
    assert resolve_delays(regamma.options.clock, regamma.options.delay_model)[0] == "fedecho-large (gamma 0.2)"


def test_bad_custom_delay_names_the_component():
    with pytest.raises(ConfigError, match="delay.upload"):
        parse_run_config(defaults(**{"delay-model": "custom", "delay.upload.distribution": "weibull"}))


def test_run_must_be_able_to_stop():
    with pytest.raises(ConfigError, match="never stops"):
        parse_run_config(defaults(**{"max-arrivals": 0, "max-time": 0.0}))


def test_missing_key_is_reported():
    cfg = defaults()
    del cfg["lr"]
    with pytest.raises(ConfigError, match="'lr'"):
        parse_run_config(cfg)


def test_asyncfl_run_rejects_bad_config_before_starting_anything(capsys):
    from asyncfl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--app", str(ROOT), "-c", "strategy='fedprox'"])
    assert exit_info.value.code == 2
    assert "afl-dw, asyn-tiers, ca2fl, dc-asgd" in capsys.readouterr().err


def test_asyncfl_run_rejects_unknown_keys(capsys):
    from asyncfl.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--app", str(ROOT), "-c", "buffer-size=3"])
    assert "buffer-size" in capsys.readouterr().err


def test_scenario_presets_in_conf_are_valid():
    from asyncfl.cli import check_run_config

    for preset in sorted((ROOT / "conf").glob("*.toml")):
        check_run_config(ROOT, [str(preset)])


def test_overlap_and_server_time_on_the_clock_exclude_each_other():
    with pytest.raises(ConfigError, match="overlap-server-compute"):
        parse_run_config(defaults(**{"overlap-server-compute": True, "server-time-scale": 1.0}))
    cfg = parse_run_config(defaults(**{"overlap-server-compute": True}))
    assert cfg.options.overlap_server_compute and cfg.options.server_time_scale == 0.0


def test_gradient_inversion_settings_are_validated_before_any_work():
    import tomllib

    defaults = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    cfg = dict(defaults["tool"]["flwr"]["app"]["config"])
    with pytest.raises(ConfigError, match="optimizer = 'sgd'"):
        parse_run_config({**cfg, "strategy": "gi-compensation", "optimizer": "adam"})
    with pytest.raises(ConfigError, match="keep fraction|keep-fraction"):
        parse_run_config({**cfg, "strategy": "gi-compensation", "optimizer": "sgd", "gi.keep-fraction": 0.0})
    with pytest.raises(ConfigError, match="switch_rule='vote'.*first, mean.*gi.switch-rule"):
        parse_run_config({**cfg, "strategy": "gi-compensation", "optimizer": "sgd", "gi.switch-rule": "vote"})
    with pytest.raises(ConfigError, match="round-deadline"):
        parse_run_config({**cfg, "clock": "wall", "round-deadline": 1.0})
    with pytest.raises(ConfigError, match="intertwined"):
        parse_run_config({**cfg, "clock": "wall", "delay-model": "intertwined"})
    with pytest.raises(ConfigError, match="pipeline-late-clients.*round-deadline > 0"):
        parse_run_config({**cfg, "pipeline-late-clients": True})
    with pytest.raises(ConfigError, match="intertwined.staleness"):
        parse_run_config({**cfg, "delay-model": "intertwined", "intertwined.staleness": 0})
    parsed = parse_run_config({**cfg, "strategy": "gi-compensation", "optimizer": "sgd", "delay-model": "intertwined",
                               "round-deadline": 1.0})
    assert parsed.options.round_deadline == 1.0 and parsed.options.delay_model.staleness == 40
    assert parsed.strategy_config.inversion.keep_fraction == 0.05


def test_the_clientapp_does_not_import_the_server_strategies():
    # A ClientApp process parses only what it needs: the strategy names and the config base, no method.
    import subprocess
    import sys

    code = ("import sys, asyncfl.client_app.app; "
            "print(sorted(m for m in sys.modules if m.startswith('asyncfl.strategies') or m.startswith('asyncfl.server_app')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['asyncfl.strategies', 'asyncfl.strategies.registry', 'asyncfl.strategies.settings']"


def test_clientapp_parse_skips_strategy_keys_but_not_shared_ones():
    cfg = parse_run_config(defaults(**{"fedbuff.buffer-size": 0}), strategy_settings=False)
    assert cfg.strategy_config is None
    with pytest.raises(ConfigError, match="optimizer"):
        parse_run_config(defaults(optimizer="lion"), strategy_settings=False)


def test_each_strategy_name_parses_into_its_own_config_class():
    from asyncfl.decentralized.settings import GOSSIP_METHODS
    from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class

    extra = {"dd-fedrevive": {"server-holdout": 0.1}, "gi-compensation": {"optimizer": "sgd"}}
    for name in STRATEGY_CLASSES:
        cfg = parse_run_config(defaults(strategy=name, **extra.get(name, {})))
        assert type(cfg.strategy_config) is strategy_class(name).config_class, name
    for name in GOSSIP_METHODS:
        assert parse_run_config(defaults(strategy=name, **{"max-time": 5.0})).strategy_config is None


@pytest.mark.parametrize("preset", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.toml")))
def test_every_preset_parses_and_builds_its_model(preset, monkeypatch):
    import tomllib

    from asyncfl import config as config_module
    from asyncfl.data.datasets import CHANNELS
    from asyncfl.models import build_model

    monkeypatch.setattr(config_module, "check_files", lambda *args: None)  # on-disk datasets need not be here
    with open(ROOT / preset, "rb") as handle:
        cfg = parse_run_config(defaults(**tomllib.load(handle)))
    side = 32 if CHANNELS[cfg.data.dataset] == 3 else 28
    model = build_model(cfg.data.model, (CHANNELS[cfg.data.dataset], side, side), 10, cfg.data.batchnorm,
                        track_statistics=cfg.data.track_statistics)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_setting_of_another_strategy_is_refused_naming_both():
    # Prepare / Execute / Assert: the command line's key=value of a strategy the run does not use
    from asyncfl.cli import check_run_config

    with pytest.raises(ConfigError, match="fedbuff.buffer-size=3 is a setting of strategy 'fedbuff'.*'fedasync'"):
        check_run_config(ROOT, ["strategy='fedasync' fedbuff.buffer-size=3"])
    with pytest.raises(ConfigError, match="fedasync.alpha=0.5 .* strategy is 'fedbuff'"):
        check_run_config(ROOT, ["fedasync.alpha=0.5"])
    # its own knobs, keys it shares (fedavg.server-lr) and another strategy's default value pass
    check_run_config(ROOT, ["strategy='fedasync' fedasync.alpha=0.5 fedbuff.buffer-size=0"])
    check_run_config(ROOT, ["strategy='stale-weighted' fedavg.server-lr=0.5"])


def test_a_misspelled_key_is_answered_with_the_nearest_keys():
    from asyncfl.cli import check_run_config

    with pytest.raises(ValueError, match="unknown key 'max-arival': did you mean 'max-arrivals'"):
        check_run_config(ROOT, ["max-arival=5"])
    with pytest.raises(ValueError, match="unknown key 'zzz-qqq': every key is listed"):
        check_run_config(ROOT, ["zzz-qqq=5"])


@pytest.mark.parametrize("override, line", [
    ("evaluate-every-time=0", "evaluate-every-time (evaluate_every_time) = 0 and evaluate-every (evaluate_every) = 0 leave the run "
                     "without evaluation: set evaluate-every-time > 0 (clock units between evaluations) or evaluate-every >= 1 "
                     "(rounds)"),
    ("output-dir=''", "checkpoint-every (checkpoint_every) = 10 needs a place to write, and output-dir (output_dir) "
                      "and checkpoint-dir (checkpoint_dir) are empty: set output-dir (checkpoints go to <run "
                      "folder>/checkpoints), checkpoint-dir, or checkpoint-every = 0 for none"),
    ("max-arrivals=0", "the run never stops: set max-arrivals > 0 or max-time > 0 (both are 0)"),
])
def test_the_built_in_apps_refusals_name_its_run_config_keys(capsys, monkeypatch, override, line):
    # Execute: asyncfl run with one bad value (nothing may start)
    from asyncfl import cli

    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    monkeypatch.setattr(cli, "run_app", lambda *args, **kwargs: pytest.fail("a SuperLink was started"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--app", str(ROOT), "-c", override])
    # Assert: one line, leading with the key the user wrote
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"asyncfl run: error: invalid run-config: {line}\n"


def test_a_flower_apps_run_that_never_stops_names_num_server_rounds():
    # Where a Flower app's own ServerApp calls start(num_rounds=run_config["num-server-rounds"]) with 0
    from asyncfl.options import RunOptions

    with pytest.raises(ConfigError, match=r"never stops: num_rounds, max_arrivals and max_time are all 0: set one "
                                          r"> 0 \(Flower's examples pass run-config num-server-rounds as num_rounds\)"):
        RunOptions().check_run(0, 30.0)
    RunOptions().check_run(3, 30.0)


def test_the_data_settings_defaults_are_pyprojects():
    """DataConfig's defaults (the fallbacks for a stored run config that predates a key) are the app's."""
    from dataclasses import MISSING, fields

    from asyncfl.config import DataConfig

    cfg = defaults()
    keys = {"track_statistics": "model.track-statistics"}
    declared = {f.name: f.default for f in fields(DataConfig) if f.default is not MISSING}
    assert declared and all(cfg[keys.get(name, name.replace("_", "-"))] == value for name, value in declared.items())


@pytest.mark.parametrize("key, value", [("lr", "fast"), ("local-steps", "x"), ("timeout", "x"), ("batch-size", 32.5),
                                        ("dirichlet-alpha", True)])
def test_a_value_of_the_wrong_type_names_its_key_in_one_line(key, value):
    with pytest.raises(ConfigError, match=f"^{key}={value!r} must be a (whole )?number$"):
        parse_run_config(defaults(**{key: value}))


def test_a_knob_of_another_gossip_method_or_of_the_gossip_relay_is_foreign():
    from asyncfl.config import foreign_settings

    assert foreign_settings({"pushcen.k": 8}, "swift") == {"pushcen.k": ["pushcen"]}
    assert foreign_settings({"pushcen.k": 8, "swift.cache-size": 3}, "pushcen") == {"swift.cache-size": ["swift"]}
    assert list(foreign_settings({"gossip.out-degree": 4}, "fedbuff")) == ["gossip.out-degree"]
    assert foreign_settings({"gossip.out-degree": 4, "pushcen.k": 32}, "independent") == {}
    with pytest.raises(ConfigError, match="divshare.copies=2 is a setting of strategy 'divshare'"):
        parse_run_config(defaults(**{"strategy": "pushcen", "clock": "virtual", "max-time": 5.0,
                                     "divshare.copies": 2}))
