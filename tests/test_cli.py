"""``asyncfl run``'s local SuperLink: runs started side by side must not share a Flower home."""

from __future__ import annotations

import tomllib

import pytest

from asyncfl.deploy.simulation import CONNECTION, LocalSuperLink, run_failed


def _address(flwr_home) -> str:
    config = tomllib.loads((flwr_home / "config.toml").read_text())
    return config["superlink"][CONNECTION]["address"]


def test_two_local_superlinks_side_by_side_each_keep_their_own_address_and_clean_up(tmp_path):
    # Prepare: two SuperLinks started from the same app folder, the second while the first still runs
    # (the matrix benchmarks run studies in parallel this way).
    base = tmp_path / ".flwr"
    with LocalSuperLink(tmp_path, base) as first, LocalSuperLink(tmp_path, base) as second:
        # Assert: each `flwr` command gets a home whose connection points at its own SuperLink ...
        assert first.port != second.port and first.flwr_home != second.flwr_home
        assert _address(first.flwr_home) == f"127.0.0.1:{first.port}"
        assert _address(second.flwr_home) == f"127.0.0.1:{second.port}"
        assert first.env()["FLWR_HOME"] == str(first.flwr_home)
        # ... and asking a live SuperLink about its runs works (no run has failed).
        assert run_failed(tmp_path, first.env()) is False
        first_home, second_home = first.flwr_home, second.flwr_home
    # Stopping removes each home (state database included); the logs stay for a post-mortem.
    assert not first_home.exists() and not second_home.exists()
    assert sorted(p.name for p in base.iterdir()) == sorted([first.log_path.name, second.log_path.name])
    assert first.log_path.name.startswith(f"superlink-{first.port}-")


def _app_defaults() -> dict:
    from pathlib import Path

    from flwr.common.config import flatten_dict, get_project_config

    return flatten_dict(get_project_config(Path(__file__).resolve().parents[1])["tool"]["flwr"]["app"]["config"])


def _saved(name: str, **knobs) -> dict:
    """What a checkpoint of the built-in app holds for strategy ``name`` with ``knobs``."""
    from asyncfl.strategies.registry import strategy_class

    return strategy_class(name)(**knobs).state_dict()


def test_a_run_stored_before_the_option_renames_resumes_under_the_new_keys(tmp_path, caplog):
    import json

    from asyncfl.cli import resume_run_config
    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import write_run_config

    run = tmp_path / "outputs" / "old-run"
    run.mkdir(parents=True)
    old = {"job-timeout": 300.0, "max-virtual-time": 0.0, "eval-every": 2.0}
    renamed = ("timeout", "max-time", "evaluate-every-time")
    write_run_config(run, {**{k: v for k, v in _app_defaults().items() if k not in renamed}, **old,
                           "strategy": "fedbuff", "run-name": ""})
    (run / "checkpoints").mkdir()
    checkpoint.write(run / "checkpoints" / "checkpoint-v000010-a00000050.npz", {"strategy": _saved("fedbuff")})
    (run / "summary.json").write_text(json.dumps({"clients": 12}))
    with caplog.at_level("WARNING", logger="asyncfl"):
        resumed, _ = resume_run_config(run, ["job-timeout=600.0"])
    assert resumed["timeout"] == 600.0 and resumed["max-time"] == 0.0 and resumed["evaluate-every-time"] == 2.0
    assert not set(old) & set(resumed)
    assert "key 'job-timeout' is now 'timeout'" in caplog.text and "run_config.toml: key 'eval-every'" in caplog.text


