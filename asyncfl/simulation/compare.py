"""Compare several run folders: one table, one accuracy-vs-time plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def load_run(folder: Path) -> tuple[dict, list[dict]]:
    """``(summary, metric rows)`` of one run folder; a clear error if it is not one."""
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.csv"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{folder} is not an asyncfl run folder (no metrics.csv)")
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    with open(metrics_path, newline="") as handle:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]
    return summary, rows


def first_time_at(rows: list[dict], target: float) -> float | None:
    """First time at which accuracy reached ``target``."""
    return next((row["time"] for row in rows if row["accuracy"] >= target), None)


def compare_runs(folders: list[Path], plot_path: Path, target: float | None = None) -> str:
    """Draw all curves into ``plot_path`` and return a plain-text table.

    ``target`` defaults to 95% of the lowest best accuracy among the runs, a
    level every run reached, so time-to-target is defined for all of them.
    """
    runs = [(folder, *load_run(folder)) for folder in folders]
    if target is None:
        target = 0.95 * min(max((r["accuracy"] for r in rows), default=0.0) for _, _, rows in runs)
    header = f"{'run':<32} {'strategy':<9} {'final':>6} {'best':>6} {'t@' + format(target, '.3f'):>9} {'arrivals':>8} {'tau-mean':>8} {'ms/arr':>7}"
    lines = [header, "-" * len(header)]
    for folder, summary, rows in runs:
        reached = first_time_at(rows, target)
        lines.append(
            f"{folder.name[:32]:<32} {summary.get('strategy', '?'):<9} {rows[-1]['accuracy']:>6.3f} "
            f"{max(r['accuracy'] for r in rows):>6.3f} {('%.2f' % reached) if reached is not None else '-':>9} "
            f"{int(rows[-1]['arrivals']):>8} {summary.get('staleness-mean', float('nan')):>8.2f} "
            f"{summary.get('server-ms-per-arrival', float('nan')):>7.2f}"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for folder, summary, rows in runs:
        ax.plot([r["time"] for r in rows], [r["accuracy"] for r in rows], label=f"{folder.name} ({summary.get('strategy', '?')})")
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("virtual time")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(plot_path, dpi=110)
    plt.close(fig)
    lines.append(f"plot: {plot_path}")
    return "\n".join(lines)
