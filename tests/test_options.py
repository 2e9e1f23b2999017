"""RunOptions: one list of the run's options, shared by start() and the built-in app's run-config."""

import dataclasses
import inspect
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

import asyncfl
from asyncfl.config import parse_run_config
from asyncfl.options import RunOptions
from asyncfl.strategies.settings import ConfigError
from tests.fake_grid import FakeGrid, trained_reply

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_every_option_has_a_run_config_default_in_pyproject():
    missing = [RunOptions.key_of(name) for name in RunOptions.names() if RunOptions.key_of(name) not in PYPROJECT]
    assert missing == []


def test_start_keeps_flowers_seven_parameters_and_takes_options_by_name():
    parameters = list(inspect.signature(asyncfl.FedBuff.start).parameters)
    assert parameters[1:8] == ["grid", "initial_arrays", "num_rounds", "timeout", "train_config", "evaluate_config",
                               "evaluate_fn"]
    assert parameters[8:] == ["options", "run_config", "callbacks", "trusted_train_fn", "option_keywords"]


def test_an_unknown_option_is_named_with_the_valid_ones_before_any_message():
    grid = FakeGrid(2, lambda node, message: None)
    with pytest.raises(TypeError, match=r"unknown option\(s\) max_virtual_time; valid: max_arrivals, max_time"):
        asyncfl.FedBuff().start(grid, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), max_virtual_time=3.0)
    assert grid.pushed == []


def test_names_change_an_options_object_and_leave_it_as_it_was():
    base = RunOptions(clock="virtual", delay_model="uniform-speed", seed=3)
    changed = RunOptions.from_keywords(base, seed=4)
    assert (changed.clock, changed.delay_model, changed.seed) == ("virtual", "uniform-speed", 4)
    assert base.seed == 3


def test_an_options_object_runs_as_its_keywords_do():
    def client(node, message):
        return trained_reply(message, message.content.array_records["arrays"])

    def run(**how):
        grid = FakeGrid(3, client)
        result = asyncfl.FedAsync(fraction_evaluate=0.0).start(
            grid, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), num_rounds=2, **how)
        return [(m.metadata.dst_node_id, m.content.config_records["config"]["job-seed"]) for m in grid.pushed
                if m.metadata.message_type == "train"], result.summary["arrivals"]

    by_name = run(clock="virtual", delay_model="fedrevive-default", seed=5)
    assert run(options=RunOptions(clock="virtual", delay_model="fedrevive-default", seed=5)) == by_name
    assert run(options=RunOptions(clock="virtual", delay_model="fedrevive-default", seed=9), seed=5) == by_name


@pytest.mark.parametrize("keywords, message", [
    (dict(concurrency=0), "concurrency"),
    (dict(concurrency=2.5), "concurrency=2.5 must be an integer"),
    (dict(clock="virtual"), "delay model"),
    (dict(identify_nodes="yes"), "identify_nodes"),
    (dict(target_accuracy=(1.5,)), r"\(0, 1\]"),
    (dict(max_time=-1.0), "max_time=-1.0 must be >= 0 .run-config max-time"),
    (dict(dispatch_hold=0.5, overlap_server_compute=True), "overlap-server-compute .* dispatch-hold"),
])
def test_bad_options_are_refused_when_made(keywords, message):
    with pytest.raises(ConfigError, match=message):
        RunOptions(**keywords)


def test_the_built_in_app_reads_the_same_options_from_its_run_config():
    cfg = parse_run_config(dict(PYPROJECT))
    options = cfg.options
    assert (options.clock, options.concurrency, options.max_arrivals, options.seed) == (
        PYPROJECT["clock"], PYPROJECT["concurrency"], PYPROJECT["max-arrivals"], PYPROJECT["seed"])
    assert options.identify_nodes is True and options.evaluate_every == 0
    assert options.evaluate_every_time == PYPROJECT["evaluate-every-time"] and options.target_accuracy == (0.8, 0.9)
    engine = options.engine_config(num_rounds=0, timeout=cfg.timeout, concurrency=options.concurrency,
                                   round_arrivals=0, node_wait=options.wait_for_nodes)  # as start() builds it, once
    assert engine.max_time == options.max_time and engine.delay_preset == PYPROJECT["delay-model"]
    assert dataclasses.asdict(options)["delay_model"] == dataclasses.asdict(engine)["delay_model"]


