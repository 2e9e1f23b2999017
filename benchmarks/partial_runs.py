"""Compare a study's runs that stopped before their horizon, at virtual times every one of them reached.

A lent machine's minutes can end runs early (``benchmarks/fedecho-fmnist-paper-cuda``); their
``metrics.csv`` rows are written as they come, so each run is complete up to its last evaluation.
Comparing last evaluations of runs stopped at different points would compare different horizons;
this compares every arm at the same virtual times instead, and pairs each arm with a reference arm
of the same seed (same data and arrival schedule).

    python benchmarks/partial_runs.py benchmarks/fedecho-fmnist-paper-cuda --at 100 140 --against fedecho-no-kd

Accuracy at ``T`` is the mean of the last ``--window`` evaluations at or before ``T`` (the studies'
"final"), so a single evaluation's swing counts for a third.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def accuracy_by_time(run: Path) -> dict[float, float]:
    """Virtual time -> server-side accuracy, from the run's ``metrics.csv``."""
    with open(run / "metrics.csv", newline="") as handle:
        return {float(row["time"]): float(row["accuracy"]) for row in csv.DictReader(handle)}


def accuracy_at(series: dict[float, float], time: float, window: int) -> float | None:
    """Mean of the last ``window`` evaluations at or before ``time``; None where the run stopped earlier."""
    if max(series) < time:
        return None
    values = [series[t] for t in sorted(series) if t <= time][-window:]
    return statistics.fmean(values)


def split_name(run: Path) -> tuple[str, int]:
    """``<arm>__<scenario>__s<seed>`` -> (``<arm>__<scenario>``, seed)."""
    cell, seed = run.name.rsplit("__s", 1)
    return cell, int(seed)


def table(study: Path, times: list[float], against: str, window: int) -> str:
    runs = sorted(p for p in (study / "runs").iterdir() if p.is_dir() and (p / "metrics.csv").exists())
    cells: dict[str, dict[int, Path]] = {}
    for run in runs:
        cell, seed = split_name(run)
        cells.setdefault(cell, {})[seed] = run
    reference = next((c for c in cells if c.split("__")[0] == against), None)
    if reference is None:
        raise SystemExit(f"no runs of {against!r} in {study}/runs; arms there: "
                         f"{', '.join(sorted({c.split('__')[0] for c in cells}))}")
    series = {run: accuracy_by_time(run) for run in runs}
    header = ["arm", "seeds"] + [f"acc % at t={t:g}" for t in times] + [f"vs {against} at t={t:g}" for t in times]
    header += ["last t (arrivals)", "ensemble vs global on U %"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in sorted(cells, key=lambda c: (c != reference, c)):
        seeds = sorted(cells[cell])
        row = [cell.split("__")[0], ",".join(map(str, seeds))]
        diffs = []
        for t in times:
            values = [accuracy_at(series[cells[cell][s]], t, window) for s in seeds]
            shown = [f"{100 * v:.1f}" for v in values if v is not None]
            row.append(" / ".join(shown) if shown else "-")
            pairs = [100 * (v - r) for s, v in zip(seeds, values)
                     if v is not None and s in cells[reference]
                     and (r := accuracy_at(series[cells[reference][s]], t, window)) is not None]
            diffs.append(f"{statistics.fmean(pairs):+.1f} ({' / '.join(f'{d:+.1f}' for d in pairs)})"
                         if pairs and cell != reference else "-")
        row += diffs
        ends = []
        teacher = []
        for s in seeds:
            summary = json.loads((cells[cell][s] / "summary.json").read_text())
            ends.append(f"{max(series[cells[cell][s]]):g} ({summary['arrivals']})")
            if "teacher-accuracy-on-u" in summary:
                teacher.append(f"{100 * summary['teacher-accuracy-on-u']:.1f} vs "
                               f"{100 * summary['global-accuracy-on-u']:.1f}")
        row += [" / ".join(ends), " / ".join(teacher) or "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a study folder holding runs/")
    parser.add_argument("--at", type=float, nargs="+", required=True, help="virtual times to compare at")
    parser.add_argument("--against", required=True, help="the reference arm for the paired differences")
    parser.add_argument("--window", type=int, default=3, help="evaluations averaged (default 3)")
    args = parser.parse_args(argv)
    if not (args.study / "runs").is_dir():
        raise SystemExit(f"{args.study} has no runs/ folder; give a study folder such as "
                         "benchmarks/fedecho-fmnist-paper-cuda")
    print(table(args.study, args.at, args.against, args.window))


if __name__ == "__main__":
    main()
