"""Results of a run, written as they come: config.json, metrics.csv, summary.json, accuracy.png.

``metrics.csv`` holds only clock-derived columns, so two runs with the same
seed produce byte-identical files; wall-clock figures go to ``timing.csv`` and
``summary.json``.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path

import numpy as np

from asyncfl.errors import CheckpointError
from asyncfl.server_app.run_folder import append_csv, start_csv, write_json

log = logging.getLogger("asyncfl.recorder")

METRIC_COLUMNS = ["time", "server_version", "arrivals", "rejected", "accuracy", "loss"]


def time_to_targets(rows: list[dict], targets: tuple[float, ...]) -> dict[str, float | None]:
    """First clock time at which accuracy reached each target (``None`` if never)."""
    out: dict[str, float | None] = {}
    for target in targets:
        out[f"{target:g}"] = next((row["time"] for row in rows if row["accuracy"] >= target), None)
    return out


def staleness_histogram(staleness: list[int]) -> dict[str, int]:
    """``{tau: count}`` with string keys (JSON)."""
    values, counts = np.unique(np.asarray(staleness, dtype=np.int64), return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


class RunRecorder:
    """Writes a run's folder incrementally and draws a progress line."""

    def __init__(self, folder: Path, config: dict, targets: tuple[float, ...], progress: bool,
                 max_arrivals: int, max_time: float, plot_every_s: float = 20.0, num_classes: int | None = None,
                 resuming: bool = False, clock: str = "virtual") -> None:
        self.folder = folder
        self.clock = clock  # "virtual" or "wall": what the progress line's t= is
        self.folder.mkdir(parents=True, exist_ok=True)
        self.targets = targets
        self.progress = progress
        self.max_arrivals = max_arrivals
        self.max_time = max_time
        self.rows: list[dict] = []
        # per-class columns: as many as the evaluator reports (None: taken from the first evaluation row)
        self.class_columns: list[str] | None = None if num_classes is None else self._class_columns(num_classes)
        self.wall_start = time.monotonic()
        self._last_progress = 0.0
        self._last_plot = time.monotonic()
        self._plot_every_s = plot_every_s
        #: Set by the ServerApp: builds the current summary, rewritten after every evaluation.
        self.summary_source = None
        if resuming:  # the folder's files are the run's so far: load_state_dict cuts them back to the checkpoint
            return
        write_json(folder / "config.json", config)
        if self.class_columns is not None:
            self._write_headers()

    def state_dict(self) -> dict:
        """The rows written so far (a checkpoint's part)."""
        return {"rows": [dict(r) for r in self.rows], "class_columns": self.class_columns}

    def load_state_dict(self, state: dict) -> None:
        """Continue a run from a checkpoint: its rows, and ``metrics.csv`` / ``timing.csv`` cut back to them
        (rows written after the checkpoint are written again, identically on the virtual clock)."""
        self.rows = [dict(r) for r in state["rows"]]
        self.class_columns = state["class_columns"]
        if self.class_columns is None:  # nothing was scored before the checkpoint
            return
        if not all((self.folder / name).exists() for name in ("metrics.csv", "timing.csv")):
            raise CheckpointError(f"{self.folder} lacks metrics.csv or timing.csv: resume into the run folder the "
                                  "checkpoint was written in")
        for name in ("metrics.csv", "timing.csv"):
            path = self.folder / name
            lines = path.read_bytes().splitlines(keepends=True)  # bytes: csv's \r\n line ends stay as written
            path.write_bytes(b"".join(lines[: 1 + len(self.rows)]))

    @staticmethod
    def _class_columns(num_classes: int) -> list[str]:
        return [f"acc_class_{k}" for k in range(num_classes)]

    def _write_headers(self) -> None:
        start_csv(self.folder / "metrics.csv", METRIC_COLUMNS + self.class_columns)
        start_csv(self.folder / "timing.csv", ["time", "arrivals", "wall_seconds"])

    def on_evaluation(self, row: dict) -> None:
        if self.class_columns is None:
            self.class_columns = self._class_columns(len(row.get("class_accuracy") or []))
            self._write_headers()
        self.rows.append(row)
        per_class = row.get("class_accuracy") or [""] * len(self.class_columns)
        append_csv(self.folder / "metrics.csv", [row[c] for c in METRIC_COLUMNS] + list(per_class[: len(self.class_columns)]))
        append_csv(self.folder / "timing.csv", [row["time"], row["arrivals"], round(time.monotonic() - self.wall_start, 3)])
        log.info("t=%.2f version=%d arrivals=%d accuracy=%.4f loss=%.4f", row["time"], row["server_version"],
                 row["arrivals"], row["accuracy"], row["loss"])
        if self.summary_source is not None:
            self.write_summary(self.summary_source())
        if time.monotonic() - self._last_plot > self._plot_every_s:
            self.plot()

    def on_progress(self, clock: float, arrivals: int) -> None:
        if not self.progress or time.monotonic() - self._last_progress < 2.0:
            return
        self._last_progress = time.monotonic()
        fraction = max(arrivals / self.max_arrivals if self.max_arrivals else 0.0,
                       clock / self.max_time if self.max_time else 0.0)
        filled = int(round(min(fraction, 1.0) * 30))
        best = max((r["accuracy"] for r in self.rows), default=0.0)
        when = f"wall t={clock:.1f}s" if self.clock == "wall" else f"virtual t={clock:.1f}"
        log.info("[%s%s] %3.0f%% | %s | arrivals=%d | best acc=%.3f | %.0fs", "#" * filled, "." * (30 - filled),
                 100 * min(fraction, 1.0), when, arrivals, best, time.monotonic() - self.wall_start)

    def write_clients(self, by_client: dict[int, list[float]]) -> None:
        """``clients.csv``: per client, accepted arrivals, mean staleness and mean round trip (wall seconds)."""
        with open(self.folder / "clients.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["client", "arrivals", "staleness_mean", "round_trip_s_mean"])
            for client, (arrivals, staleness, round_trip, trips) in sorted(by_client.items()):
                writer.writerow([client, int(arrivals), round(staleness / arrivals, 4) if arrivals else "",
                                 round(round_trip / trips, 4) if trips else ""])

    def write_summary(self, summary: dict) -> None:
        """Write ``summary.json`` (atomically, so a reader never sees half a file)."""
        write_json(self.folder / "summary.json", summary)

    def plot(self) -> None:
        """Draw accuracy vs. clock time into ``accuracy.png``."""
        self._last_plot = time.monotonic()
        if not self.rows:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["time"] for r in self.rows], [r["accuracy"] for r in self.rows], marker=".")
        ax.set_xlabel("wall-clock time (s)" if self.clock == "wall" else "virtual time (the delay model's units)")
        ax.set_ylabel("test accuracy")
        ax.set_title(self.folder.name)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.folder / "accuracy.png", dpi=100)
        plt.close(fig)

    def summary(self, strategy: str, stats, versions: int, extra: dict, clock: float) -> dict:
        """The summary.json contents from the engine's counters."""
        return run_summary(strategy, stats, versions, extra, clock, self.rows, self.targets, self.wall_start)