def test_resume_reuses_the_runs_own_run_config_with_changes_and_its_node_count(tmp_path):
    import json

    import pytest

    from asyncfl.cli import main, resume_run_config, write_resume_run_config
    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import read_run_config, write_run_config

    run = tmp_path / "outputs" / "my-run"
    run.mkdir(parents=True)
    with pytest.raises(ValueError, match="no run_config.toml"):
        resume_run_config(run, [])
    write_run_config(run, {**_app_defaults(), "strategy": "fedbuff", "max-arrivals": 300, "model.batchnorm": False,
                           "lr": 0.001, "run-name": "", "target-accuracy": "0.8,0.9"})
    with pytest.raises(ValueError, match="no checkpoint in"):
        resume_run_config(run, [])
    (run / "checkpoints").mkdir()
    checkpoint.write(run / "checkpoints" / "checkpoint-v000010-a00000050.npz", {"strategy": _saved("fedbuff")})
    (run / "summary.json").write_text(json.dumps({"clients": 12}))
    resumed, clients = resume_run_config(run, ["max-arrivals=600"])
    assert clients == 12 and not (run / "resume").exists()  # checked, nothing written yet
    assert resumed["max-arrivals"] == 600 and resumed["model.batchnorm"] is False and resumed["lr"] == 0.001
    assert resumed["resume-from"] == str(run) and resumed["run-name"] == "my-run"
    assert resumed["output-dir"] == str(run.parent) and resumed["target-accuracy"] == "0.8,0.9"
    files = write_resume_run_config(run, resumed)
    assert files == [str(run / "resume" / "run_config.toml")] and read_run_config(run / "resume") == resumed
    with pytest.raises(SystemExit):  # a folder that is not a run folder: a usage error before anything starts
        main(["run", "--resume", str(tmp_path)])


def test_too_few_simulated_nodes_for_the_concurrency_are_refused_at_once(capsys):
    # Prepare / Execute: 3 nodes cannot run the default app's 10 jobs at once
    from asyncfl.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["run", "--num-supernodes", "3"])
    # Assert: refused before any SuperLink, in one line naming both fixes
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--num-supernodes 3 cannot fill concurrency=10" in err and "-c concurrency=3" in err
    # a gossip method has no concurrency to fill
    from asyncfl.cli import check_node_count

    check_node_count({"strategy": "pushcen", "concurrency": 10}, 3)
    check_node_count({"strategy": "fedbuff", "concurrency": 10, "jobs-per-client": 1}, 10)


def test_resume_refusals_come_before_anything_starts_or_is_written_and_a_damaged_checkpoint_falls_back(
        tmp_path, capsys):
    from asyncfl.cli import resume_run_config
    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import write_run_config

    # Prepare: a FedBuff run (buffer 0 = automatic) with two checkpoints
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    write_run_config(run, {**_app_defaults(), "run-name": "run"})
    older = run / "checkpoints" / "checkpoint-v000010-a00000050.npz"
    newer = run / "checkpoints" / "checkpoint-v000020-a00000100.npz"
    for path in (older, newer):
        checkpoint.write(path, {"strategy": _saved("fedbuff")})
    # Execute / Assert: another strategy, another knob: refused naming the key as written, nothing written
    with pytest.raises(ValueError, match="strategy='fedasync' cannot change on resume .the run has strategy='fedbuff'"):
        resume_run_config(run, ["strategy='fedasync'"])
    with pytest.raises(ValueError, match=r"fedbuff.buffer-size=3 cannot change on resume"):
        resume_run_config(run, ["fedbuff.buffer-size=3"])
    assert not (run / "resume").exists()
    # a truncated newest checkpoint: said, and the older one is checked (and resumed from by the ServerApp)
    newer.write_bytes(newer.read_bytes()[:100])
    resumed, _ = resume_run_config(run, ["max-arrivals=600"])
    assert "checkpoint-v000020-a00000100.npz is not a readable checkpoint" in capsys.readouterr().err
    assert checkpoint.newest_readable(run)[0] == older and resumed["max-arrivals"] == 600
    # a checkpoint another strategy wrote (its run-config says FedBuff): the checkpoint's own check still runs
    older.unlink()
    checkpoint.write(newer, {"strategy": _saved("fedasync")})
    with pytest.raises(ValueError, match="the checkpoint's strategy is FedAsync, this run's is FedBuff"):
        resume_run_config(run, [])


