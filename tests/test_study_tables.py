"""The study runner's tables (benchmarks/matrix.py): a tuning grid's choice and failed cells, on hand-made runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _matrix():
    return load_script("benchmarks/matrix.py", "study_matrix")


def _run(runs_dir: Path, name: str, accuracies: list[float]) -> None:
    folder = runs_dir / name
    folder.mkdir(parents=True)
    rows = ["time,accuracy"] + [f"{i + 1}.0,{a}" for i, a in enumerate(accuracies)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "summary.json").write_text(json.dumps({"wall-seconds": 1.0, "server-ms-per-arrival": 0.5}))


def test_the_grid_picks_each_familys_highest_final_accuracy_and_failed_cells_say_so(tmp_path):
    matrix = _matrix()
    study = matrix.Study(name="grid", supernodes=2, common={}, scenarios={"s": {}}, seeds=(4,), targets=(0.5,),
                         methods={"a-l1": {}, "a-l2": {}, "b-l1": {}, "b-l2": {}}, grid_families=("a", "b"))
    _run(tmp_path, "a-l1__s__s4", [0.9, 0.2, 0.2, 0.2])  # best 0.9 but final (last 3) 0.2
    _run(tmp_path, "a-l2__s__s4", [0.1, 0.5, 0.6, 0.7])  # final 0.6
    _run(tmp_path, "b-l1__s__s4", [0.3, 0.3, 0.3])
    (tmp_path / "b-l2__s__s4.log").write_text("ClientAppsFailing")  # a run that never finished

    lines = matrix.grid_best_lines(study, tmp_path)

    assert "- a: a-l2 (60.0 %; next best 20.0 %; 2 grid points run)" in lines
    assert "- b: b-l1 (30.0 %; next best nan %; 1 grid points run)" in lines
    root = tmp_path / "root"
    (root / "benchmarks" / "grid").mkdir(parents=True)
    (root / "benchmarks" / "grid" / "runs").symlink_to(tmp_path)
    matrix.ROOT = root  # the module's own copy, loaded for this test
    text = matrix.table(study)
    assert "| b-l2 | no result (1 failed or running; log kept) |" in text
    assert "| a-l2 | 60.0 ± 0.0 / 70.0 ± 0.0 / 2 (1/1) |" in text


def _class_run(runs_dir: Path, name: str, class_accuracies: list[float], summary: dict) -> None:
    folder = runs_dir / name
    folder.mkdir(parents=True)
    rows = ["time,accuracy,acc_class_5"] + [f"{i + 1}.0,0.8,{a}" for i, a in enumerate(class_accuracies)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "summary.json").write_text(json.dumps({"wall-seconds": 1.0, "server-ms-per-arrival": 0.5, **summary}))


def test_the_stale_window_averages_the_affected_class_after_its_start_and_gi_runs_list_their_figures(tmp_path):
    matrix = _matrix()
    study = matrix.Study(name="gi", supernodes=2, common={}, scenarios={"s": {}}, seeds=(1, 2), targets=(0.5,),
                         methods={"u": {}, "gi": {}}, affected_class=5, stale_window_start=2.0)
    _class_run(tmp_path, "u__s__s1", [0.9, 0.9, 0.2, 0.4], {})  # after t = 2: rounds 3 and 4 -> 0.3
    _class_run(tmp_path, "u__s__s2", [0.9, 0.9, 0.4, 0.6], {})  # -> 0.5
    gi = {"gi-inversions": 7, "gi-warm-starts": 5, "gi-seconds-per-inversion": 12.25, "gi-not-unique": 2,
          "gi-after-switch": 0, "gi-disparity-ratio-mean": 0.21, "gi-error-comparisons": 3, "gi-e1-mean": 1.5,
          "gi-e2-mean": 2.0, "gi-switch-version": None}
    _class_run(tmp_path, "gi__s__s1", [0.0, 0.0, 0.6, 0.6], gi)

    window = matrix.stale_window_lines(study, tmp_path, matrix.table_rows(study))
    figures = matrix.gi_lines(tmp_path, matrix.table_rows(study))

    assert "| u | 40.0 ± 14.1 [30.0, 50.0] |" in window
    assert "| gi | 60.0 ± 0.0 [60.0] |" in window
    assert figures[-1] == ("- gi__s__s1: 7 inversions (5 warm, 12.2 s each), raw: 2 not unique, 0 after the switch; "
                           "disparity at 0.21 of its start; 3 comparisons; mean E1 1.5 vs E2 2; never switched back")


def test_the_affected_class_is_paired_by_seed_with_a_t_interval(tmp_path):
    matrix = _matrix()
    study = matrix.Study(name="gi", supernodes=2, common={}, scenarios={"s": {}}, seeds=(1, 2), targets=(0.5,),
                         methods={"u": {}, "gi": {}}, affected_class=5, stale_window_start=2.0, final_window=2,
                         paired_against=("u",))
    _class_run(tmp_path, "u__s__s1", [0.9, 0.9, 0.2, 0.4], {})  # last 2: 0.3
    _class_run(tmp_path, "u__s__s2", [0.9, 0.9, 0.4, 0.6], {})  # last 2: 0.5
    _class_run(tmp_path, "gi__s__s1", [0.0, 0.0, 0.3, 0.5], {})  # +10 points
    _class_run(tmp_path, "gi__s__s2", [0.0, 0.0, 0.7, 0.7], {})  # +20 points
    _class_run(tmp_path, "gi__s__s3", [0.0, 0.0, 0.9, 0.9], {})  # no seed-3 reference: not paired

    lines = matrix.paired_lines(study, tmp_path, matrix.table_rows(study))

    # mean +15, sd 7.07, t(0.975, 1) = 12.706: half-width 12.706 x 7.07 / sqrt(2) = 63.5
    assert lines[-1] == "| gi | u | s | 1,2 | +15.0 ± 63.5 (+10.0 / +20.0) | +15.0 ± 63.5 (+10.0 / +20.0) |"


def test_mean_curve_averages_runs_at_each_time_after_smoothing_each_run(tmp_path):
    matrix = _matrix()
    _class_run(tmp_path, "a__s__s1", [0.0, 0.2, 0.4], {})
    _class_run(tmp_path, "a__s__s2", [0.2, 0.4], {})  # a shorter run: the common prefix is two evaluations

    times, mean, sd = matrix.mean_curve([tmp_path / "a__s__s1", tmp_path / "a__s__s2"], "acc_class_5", smooth=2)

    assert times == [1.0, 2.0]
    # smoothed runs: s1 [0.0, 0.1], s2 [0.2, 0.3] -> means [0.1, 0.2], sd sqrt(0.02) each
    assert mean == pytest.approx([0.1, 0.2]) and sd == pytest.approx([0.02 ** 0.5] * 2)


@pytest.mark.parametrize("name", ["fedadt-fmnist-paper", "fedecho-fmnist-paper", "fedrevive-fmnist-lag",
                                  "fedecho-fmnist-settings-tune", "fedecho-fmnist-settings", "pushcen-fmnist-paper"])
def test_every_cell_of_the_paper_regime_studies_is_a_valid_run_of_its_own_strategy(name, monkeypatch):
    from flwr.common.config import flatten_dict, get_project_config

    from asyncfl import config as config_module
    from asyncfl.config import foreign_settings, parse_run_config

    monkeypatch.setattr(config_module, "check_files", lambda *args: None)  # Fashion-MNIST need not be installed
    matrix = _matrix()
    def untuned(config: dict) -> dict:  # a tuned row: its grid's first row of the family stands in
        if matrix.TUNED_KEY not in config:
            return config
        grid_name, family = config[matrix.TUNED_KEY].split("/")
        first = next(c for m, c in matrix.STUDIES[grid_name].methods.items() if m.startswith(family + "-"))
        return {**first, **{k: v for k, v in config.items() if k != matrix.TUNED_KEY}}

    study = dataclasses.replace(matrix.STUDIES[name], methods={m: untuned(c) for m, c in matrix.STUDIES[name].methods.items()},
                                extra={n: untuned(c) for n, c in matrix.STUDIES[name].extra.items()})
    defaults = flatten_dict(get_project_config(ROOT)["tool"]["flwr"]["app"]["config"])
    for cell, overrides, seed in matrix.cells(study):
        config = {**overrides, "seed": seed}
        for key in foreign_settings(config, config["strategy"]):
            del config[key]
        assert set(config) <= set(defaults), f"{cell}: unknown keys {set(config) - set(defaults)}"
        parsed = parse_run_config({**defaults, **config})
        assert parsed.strategy == config["strategy"]
        assert parsed.options.concurrency == overrides.get("concurrency", parsed.options.concurrency)


def test_the_comparison_takes_each_methods_settings_from_its_grids_stored_runs():
    # The FedEcho comparison's methods come from fedecho-fmnist-tune's best points (its stored runs): the values
    # the comparison ran with (benchmarks/fedecho-fmnist/README.md)
    matrix = _matrix()
    study = matrix.resolve_tuned(matrix.STUDIES["fedecho-fmnist"])
    assert study.methods["fedbuff"] == {"strategy": "fedbuff", "lr": 0.1, "fedbuff.server-lr": 0.5}
    assert study.methods["ca2fl"] == {"strategy": "ca2fl", "lr": 0.3, "ca2fl.server-lr": 0.5}
    assert study.methods["fadas"] == {"strategy": "fadas", "lr": 0.3, "fadas.server-lr": 0.01}
    assert study.methods["fedecho-no-kd"] == {"strategy": "fedecho", "lr": 0.1, "fedecho.server-lr": 0.5,
                                              "fedecho.distill-steps": 0}
    assert study.extra["fedbuff-g1__large-dir0.1"]["fedbuff.server-lr"] == 1.0  # an override of the tuned point


def test_the_paper_settings_comparison_takes_the_complete_grids_picks():
    # fedecho-fmnist-settings runs each method at its best point of fedecho-fmnist-settings-tune's 40 stored runs
    # (benchmarks/fedecho-fmnist-settings-tune/README.md): FedEcho's variants and Table 7's alphas on FedEcho's
    matrix = _matrix()
    study = matrix.resolve_tuned(matrix.STUDIES["fedecho-fmnist-settings"])
    picks = {m: (study.methods[m]["lr"], study.methods[m][f"{m}.server-lr"])
             for m in ("fedbuff", "ca2fl", "fedecho", "fadas")}
    assert picks == {"fedbuff": (0.3, 0.25), "ca2fl": (0.1, 0.25), "fedecho": (0.1, 0.25), "fadas": (0.1, 0.001)}
    assert study.methods["fedecho-no-kd"]["fedecho.distill-steps"] == 0
    assert study.methods["fedecho-move0.5"]["lr"] == 0.1
    assert study.extra["fedecho-alpha0__large-dir0.1"]["fedecho.alpha-max"] == 0.0
    assert study.extra["fedbuff-l0.1-g0.25__large-dir0.1"]["fedbuff.server-lr"] == 0.25


def test_a_study_whose_grid_has_not_run_says_so(tmp_path, monkeypatch):
    matrix = _matrix()
    monkeypatch.setattr(matrix, "ROOT", tmp_path)  # no stored runs at all
    with pytest.raises(SystemExit, match="run `matrix.py fedecho-fmnist-tune` first"):
        matrix.resolve_tuned(matrix.STUDIES["fedecho-fmnist"])


def test_a_comparison_waits_for_every_row_of_its_grid_and_counts_a_diverged_row_as_run(tmp_path, monkeypatch):
    import re
    import shutil

    matrix = _matrix()
    monkeypatch.setattr(matrix, "ROOT", tmp_path)
    grid = matrix.STUDIES["fedecho-fmnist-settings-tune"]
    runs = tmp_path / "benchmarks" / grid.name / "runs"
    rows = [m for m in grid.methods if m.startswith("fedbuff-")]
    assert set(grid.diverged) & set(rows)
    for i, row in enumerate(rows):
        if row not in grid.diverged:  # a finished run whose final accuracy grows with the row's position
            folder = runs / f"{row}__large-dir0.1__s4"
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text("{}")
            (folder / "metrics.csv").write_text("time,accuracy\n" + "".join(f"{t},{0.5 + 0.01 * i}\n" for t in range(3)))
    study = dataclasses.replace(matrix.STUDIES["fedecho-fmnist-settings"],
                                methods={"fedbuff": matrix.tuned(grid.name, "fedbuff")}, extra={})
    best = [row for row in rows if row not in grid.diverged][-1]
    assert matrix.resolve_tuned(study).methods["fedbuff"] == grid.methods[best]
    shutil.rmtree(runs / f"{rows[0]}__large-dir0.1__s4")  # a row still to run: no best point yet
    with pytest.raises(SystemExit, match=re.escape(f"has not finished 1 of fedbuff's rows ({rows[0]})")):
        matrix.resolve_tuned(study)


def _wall_clock():
    return load_script("benchmarks/dropin/wall_clock.py", "wall_clock")


@pytest.mark.parametrize("example", ["quickstart-pytorch", "advanced-pytorch"])
def test_the_wall_clock_study_swaps_only_the_strategy_of_each_shipped_example(example, tmp_path):
    import ast

    wall_clock = _wall_clock()
    module = wall_clock.EXAMPLES[example][0]
    source = (ROOT / "examples" / example / module).read_text()
    out = tmp_path / "accuracy.json"
    fedavg = wall_clock.swapped(source, "flower-fedavg", out)
    fedasync = wall_clock.swapped(source, "fedasync", out)
    fedbuff = wall_clock.swapped(source, "fedbuff", out)
    for swapped in (fedavg, fedasync, fedbuff):
        ast.parse(swapped)  # still Python
        assert swapped.rstrip().endswith("result.evaluate_metrics_serverapp.items()}))") and str(out) in swapped
    assert "from flwr.serverapp.strategy import FedAvg as FedBuff" in fedavg and "callbacks=" not in fedavg
    assert "FedAsync as FedBuff" in fedasync and "from asyncfl import" in fedasync
    # FedBuff's run is the example as shipped, plus the accuracy line
    assert fedbuff.startswith(source.rstrip("\n"))
    with pytest.raises(SystemExit, match="valid: flower-fedavg, fedbuff, fedasync"):
        wall_clock.swapped(source, "fedprox", out)
    # run options go into asyncfl's start() only
    assert "strategy.start(concurrency=4, " in wall_clock.swapped(source, "fedbuff", out, "concurrency=4")
    with pytest.raises(SystemExit, match="Flower's FedAvg.start"):
        wall_clock.swapped(source, "flower-fedavg", out, "concurrency=4")
    # the shipped ClientApp carries the report_train_seconds mod; the cells before it ran without
    client = (ROOT / "examples" / example / module).with_name("client_app.py").read_text()
    assert wall_clock.MOD.search(client) and not wall_clock.MOD.search(wall_clock.without_mod(client))
    ast.parse(wall_clock.without_mod(client))


def _partial_runs():
    return load_script("benchmarks/partial_runs.py", "partial_runs")


def test_runs_stopped_early_are_compared_at_a_time_each_reached_and_paired_by_seed(tmp_path):
    # Prepare: an ablation and an arm over two seeds; the arm's seed 2 stopped at t=2
    partial = _partial_runs()
    runs = tmp_path / "runs"
    _run(runs, "base__x__s1", [0.1, 0.2, 0.3, 0.4])
    _run(runs, "base__x__s2", [0.2, 0.2, 0.5, 0.5])
    _run(runs, "arm__x__s1", [0.3, 0.3, 0.6, 0.9])
    _run(runs, "arm__x__s2", [0.4, 0.6])
    for name in ("base__x__s1", "base__x__s2", "arm__x__s1", "arm__x__s2"):
        (runs / name / "summary.json").write_text(json.dumps({"arrivals": 10}))
    # Execute
    text = partial.table(tmp_path, [2.0, 4.0], "base", window=2)
    # Assert: at t=2 the mean of the last 2 evaluations; at t=4 seed 2 of the arm has no value and no pair
    arm = next(line for line in text.splitlines() if line.startswith("| arm | 1,2"))
    cells = [c.strip() for c in arm.strip("|").split("|")]
    assert cells[2] == "30.0 / 50.0"  # (0.3+0.3)/2, (0.4+0.6)/2
    assert cells[3] == "75.0"  # seed 1: (0.6+0.9)/2
    assert cells[4] == "+22.5 (+15.0 / +30.0)"  # vs base (0.15, 0.2)
    assert cells[5] == "+40.0 (+40.0)"  # vs base (0.35)
    assert cells[6] == "4 (10) / 2 (10)"
    with pytest.raises(SystemExit, match="no runs of 'other'"):
        partial.table(tmp_path, [2.0], "other", window=2)


def test_the_adversaries_readme_carries_the_drill_tables_as_the_stored_cells_give_them():
    table = load_script("benchmarks/adversaries/table.py", "adversaries_table").render()
    readme = (ROOT / "benchmarks" / "adversaries" / "README.md").read_text()
    assert table.rstrip("\n") in readme, "run .venv/bin/python benchmarks/adversaries/table.py and copy its tables"
    assert (ROOT / "benchmarks" / "adversaries" / "quickstart.md").read_text() == table


@pytest.mark.parametrize("folder", ["advanced-6-out-diagnosis", "advanced-6-out"])
def test_the_drop_in_readme_holds_the_6_out_tables_its_cells_give(folder):
    # the advanced example at 6 jobs out: the README's tables (final accuracy, and that of the mean of the last rounds'
    # models) are what the stored cells give today
    study = load_script("benchmarks/dropin/advanced_example.py", "advanced_example")
    rows = study.load(ROOT / "benchmarks" / "dropin" / folder / "cells.jsonl")
    readme = (ROOT / "benchmarks" / "dropin" / "README.md").read_text()
    assert rows and study.table(rows) in readme
    tails = study.tail_table(rows)
    assert "mean of 3 rounds" in tails and tails in readme