def run_summary(strategy: str, stats, versions: int, extra: dict, clock: float, rows: list[dict],
                targets: tuple[float, ...], wall_start: float) -> dict:
    """A run's summary from the engine's counters and its evaluation ``rows`` (those with an accuracy)."""
    rows = [r for r in rows if r.get("accuracy") is not None and not np.isnan(r["accuracy"])]
    accuracies = [r["accuracy"] for r in rows]
    staleness = stats.staleness
    arrivals = max(stats.arrivals, 1)
    return {
        "strategy": strategy,
        "final-accuracy": accuracies[-1] if accuracies else None,
        "best-accuracy": max(accuracies) if accuracies else None,
        "final-loss": rows[-1]["loss"] if rows else None,
        "time-to-target": time_to_targets(rows, targets),
        "final-time": round(clock, 6),
        "arrivals": stats.arrivals,
        "dispatched": stats.dispatched,
        "server-versions": versions,
        "rejected-updates": stats.rejected_total,
        "rejected-by-reason": dict(sorted(stats.rejected.items())),
        "staleness-mean": float(np.mean(staleness)) if staleness else 0.0,
        "staleness-max": int(max(staleness)) if staleness else 0,
        "staleness-histogram": staleness_histogram(staleness) if staleness else {},
        "server-ms-per-arrival": round(1000.0 * stats.server_seconds / arrivals, 4),
        "wall-seconds": round(time.monotonic() - wall_start, 3),
        **transport_summary(stats),
        **class_summary(rows),
        **extra,
    }