def test_ctrl_c_stops_the_run_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import signal

    from asyncfl import cli
    from asyncfl.server_app import checkpoint

    # Prepare: a run that has written a checkpoint when the user presses Ctrl-C
    installed = {}
    monkeypatch.setattr(cli.signal, "signal", lambda sig, handler: installed.__setitem__(sig, handler))

    def interrupted(*args, **kwargs):
        folder = tmp_path / "run"
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "run_config.toml").write_text("")
        checkpoint.write(folder / "checkpoints" / "checkpoint-v000004-a00000008.npz", {"x": 1})
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_app", interrupted)
    # Execute
    code = cli.main(["run", "-c", f"output-dir='{tmp_path}' run-name='run'"])
    # Assert: Ctrl-C (even where a shell left SIGINT ignored) and SIGTERM unwind; one line, exit 130
    assert installed[signal.SIGINT] is cli._interrupt and installed[signal.SIGTERM] is cli._interrupt
    assert code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("asyncfl: interrupted: stopped the SuperLink and its simulation; newest checkpoint "
                       f"checkpoint-v000004-a00000008.npz: go on with asyncfl run --resume {tmp_path / 'run'}")


# ---------------------------------------------------------------- a Flower user's first hour (issue 60)
ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture
def nothing_starts(monkeypatch):
    """``asyncfl run`` with its SuperLink replaced by a recorder, and no signal handlers left behind."""
    from asyncfl import cli

    calls = []
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    monkeypatch.setattr(cli, "run_app", lambda *args, **kwargs: calls.append((args, kwargs)) or 0)
    return calls


def _refused(capsys, argv) -> str:
    """Run ``asyncfl`` with ``argv``; it must exit 2 with one line on stderr, no traceback; returns that line."""
    from asyncfl.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _resumable_run(tmp_path, clients=50):
    import json

    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import write_run_config

    run = tmp_path / "outputs" / "run"
    (run / "checkpoints").mkdir(parents=True)
    write_run_config(run, {**_app_defaults(), "run-name": "run", "output-dir": str(run.parent)})
    checkpoint.write(run / "checkpoints" / "checkpoint-v000010-a00000050.npz", {"strategy": _saved("fedbuff")})
    (run / "summary.json").write_text(json.dumps({"clients": clients}))
    return run


def test_a_toml_file_and_key_value_pairs_combine_a_later_one_winning(tmp_path, nothing_starts):
    # Prepare: a preset, then pairs, then a file of the user's own that sets max-arrivals again
    from flwr.common.config import parse_config_args

    from asyncfl.cli import main

    mine = tmp_path / "mine.toml"
    mine.write_text('max-arrivals = 9\n"model.batchnorm" = true\n')
    # Execute
    assert main(["run", "-c", "conf/mnist5k-k50-fedbuff.toml", "-c", "max-arrivals=7 run-name='a b=c'",
                 "-c", "model='cnn'", "-c", str(mine)]) == 0
    # Assert: flwr run gets one fused set, which Flower's own parser reads back as merged here
    (args, kwargs), = nothing_starts
    assert len(args[1]) == 1
    assert parse_config_args(args[1]) == {"strategy": "fedbuff", "concurrency": 50, "fedbuff.buffer-size": 10,
                                          "fedbuff.server-lr": 1.0, "max-arrivals": 9, "evaluate-every-time": 2.0,
                                          "delay-model": "fedrevive-default", "target-accuracy": "0.8,0.9,0.95",
                                          "run-name": "a b=c", "model": "cnn", "model.batchnorm": True}


