"""The benchmarks' one timing rule: the median wall seconds of a call over repeats, after one warm-up call."""

from __future__ import annotations

import statistics
import time


def median_seconds(run, repeats: int) -> float:
    """Median wall seconds of ``run()`` over ``repeats`` calls after one warm-up call (caches, allocators)."""
    run()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)