def class_summary(rows: list[dict]) -> dict:
    """Per-class accuracy at the last evaluation and the best per class (when the evaluator reports it)."""
    scored = [r["class_accuracy"] for r in rows if r.get("class_accuracy")]
    if not scored:
        return {}
    table = np.asarray(scored, dtype=np.float64)
    return {"final-class-accuracy": [round(float(a), 6) for a in table[-1]],
            "best-class-accuracy": [round(float(a), 6) for a in np.nanmax(table, axis=0)]}


def affected_class_summary(rows: list[dict], affected: int) -> dict:
    """The intertwined scenario's headline: accuracy on the delayed class (final, mean of last 3, best)."""
    series = [r["class_accuracy"][affected] for r in rows if r.get("class_accuracy")]
    if not series:
        return {}
    return {"affected-class": affected, "final-affected-class-accuracy": series[-1],
            "last3-affected-class-accuracy": round(float(np.mean(series[-3:])), 6),
            "best-affected-class-accuracy": max(series)}


def transport_summary(stats) -> dict:
    """Wire and latency figures: reply size, push-to-pull round trip, and what of it the client computed.

    ``dispatch-overhead-s-mean`` = mean round trip - mean client compute: the
    time a job spends in transport, queues and process start-up.
    ``training-wall-s`` spans the first train push to the last accepted reply
    (no start-up, no discovery, no final evaluation), and
    ``accepted-per-training-s`` is the steady rate over it.
    """
    out: dict = {}
    if stats.clamped_variances:
        out["clamped-bn-variances"] = stats.clamped_variances
    if getattr(stats, "metrics_trimmed", 0):
        out["metrics-trimmed"] = stats.metrics_trimmed
    if getattr(stats, "held_dispatches", 0):
        out["held-dispatches"] = stats.held_dispatches
    if getattr(stats, "reply_pulls", 0):
        out["reply-pulls"] = stats.reply_pulls
    gap_sum, gaps = getattr(stats, "reply_miss_gap", (0.0, 0))
    if gaps:  # an upper bound on how long a reply found after a miss waited for the pull that found it
        out["reply-miss-gap-s-mean"] = round(gap_sum / gaps, 4)
    if getattr(stats, "capped_checks", 0):  # cap-in-flight acted: the mean and least cap over those checks
        out["in-flight-cap-mean"] = round(stats.in_flight_cap_sum / stats.capped_checks, 2)
        out["in-flight-cap-min"] = stats.in_flight_cap_min
    if getattr(stats, "unidentified_nodes", 0):
        out["unidentified-nodes"] = stats.unidentified_nodes
    if getattr(stats, "by_worker", None):  # simulated ClientApps on a Ray cluster: accepted replies per Ray node
        out["arrivals-by-ray-node"] = dict(sorted(stats.by_worker.items()))
    first, last = getattr(stats, "first_push_wall", None), getattr(stats, "last_arrival_wall", None)
    if first is not None and last is not None and last > first:
        out["training-wall-s"] = round(last - first, 3)
        out["accepted-per-training-s"] = round(stats.arrivals / (last - first), 4)
    if stats.reply_bytes:
        out["reply-mb-mean"] = round(float(np.mean(stats.reply_bytes)) / 2**20, 4)
    if stats.round_trip_seconds:
        out["job-round-trip-s-mean"] = round(float(np.mean(stats.round_trip_seconds)), 4)
    if stats.client_train_seconds:
        out["client-train-s-mean"] = round(float(np.mean(stats.client_train_seconds)), 4)
        if stats.round_trip_seconds:
            out["dispatch-overhead-s-mean"] = round(out["job-round-trip-s-mean"] - out["client-train-s-mean"], 4)
    return out