@pytest.mark.parametrize("preset", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.toml")))
def test_every_preset_reaches_flwr_run_as_it_reads(preset):
    from flwr.common.config import parse_config_args

    from asyncfl.run_config_args import flwr_run_config, merge_run_config, run_config_sources

    merged = merge_run_config(run_config_sources([str(ROOT / preset)]))
    assert parse_config_args(flwr_run_config(merged)) == merged


def test_the_commands_in_docs_fidelity_parse(monkeypatch):
    # Prepare: the paper-scale commands as the doc writes them; data and a GPU are the machine's business
    import shlex

    import torch

    from asyncfl import cli, config

    monkeypatch.setattr(config, "check_files", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    text = (ROOT / "docs" / "fidelity.md").read_text().replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in text.splitlines() if line.startswith("asyncfl run ")]
    assert len(commands) >= 6
    for command in commands:
        args = cli._parser().parse_args(command[1:])
        # Execute / Assert: each validates (the preset and its overrides together)
        cli.check_run_config(ROOT, args.run_config, args.num_supernodes)


def test_a_toml_files_knob_of_another_strategy_is_refused_and_a_presets_own_method_may_be_swapped(
        tmp_path, capsys, nothing_starts, monkeypatch):
    # Prepare: a user's file that sets FedBuff and a FedAsync knob
    bad = tmp_path / "bad.toml"
    bad.write_text('strategy = "fedbuff"\n"fedasync.staleness" = "hinge"\n')
    # Execute / Assert: refused as the same key given with -c is, naming the file
    line = _refused(capsys, ["run", "-c", str(bad)])
    assert line == (f"asyncfl run: error: invalid run-config: {bad}: fedasync.staleness='hinge' is a setting of "
                    "strategy 'fedasync', but this run's strategy is 'fedbuff', which ignores it: drop the key or "
                    "set strategy='fedasync'")
    assert not nothing_starts
    # a preset's knobs of the strategy it names come with it when -c swaps the strategy ...
    preset = tmp_path / "preset.toml"
    preset.write_text('strategy = "fedasync"\n"fedasync.staleness" = "hinge"\n')
    from asyncfl.cli import main

    assert main(["run", "-c", str(preset), "-c", "strategy='fedbuff'"]) == 0
    # ... but not a third strategy's
    preset.write_text('strategy = "fedasync"\n"fedbuff.buffer-size" = 3\n')
    assert "fedbuff.buffer-size=3 is a setting of strategy 'fedbuff'" in _refused(
        capsys, ["run", "-c", str(preset), "-c", "strategy='afl-dw'"])


@pytest.mark.parametrize("argv, says", [
    (["-c", "concurrency=20"], "concurrency=20 cannot change on resume (the run has concurrency=10)"),
    (["-c", "seed=7"], "seed=7 cannot change on resume (the run has seed=42)"),
    (["-c", "dataset='digits'"], "dataset='digits' cannot change on resume (the run has dataset='mnist5k')"),
    (["-c", "run-name='other'"], "run-name='other' cannot change on resume"),
    (["-c", "max-arival=600"], "unknown key 'max-arival': did you mean 'max-arrivals'"),
    (["--num-supernodes", "20"], "--num-supernodes 20 cannot change on resume (the run has 50 clients): leave it out"),
    (["--num-supernodes", "3"], "--num-supernodes 3 cannot change on resume"),
])
def test_resume_refuses_what_it_cannot_change_in_one_line_before_anything_starts_or_is_written(
        tmp_path, capsys, nothing_starts, argv, says):
    # Prepare: a finished run of 50 clients with a checkpoint
    run = _resumable_run(tmp_path)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    # Execute
    line = _refused(capsys, ["run", "--resume", str(run), *argv])
    # Assert: the user's key as written, what a resume may change; nothing started, nothing written
    assert line.startswith(f"asyncfl run: error: --resume {run}: ") and says in line
    if "cannot change" in says and "--num-supernodes" not in says:
        assert line.endswith("a resume may change only max-arrivals, max-time, timeout, "
                             "wait-for-nodes, progress, data-dir")
    assert not nothing_starts and sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_resume_takes_a_stop_the_same_node_count_and_an_unchanged_value(tmp_path, nothing_starts):
    from asyncfl.cli import main
    from asyncfl.server_app.run_folder import read_run_config

    run = _resumable_run(tmp_path)
    assert main(["run", "--resume", str(run), "--num-supernodes", "50", "-c", "max-arrivals=600 concurrency=10"]) == 0
    (args, _), = nothing_starts
    assert args[1] == [str(run / "resume" / "run_config.toml")] and args[2] == 50
    assert read_run_config(run / "resume")["max-arrivals"] == 600


@pytest.mark.parametrize("argv, line", [
    (["run", "--num-supernodes", "0"], "asyncfl run: error: --num-supernodes must be >= 1, got 0"),
    (["run", "--num-supernodes", "-3"], "asyncfl run: error: --num-supernodes must be >= 1, got -3"),
    (["run", "-c", "strategy=fedasync"], "asyncfl run: error: invalid run-config: strategy=fedasync: a string value "
                                         "needs quotes (as for flwr run): -c \"strategy='fedasync'\""),
    (["run", "-c", "max-arrivals=5 strategy=fedasync"], "asyncfl run: error: invalid run-config: strategy=fedasync: "
                                                        "a string value needs quotes (as for flwr run): "
                                                        "-c \"strategy='fedasync'\""),
    (["run", "-c", "progress=True"], "asyncfl run: error: invalid run-config: progress=True: TOML booleans are "
                                     "lowercase: -c progress=true"),
    (["run", "-c", "lr = 0.1"], "asyncfl run: error: invalid run-config: -c 'lr = 0.1' has no key=value pair: write "
                                "key=value with no spaces around '=', e.g. -c max-arrivals=600"),
])
def test_bad_command_line_values_are_refused_in_one_line_before_anything_starts(capsys, nothing_starts, argv, line):
    assert _refused(capsys, argv) == line
    assert not nothing_starts


def test_an_unquoted_string_is_refused_by_flower_too():
    # asyncfl matches Flower's own reading of -c: flwr run refuses it as well (with a ClickException)
    import click
    from flwr.common.config import parse_config_args

    with pytest.raises(click.ClickException):
        parse_config_args(["strategy=fedasync"])


def test_compose_keeps_a_file_that_holds_another_deployment_unless_forced(tmp_path, capsys, monkeypatch):
    from asyncfl import cli

    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    out = tmp_path / "docker" / "compose.yml"
    out.parent.mkdir()
    out.write_text("# a file of the user's own\nservices: {}\n")
    # Execute / Assert: refused in one line naming both ways on, nothing written
    assert cli.main(["compose", "--insecure", "--supernodes", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"asyncfl compose: {out} exists and holds another deployment than this command writes: pass "
                   "--out PATH for a new file, or --force to overwrite it\n")
    assert out.read_text() == "# a file of the user's own\nservices: {}\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["compose.yml", "docker"]
    # --force overwrites it; the same command again rewrites its own file without --force
    assert cli.main(["compose", "--insecure", "--supernodes", "2", "--out", str(out), "--force"]) == 0
    assert cli.main(["compose", "--insecure", "--supernodes", "2", "--out", str(out)]) == 0
    assert "--supernodes 2 --insecure" in out.read_text().splitlines()[0]
    assert cli.main(["compose", "--insecure", "--supernodes", "3", "--out", str(out)]) == 2


def test_version_and_help_are_plain_text_and_run_help_lists_strategies_and_keys(capsys):
    from importlib.metadata import version

    from asyncfl.cli import main
    from asyncfl.strategies.registry import STRATEGY_CLASSES

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith(f"asyncfl {version('asyncfl')} (flwr ")
    for argv in (["--help"], ["run", "--help"], ["compose", "--help"], ["docker", "build", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        assert "`" not in text and ":mod:" not in text, argv
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    listed = text[text.index("strategies of the built-in app"):].replace("\n", " ")
    assert all(f" {name}," in listed or f" {name} " in listed for name in [*STRATEGY_CLASSES, "pushcen", "swift"])
    assert "[tool.flwr.app.config]" in text and "max-arrivals" in text


def test_outside_any_app_folder_run_takes_the_builtin_app_installed_with_the_package(tmp_path, monkeypatch,
                                                                                      nothing_starts):
    # a pip-installed user has no clone: `asyncfl run` in any folder runs the built-in app, outputs under that folder
    from asyncfl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["run", "--num-supernodes", "10", "-c", "max-arrivals=20"]) == 0
    (app, run_config, nodes, _), kwargs = nothing_starts[0]
    assert app == tmp_path / "cache" / "asyncfl" / "builtin-app" and (app / "pyproject.toml").exists()
    assert kwargs["workdir"] == tmp_path and nodes == 10 and run_config == ['"max-arrivals"=20']
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing else written before the run


def test_an_app_folder_named_with_app_must_be_one(tmp_path, capsys, nothing_starts):
    line = _refused(capsys, ["run", "--app", str(tmp_path)])
    assert "has no pyproject.toml" in line and "leave --app out to run asyncfl's built-in app" in line
    assert not nothing_starts


def test_resuming_a_finished_run_without_a_later_stop_is_refused_before_anything_starts(tmp_path, capsys,
                                                                                         nothing_starts):
    import json

    from asyncfl.cli import main

    run = _resumable_run(tmp_path)
    (run / "summary.json").write_text(json.dumps({"clients": 50, "finished": True, "arrivals": 300,
                                                  "stop-reason": "max-arrivals 300 reached"}))
    line = _refused(capsys, ["run", "--resume", str(run)])
    assert "the run finished (max-arrivals 300 reached): nothing to resume" in line
    assert "-c max-arrivals=<more than 300>" in line and not nothing_starts
    assert "nothing to resume" in _refused(capsys, ["run", "--resume", str(run), "-c", "max-arrivals=100"])
    assert not (run / "resume").exists()
    # a later stop goes on; an unfinished (interrupted) run resumes as it is
    assert main(["run", "--resume", str(run), "-c", "max-arrivals=400"]) == 0
    (run / "summary.json").write_text(json.dumps({"clients": 50, "finished": False, "stop-reason": "interrupted"}))
    assert main(["run", "--resume", str(run)]) == 0 and len(nothing_starts) == 2


@pytest.mark.parametrize("summary", [[1, 2], {"clients": "50"}, {"clients": True}, {"clients": 50.0},
                                     {"clients": 0}])
def test_a_damaged_summary_is_refused_in_one_line_not_a_traceback(tmp_path, capsys, nothing_starts, summary):
    import json

    run = _resumable_run(tmp_path)
    (run / "summary.json").write_text(json.dumps(summary))
    if isinstance(summary, list):  # not an object: as good as no summary, the node count falls back
        from asyncfl.cli import main

        assert main(["run", "--resume", str(run)]) == 0
        return
    assert "not a client count" in _refused(capsys, ["run", "--resume", str(run)]) and not nothing_starts


@pytest.mark.parametrize("pairs, left", [("max-arrivals=600 strategy = 'fedasync'", "strategy = 'fedasync'"),
                                         ("max-arrivals=600 seed", "seed")])
def test_text_flower_would_drop_from_a_pair_argument_is_refused(capsys, nothing_starts, pairs, left):
    line = _refused(capsys, ["run", "-c", pairs])
    assert f"{left!r} is no key=value pair (flwr run would drop it)" in line and not nothing_starts


def test_any_characters_in_a_string_value_reach_flower_and_the_run_folder_intact():
    import tomllib

    from flwr.common.config import parse_config_args

    from asyncfl.run_config_args import flwr_run_config
    from asyncfl.server_app.run_folder import toml_string

    for value in ["😀 𝔽 run", 'say "hi"', "x y=z", "multi\nline", "back\\slash", "tab\there", ""]:
        assert parse_config_args(flwr_run_config({"run-name": value}))["run-name"] == value
        assert tomllib.loads("k = " + toml_string(value + "\r\x7f"))["k"] == value + "\r\x7f"


def test_a_python_project_that_is_no_flower_app_does_not_block_the_builtin_app(tmp_path, monkeypatch,
                                                                                nothing_starts):
    from asyncfl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "1"\n')
    assert main(["run", "-c", "max-arrivals=20"]) == 0
    (app, *_), kwargs = nothing_starts[0]
    assert app.name == "builtin-app" and kwargs["workdir"] == tmp_path


def test_nohup_keeps_sighup_ignored_so_the_run_outlives_the_terminal(monkeypatch, nothing_starts):
    import signal

    from asyncfl import cli

    installed = {}
    monkeypatch.setattr(cli.signal, "signal", lambda sig, handler: installed.__setitem__(sig, handler))
    monkeypatch.setattr(cli.signal, "getsignal", lambda sig: signal.SIG_IGN)
    assert cli.main(["run", "-c", "max-arrivals=20"]) == 0
    assert signal.SIGHUP not in installed and installed[signal.SIGTERM] is cli._interrupt


def test_a_bad_ray_address_is_refused_before_a_resume_writes_anything(tmp_path, capsys, nothing_starts):
    run = _resumable_run(tmp_path)
    line = _refused(capsys, ["run", "--resume", str(run), "--ray-address", "127.0.0.1:1"])
    assert "--ray-address 127.0.0.1:1: nothing answers there" in line
    assert not nothing_starts and not (run / "resume").exists()


@pytest.mark.parametrize("argv, says", [(["run", "--cpus-per-client", "nan"], "--cpus-per-client must be a whole"),
                                        (["run", "--cpus-per-client", "0.25"], "raise --ray-cpus"),
                                        (["run", "--ray-cpus", "0"], "--ray-cpus must be >= --cpus-per-client"),
                                        (["run", "--cpus-per-client", "2", "--ray-cpus", "1"], "Ray would start no"),
                                        (["run", "--ray-cpus", "8", "--ray-address", "auto"], "leave one of them out"),
                                        (["run", "-c", "lr=inf"], "lr=inf must be a finite number > 0"),
                                        (["run", "-c", "lr=nan"], "lr=nan must be a finite number > 0")])
def test_numbers_flower_cannot_take_are_refused(capsys, nothing_starts, argv, says):
    assert says in _refused(capsys, argv) and not nothing_starts


@pytest.mark.parametrize("seed", ["-1", str(2 ** 63)])
def test_a_seed_flower_cannot_carry_is_refused_before_anything_starts(capsys, nothing_starts, seed):
    line = _refused(capsys, ["run", "-c", f"seed={seed}"])
    assert f"seed = {seed} is out of range" in line and not nothing_starts


def test_ray_cpus_reaches_flowers_federation_config_and_whole_cpus_per_client(monkeypatch, tmp_path):
    # Prepare: the SuperLink and flwr replaced by recorders.
    from asyncfl.deploy import simulation

    commands = []

    class Link:
        def __init__(self, *args):
            self.log_path = tmp_path / "superlink.log"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def env(self):
            return {}

    monkeypatch.setattr(simulation, "LocalSuperLink", Link)
    monkeypatch.setattr(simulation.subprocess, "call", lambda command, **kwargs: commands.append(command) or 1)
    # Act: with and without ray_cpus.
    simulation.run_app(ROOT, [], 8, 1, ray_cpus=8)
    simulation.run_app(ROOT, [], 8, 2)
    # Assert: Flower's own keys, integers as its federation config types them.
    federations = [c[c.index("--federation-config") + 1] for c in commands]
    assert federations == ["num-supernodes=8 client-resources-num-cpus=1 init-args-num-cpus=8",
                           "num-supernodes=8 client-resources-num-cpus=2"]
