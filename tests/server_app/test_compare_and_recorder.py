"""The compare command and the recorder's summary helpers."""

import json

from asyncfl.cli import main
from asyncfl.server_app.recorder import staleness_histogram, time_to_targets
from asyncfl.simulation.compare import compare_runs


def _fake_run(folder, strategy, accuracies, **summary):
    folder.mkdir()
    lines = ["time,server_version,arrivals,rejected,accuracy,loss"]
    lines += [f"{i * 2.0},{i},{i * 5},0,{a},1.0" for i, a in enumerate(accuracies)]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text(json.dumps({"strategy": strategy, "staleness-mean": 1.5,
                                                     "server-ms-per-arrival": 0.4, **summary}))
    (folder / "config.json").write_text(json.dumps({"engine": {"clock": "virtual"}}))


def test_compare_table_and_plot(tmp_path):
    _fake_run(tmp_path / "fast", "fedbuff", [0.1, 0.8, 0.9])
    _fake_run(tmp_path / "slow", "fedavg", [0.1, 0.3, 0.5, 0.85])
    table = compare_runs([tmp_path / "fast", tmp_path / "slow"], tmp_path / "cmp.png", target=0.8)
    fast, slow = table.splitlines()[2:4]
    assert fast.split()[4] == "2.00" and slow.split()[4] == "6.00"
    assert (tmp_path / "cmp.png").stat().st_size > 1000


def test_compare_cli(tmp_path, capsys):
    _fake_run(tmp_path / "a", "fedbuff", [0.2, 0.6])
    assert main(["compare", str(tmp_path / "a"), "--out", str(tmp_path / "c.png")]) == 0
    assert "fedbuff" in capsys.readouterr().out


def test_time_to_targets_and_histogram():
    rows = [{"time": 0.0, "accuracy": 0.1}, {"time": 3.0, "accuracy": 0.85}, {"time": 5.0, "accuracy": 0.92}]
    assert time_to_targets(rows, (0.8, 0.9, 0.99)) == {"0.8": 3.0, "0.9": 5.0, "0.99": None}
    assert staleness_histogram([0, 2, 2, 5]) == {"0": 1, "2": 2, "5": 1}


def test_compare_marks_unfinished_runs_and_says_what_time_to_target_is(tmp_path):
    # Prepare: a finished run, one stopped by Ctrl-C, one killed outright (its summary still says running)
    _fake_run(tmp_path / "done", "fedbuff", [0.1, 0.8, 0.9], **{"stop-reason": "num-rounds 40 reached",
                                                                "finished": True})
    _fake_run(tmp_path / "ctrl-c", "fedavg", [0.1, 0.85], **{"stop-reason": "interrupted (Ctrl-C)", "finished": False})
    _fake_run(tmp_path / "killed", "fedavg", [0.1, 0.85], **{"stop-reason": "running (no end recorded)",
                                                             "finished": False})
    # Execute
    table = compare_runs([tmp_path / n for n in ("done", "ctrl-c", "killed")], tmp_path / "cmp.png", target=0.8)
    # Assert: an "ended" column, unfinished runs starred with a footnote; the time column says what it measures
    lines = table.splitlines()
    assert lines[0].split()[-1] == "ended" and "time to 0.800" in lines[0]
    assert [line.split()[-1] for line in lines[2:5]] == ["done", "interrupted*", "unfinished*"]
    assert any(line.startswith("time to 0.800: when test accuracy first reached 0.800") and "virtual clock units"
               in line for line in lines)
    assert any(line.startswith("* the run did not reach its own stop") for line in lines)