@pytest.mark.parametrize("strategy", [asyncfl.FedAvg, asyncfl.CA2FL])
def test_dispatch_hold_is_refused_where_the_strategy_would_ignore_it_before_any_message(strategy):
    grid = FakeGrid(2, lambda node, message: None)
    with pytest.raises(ConfigError, match=r"dispatch-hold .* = 0.5 .* works with FedBuff and FedAsync"):
        strategy().start(grid, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), dispatch_hold=0.5)
    assert grid.pushed == []
    for name in ("fedavg", "async-dfedavg"):
        with pytest.raises(ConfigError, match=f"dispatch-hold .* and {name} cannot say"):
            parse_run_config({**PYPROJECT, "strategy": name, "dispatch-hold": 0.5})
    assert parse_run_config({**PYPROJECT, "strategy": "fedasync", "dispatch-hold": 0.5}).options.dispatch_hold == 0.5


def test_dispatch_hold_is_on_by_default_for_fedbuff_and_settable_for_fedasync(caplog):
    def client(node, message):
        return trained_reply(message, message.content.array_records["arrays"])

    def holds(strategy, **how):
        result = strategy.start(FakeGrid(4, client), ArrayRecord({"w": Array(np.zeros(2, np.float32))}),
                                num_rounds=3, clock="virtual", delay_model="uniform-speed", **how)
        return result.summary.get("held-dispatches", 0)

    held = holds(asyncfl.FedBuff(buffer_size=2))
    assert held > 0  # equal speeds: the buffer's arrivals come together
    closing = [r.getMessage() for r in caplog.records if "mean staleness" in r.getMessage()]
    assert closing and closing[-1].endswith(f", {held} dispatch(es) held for the next version")
    assert holds(asyncfl.FedAsync()) == 0  # its mixing takes a fresh model whole: held waves would replace it
    assert holds(asyncfl.FedAsync(), dispatch_hold=0.5) > 0
    assert holds(asyncfl.FedBuff(buffer_size=2), dispatch_hold=0.0) == 0
    assert holds(asyncfl.FedBuff(buffer_size=2), overlap_server_compute=True) == 0
    assert holds(asyncfl.CA2FL()) == 0
    assert parse_run_config(dict(PYPROJECT)).options.dispatch_hold == 0.0  # the built-in app's studies: as published


def _as_toml(default):
    """A RunOptions default as pyproject.toml can write it (TOML has no None; a tuple of targets is a string)."""
    return "" if default is None or default == () else default


def test_one_name_and_one_default_per_option_from_start_to_the_run_config_to_the_engine():
    from asyncfl.config import BUILTIN_APP_CHOICES, same_value
    from asyncfl.options import RENAMED_KEYS, EngineConfig

    start = inspect.signature(asyncfl.FedBuff.start).parameters
    for spec in dataclasses.fields(RunOptions):
        key = RunOptions.key_of(spec.name)
        assert key == spec.name.replace("_", "-"), f"{spec.name}'s run-config key is {key}, not its name"
        expected = BUILTIN_APP_CHOICES.get(key, _as_toml(spec.default))
        assert same_value(PYPROJECT[key], expected), f"pyproject {key} = {PYPROJECT[key]!r}, declared {expected!r}"
    # Flower's own start() parameter the built-in app sets: the same name as the key
    assert PYPROJECT["timeout"] == BUILTIN_APP_CHOICES["timeout"] != start["timeout"].default
    for key, value in BUILTIN_APP_CHOICES.items():  # each choice is an option's key and differs from its default
        name = key.replace("-", "_")
        default = start[name].default if name in start else _as_toml(RunOptions.__dataclass_fields__[name].default)
        assert not same_value(value, default), f"{key} = {value!r} is the default: drop it from the choices"
    # the engine's settings: an option's name, a start() parameter's, or what the run resolves (K's cohort, the
    # delay preset's name); none has a name of its own
    resolved = {"round_arrivals", "delay_preset"}
    for spec in dataclasses.fields(EngineConfig):
        assert spec.name in RunOptions.names() or spec.name in start or spec.name in resolved, spec.name
    # no old spelling is left in the app's defaults or the shipped presets
    presets = [tomllib.loads(path.read_text()) for path in sorted((ROOT / "conf").rglob("*.toml"))]
    for keys in [PYPROJECT, *presets]:
        assert not set(RENAMED_KEYS) & set(keys)


