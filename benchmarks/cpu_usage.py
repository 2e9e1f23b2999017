"""CPU seconds spent by process trees while a deployed run goes on (Linux ``/proc``).

Short-lived ClientApp processes come and go between samples, so each process's
last sampled ``utime + stime`` counts: the tail a process spends after the last
sample is missed (at most one period of it per process), which is why the
machine-wide figure from ``/proc/stat`` is reported next to it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Self

from asyncfl.deploy.processes import descendants

TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> tuple[tuple[int, str], str, float] | None:
    """``((pid, start time), command name, utime + stime seconds)``; the start time tells a reused PID apart."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return (pid, fields[19]), name, (int(fields[11]) + int(fields[12])) / TICKS


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS


class TreeCpu:
    """Samples the CPU time of named process trees every ``period`` seconds until stopped.

    Parameters
    ----------
    roots : dict[str, int]
        Name -> root PID; each tree is the root and all its descendants.
    period : float
        Seconds between samples.
    """

    def __init__(self, roots: dict[str, int], period: float = 0.25) -> None:
        self.roots, self.period = roots, period
        self._seen: dict[str, dict[tuple[int, str], float]] = {name: {} for name in roots}
        self._baseline: dict[str, dict[tuple[int, str], float]] = {}
        self._names: dict[tuple[int, str], str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the sampler writes _seen while a caller may read it mid-run
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> dict[str, dict[tuple[int, str], float]]:
        out: dict[str, dict[tuple[int, str], float]] = {}
        for name, root in self.roots.items():
            tree = {}
            for pid in [root, *descendants(root)]:
                sample = _process_cpu(pid)
                if sample is not None:
                    key, command, cpu = sample
                    tree[key] = cpu
                    self._names[key] = command
            out[name] = tree
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            sample = self._sample()
            with self._lock:
                for name, tree in sample.items():
                    self._seen[name].update(tree)
            self._stop.wait(self.period)

    def __enter__(self) -> Self:
        self._baseline = self._sample()  # CPU the long-lived processes had spent before the run
        self._busy_start = machine_busy_seconds()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.machine = machine_busy_seconds() - self._busy_start

    def seconds(self) -> dict[str, float]:
        """CPU seconds per tree during the run, and ``machine`` for all cores together."""
        out = {}
        for name, seen in self._seen.items():
            base = self._baseline.get(name, {})
            out[name] = round(sum(cpu - base.get(key, 0.0) for key, cpu in seen.items()), 1)
        out["machine"] = round(self.machine, 1)
        return out

    def seconds_by_command(self, tree: str) -> dict[str, float]:
        """CPU seconds of one tree so far, per command name (``/proc/<pid>/comm``), largest first.

        May be called while the run goes on (as of the last sample) to split a window of it.
        """
        base = self._baseline.get(tree, {})
        totals: dict[str, float] = {}
        with self._lock:
            seen = dict(self._seen[tree])
        for key, cpu in seen.items():
            name = self._names.get(key, "?")
            totals[name] = totals.get(name, 0.0) + cpu - base.get(key, 0.0)
        return {name: round(value, 1) for name, value in sorted(totals.items(), key=lambda kv: -kv[1]) if value >= 0.05}
