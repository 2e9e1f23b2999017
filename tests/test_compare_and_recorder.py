"""The compare command and the recorder's summary helpers."""

import json

from asyncfl.cli import main
from asyncfl.server_app.recorder import staleness_histogram, time_to_targets
from asyncfl.simulation.compare import compare_runs


def _fake_run(folder, strategy, accuracies):
    folder.mkdir()
    lines = ["time,server_version,arrivals,rejected,accuracy,loss"]
    lines += [f"{i * 2.0},{i},{i * 5},0,{a},1.0" for i, a in enumerate(accuracies)]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text(json.dumps({"strategy": strategy, "staleness-mean": 1.5, "server-ms-per-arrival": 0.4}))


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