def test_an_old_spelling_in_a_stored_config_or_a_start_keyword_is_read_as_its_new_name_with_one_line(caplog, tmp_path):
    from asyncfl.options import _SAID
    from asyncfl.run_config_args import app_overrides, flwr_run_config

    _SAID.clear()
    stored = {k: v for k, v in PYPROJECT.items() if k not in ("timeout", "max-time", "evaluate-every-time")}
    with caplog.at_level("WARNING", logger="asyncfl"):
        cfg = parse_run_config({**stored, "job-timeout": 45.0, "max-virtual-time": 7.0, "eval-every": 0.5})
        parse_run_config({**stored, "job-timeout": 45.0, "max-virtual-time": 7.0, "eval-every": 0.5})  # said once
    assert (cfg.timeout, cfg.options.max_time, cfg.options.evaluate_every_time) == (45.0, 7.0, 0.5)
    notices = [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]
    assert notices == ["run-config: key 'max-virtual-time' is now 'max-time' (read as max-time=7.0)",
                       "run-config: key 'eval-every' is now 'evaluate-every-time' (read as evaluate-every-time=0.5)",
                       "run-config: key 'job-timeout' is now 'timeout' (read as timeout=45.0)"]
    # asyncfl run / deploy / docker up: what flwr run gets has the new key, checked and sent alike
    _, overrides = app_overrides(ROOT, ["job-timeout=60.0 seed=3"])
    assert overrides == {"timeout": 60.0, "seed": 3} and flwr_run_config(overrides) == ['"seed"=3 "timeout"=60.0']
    with pytest.raises(ConfigError, match="job-timeout=60.0 and timeout=30.0 are one setting .* keep timeout only"):
        app_overrides(ROOT, ["job-timeout=60.0", "timeout=30.0"])  # in two -c arguments too
    # another Flower app's keys are its own (flwr run refuses a key it does not have)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "their-app"\nversion = "1.0.0"\n[tool.flwr.app]\npublisher = "them"\n'
        '[tool.flwr.app.components]\nserverapp = "app.server:app"\nclientapp = "app.client:app"\n'
        '[tool.flwr.app.config]\n"eval-every" = 5\n"timeout" = 9.0\n')
    assert app_overrides(tmp_path, ["eval-every=3 job-timeout=1.0"])[1] == {"eval-every": 3, "job-timeout": 1.0}
    # start() / RunOptions keywords and the attribute
    with caplog.at_level("WARNING", logger="asyncfl"):
        options = RunOptions.from_keywords(clock="virtual", delays="uniform-speed")
    assert options.delay_model == "uniform-speed" and options.delays == "uniform-speed"
    assert "start(delays=...) is now delay_model=..." in caplog.text
    assert RunOptions(clock="virtual", delays="fedrevive-default").delay_model == "fedrevive-default"
    with pytest.raises(TypeError, match="pass delay_model= only"):
        RunOptions.from_keywords(delays="uniform-speed", delay_model="uniform-speed")
