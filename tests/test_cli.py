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
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [f"superlink-{first.port}.log", f"superlink-{second.port}.log"])


def _app_defaults() -> dict:
    from pathlib import Path

    from flwr.common.config import flatten_dict, get_project_config

    return flatten_dict(get_project_config(Path(__file__).resolve().parents[1])["tool"]["flwr"]["app"]["config"])


def _saved(name: str, **knobs) -> dict:
    """What a checkpoint of the built-in app holds for strategy ``name`` with ``knobs``."""
    from asyncfl.strategies.registry import strategy_class

    return strategy_class(name)(**knobs).state_dict()


def test_resume_reuses_the_runs_own_run_config_with_changes_and_its_node_count(tmp_path):
    import json

    import numpy as np
    import pytest

    from asyncfl.cli import main, resume_run_config
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
    files, clients = resume_run_config(run, ["max-arrivals=600"])
    resumed = read_run_config(run / "resume")
    assert files == [str(run / "resume" / "run_config.toml")]
    assert clients == 12
    assert resumed["max-arrivals"] == 600 and resumed["model.batchnorm"] is False and resumed["lr"] == 0.001
    assert resumed["resume-from"] == str(run) and resumed["run-name"] == "my-run"
    assert resumed["output-dir"] == str(run.parent) and resumed["target-accuracy"] == "0.8,0.9"
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
    # Execute / Assert: another strategy, another knob: refused naming what differs, nothing written
    with pytest.raises(ValueError, match="the checkpoint's strategy is FedBuff, this run's is FedAsync"):
        resume_run_config(run, ["strategy='fedasync'"])
    with pytest.raises(ValueError, match=r"buffer_size=0 there, 3 here \(run-config fedbuff.buffer-size\)"):
        resume_run_config(run, ["fedbuff.buffer-size=3"])
    assert not (run / "resume").exists()
    # a truncated newest checkpoint: said, and the older one is checked (and resumed from by the ServerApp)
    newer.write_bytes(newer.read_bytes()[:100])
    files, _ = resume_run_config(run, ["max-arrivals=600"])
    assert "checkpoint-v000020-a00000100.npz is not a readable checkpoint" in capsys.readouterr().err
    assert checkpoint.newest_readable(run)[0] == older and files


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
