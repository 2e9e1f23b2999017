"""Compare several run folders: one table, one accuracy-vs-time plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

#: What the ``ended`` column says of a run that did not stop by one of its own stops.
UNFINISHED = {"interrupted": "interrupted*", "running": "unfinished*", "exited": "interrupted*"}
#: Each clock's time unit, for the time-to-target column and the plot's axis.
CLOCK_UNITS = {"virtual": "virtual clock units", "wall": "wall-clock seconds"}


def load_run(folder: Path) -> tuple[dict, list[dict]]:
    """``(summary, metric rows)`` of one run folder; a clear error if it is not one."""
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.csv"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{folder} is not an asyncfl run folder (no metrics.csv)")
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    with open(metrics_path, newline="") as handle:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]
    return summary, rows


def run_clock(folder: Path) -> str | None:
    """The run's clock (``"virtual"`` or ``"wall"``) from its ``config.json``; None when it does not say."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    settings = config.get("engine") or config.get("options")  # a gossip run's config.json holds its options only
    return settings.get("clock") if isinstance(settings, dict) else None


def how_it_ended(summary: dict) -> str:
    """``done`` for a run that reached one of its stops, else what stopped it, starred (``interrupted*``,
    ``unfinished*`` for a run killed outright or still going, ``error*``); ``?`` for a summary that does not say."""
    reason = summary.get("stop-reason")
    if summary.get("finished") or (reason or "").endswith(" reached"):
        return "done"
    if reason is None:
        return "?"
    first = reason.split(" ", 1)[0].rstrip(":")
    return UNFINISHED.get(first, "error*")


def first_time_at(rows: list[dict], target: float) -> float | None:
    """First time at which accuracy reached ``target``."""
    return next((row["time"] for row in rows if row["accuracy"] >= target), None)


def compare_runs(folders: list[Path], plot_path: Path, target: float | None = None) -> str:
    """Draw all curves into ``plot_path`` and return a plain-text table, with a line saying what its columns mean.

    ``target`` defaults to 95% of the lowest best accuracy among the runs, a
    level every run reached, so time-to-target is defined for all of them.
    A run that did not reach one of its own stops (interrupted, killed, failed) is starred
    in the ``ended`` column: its final figures are where it stopped.
    """
    runs = [(folder, *load_run(folder)) for folder in folders]
    default_target = target is None
    if default_target:
        target = 0.95 * min(max((r["accuracy"] for r in rows), default=0.0) for _, _, rows in runs)
    clocks = {run_clock(folder) for folder, _, _ in runs}
    unit = CLOCK_UNITS.get(next(iter(clocks)), "clock time") if len(clocks) == 1 else "each run's clock"
    reach = f"time to {target:.3f}"
    header = (f"{'run':<32} {'strategy':<9} {'final':>6} {'best':>6} {reach:>13} {'arrivals':>8} {'tau-mean':>8} "
              f"{'ms/arr':>7} {'ended':<12}")
    lines = [header.rstrip(), "-" * len(header.rstrip())]
    ended = []
    for folder, summary, rows in runs:
        reached = first_time_at(rows, target)
        ended.append(how_it_ended(summary))
        lines.append(
            f"{folder.name[:32]:<32} {summary.get('strategy', '?'):<9} {rows[-1]['accuracy']:>6.3f} "
            f"{max(r['accuracy'] for r in rows):>6.3f} {('%.2f' % reached) if reached is not None else '-':>13} "
            f"{int(rows[-1]['arrivals']):>8} {summary.get('staleness-mean', float('nan')):>8.2f} "
            f"{summary.get('server-ms-per-arrival', float('nan')):>7.2f} {ended[-1]}"
        )
    lines += _footnotes(target, default_target, unit, clocks, ended)
    _plot(runs, target, unit, plot_path)
    lines.append(f"plot: {plot_path}")
    return "\n".join(lines)


def _footnotes(target: float, default_target: bool, unit: str, clocks: set, ended: list[str]) -> list[str]:
    """What the time-to-target column means, and the star of unfinished runs."""
    why = " (95% of the lowest best accuracy among these runs)" if default_target else ""
    mixed = "; these runs use different clocks: their times do not compare" if len(clocks) > 1 else ""
    notes = [f"time to {target:.3f}: when test accuracy first reached {target:.3f}{why}, in {unit}; "
             f"- = never{mixed}"]
    if any(e.endswith("*") for e in ended):
        notes.append("* the run did not reach its own stop (num-rounds, max-arrivals, max-time): its final figures "
                     "are where it was stopped, not comparable with finished runs")
    return notes


def _plot(runs: list, target: float, unit: str, plot_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for folder, summary, rows in runs:
        mark = "" if how_it_ended(summary) in ("done", "?") else ", unfinished"
        ax.plot([r["time"] for r in rows], [r["accuracy"] for r in rows],
                label=f"{folder.name} ({summary.get('strategy', '?')}{mark})")
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(unit)
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(plot_path, dpi=110)
    plt.close(fig)
