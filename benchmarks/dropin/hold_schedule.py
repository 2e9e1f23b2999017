"""What ``dispatch_hold`` costs in time: the virtual schedule of the advanced example's shape, held or not.

On the virtual clock the schedule (which client runs when, which version it starts from, when it
lands) depends on the delay model, the seed and the buffer's counts, never on the model, so a
ClientApp that returns the received model unchanged gives the real runs' schedule exactly, in a
second. For each delay preset and hold, FedBuff with its defaults runs 10 rounds of 12 updates (50
nodes, ``fraction_train = 0.25``: the advanced example's shape) on seeds 1-5; printed per seed: the
virtual time of the last update, the held dispatches and the mean staleness.

Usage::

    .venv/bin/python benchmarks/dropin/hold_schedule.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HOLDS = (0.0, 0.1, 0.25, 0.5)
DELAYS = ("uniform-speed", "quarter-slow")
SEEDS = (1, 2, 3, 4, 5)


def echo(msg, context):
    """A ClientApp stand-in: a train request is answered with the model it carried (only the schedule counts)."""
    from flwr.app import Message, MetricRecord, RecordDict

    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


def schedule(delays: str, hold: float, seed: int) -> tuple[float, int, float]:
    """(virtual time of the last update, held dispatches, mean staleness) of one run."""
    import numpy as np
    from flwr.app import Array, ArrayRecord

    import asyncfl
    from asyncfl.simulation.inprocess import InProcessGrid

    result = asyncfl.FedBuff(fraction_train=0.25, fraction_evaluate=0.0).start(
        InProcessGrid(echo, 50, {}), ArrayRecord({"w": Array(np.zeros(2, np.float32))}), num_rounds=10,
        clock="virtual", delay_model=delays, seed=seed, dispatch_hold=hold)
    summary = result.summary
    return summary["final-time"], summary.get("held-dispatches", 0), summary["staleness-mean"]


def main() -> None:
    print("| delays | dispatch_hold | time to 120 updates (mean; per seed) | held dispatches | staleness |")
    print("|---|---|---|---|---|")
    for delays in DELAYS:
        for hold in HOLDS:
            runs = [schedule(delays, hold, seed) for seed in SEEDS]
            times = [r[0] for r in runs]
            print(f"| {delays} | {hold:g} | {statistics.mean(times):.2f} ({' / '.join(f'{t:.1f}' for t in times)}) "
                  f"| {statistics.mean(r[1] for r in runs):.1f} | {statistics.mean(r[2] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
