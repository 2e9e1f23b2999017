"""Issue 56's drills on the two small apps of the test suite, 3 seeds: the bound before and after, and Flower's own.

One node of eight attacks (tests/adversaries.py: the toy learner, where quality is 1 - distance to the target /
the start's, and softmax regression on sklearn's digits, where it is test accuracy): ``noise`` (N(0, 10^2) per
entry) and ``flip-scale`` (received - 10 x its honest update) at 1x, 3x and 10x the honest speed, ``replace`` (-3 x the model, its first reply the run's first arrival)
and ``forged-count`` (sign-flipped update claiming 10^9 examples). Rows: asyncfl's FedBuff, FedAsync and FedAvg with the
bound as it is now ("now"), the same with the server's trusted direction (``trusted_train_fn``:
tests/adversaries.TRUSTED, "trusted"; "projection": its ablation, an opposing component removed but the remainder
kept at the run's bound), as it was before issue 56 (commit d7e48de's UpdateNormBound, no count
ceiling: "before") and off ("off"); Flower 1.42's FedAvg, FedMedian and FedTrimmedAvg (synchronous: the attacker's speed
does not change their rounds). Each run is 240 client updates (Flower's: 30 rounds of 8). The bound's own cost is
timed per arrival in the clean runs. Writes results.json and table.md next to this file.

Usage: ``.venv/bin/python benchmarks/adversaries/small_apps.py`` (about 4 minutes on one core here).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from flwr.app import ConfigRecord  # noqa: E402
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg  # noqa: E402
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg  # noqa: E402

import asyncfl.server_app.participants as participants_module  # noqa: E402
from asyncfl import FedAsync, FedAvg, FedBuff  # noqa: E402
from asyncfl.simulation.inprocess import InProcessGrid  # noqa: E402
from tests.adversaries import APPS, NODES, TRUSTED, drill  # noqa: E402

BEFORE = "d7e48de"  # the last commit before issue 56's bound
DRILLS = [("", 1.0), ("noise", 1.0), ("noise", 3.0), ("noise", 10.0), ("flip-scale", 1.0), ("flip-scale", 3.0),
          ("flip-scale", 10.0), ("replace", 1.0), ("forged-count", 1.0)]
ASYNCFL = ("fedbuff", "fedasync", "fedavg")
SEEDS = (1, 2, 3)
ARRIVALS = 240
SPED = ("noise", "flip-scale")  # the drills run at several speeds
VARIANTS = ("now", "trusted", "projection", "before", "off")


class Patch:
    """monkeypatch's setattr/undo, outside pytest."""

    def __init__(self) -> None:
        self.undo: list[tuple] = []

    def setattr(self, target, name, value) -> None:
        self.undo.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def close(self) -> None:
        for target, name, value in reversed(self.undo):
            setattr(target, name, value)
        self.undo.clear()


def bound_before():
    """UpdateNormBound as commit ``BEFORE`` had it (read from git: the per-update median window)."""
    source = subprocess.run(["git", "show", f"{BEFORE}:asyncfl/server_app/update_bound.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "update_bound_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("update_bound_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UpdateNormBound


class TimedBound:
    """Wraps a bound class so that each ``apply`` is timed (seconds summed in ``TimedBound.seconds``)."""

    seconds, calls = 0.0, 0

    def __init__(self, cls) -> None:
        self.cls = cls

    def __call__(self, *args, **kwargs):
        bound = self.cls(*args, **kwargs)
        apply = bound.apply
        takes = inspect.signature(apply).parameters  # the bound before issue 56 took no weight, no tighter multiple

        def timed(arrival, weight=1.0, multiple=None):
            started = time.perf_counter()
            try:
                if "multiple" in takes:
                    return apply(arrival, weight, multiple)
                return apply(arrival, weight) if "weight" in takes else apply(arrival)
            finally:
                TimedBound.seconds += time.perf_counter() - started
                TimedBound.calls += 1

        bound.apply = timed
        if not hasattr(bound, "over_share"):  # the bound before issue 56 held no node back
            bound.over_share = lambda client: False
            bound.set_clients = lambda clients: None
        return bound


def run_asyncfl(app: str, name: str, variant: str, attack: str, speed: float, seed: int, old_bound) -> dict:
    patch = Patch()
    make = {"fedbuff": lambda: FedBuff(fraction_evaluate=0.0), "fedasync": lambda: FedAsync(fraction_evaluate=0.0),
            "fedavg": lambda: FedAvg(fraction_evaluate=0.0)}
    options = {"update_norm_bound": 0.0} if variant == "off" else {}
    if variant in ("trusted", "projection"):
        options["trusted_train_fn"] = TRUSTED[app]
    TimedBound.seconds, TimedBound.calls = 0.0, 0
    try:
        if variant == "before":
            patch.setattr(participants_module, "UpdateNormBound", TimedBound(old_bound))
            patch.setattr(participants_module, "ExampleCountCeiling", lambda *a, **k: _NoCeiling())
        elif variant in ("now", "trusted", "projection"):
            patch.setattr(participants_module, "UpdateNormBound", TimedBound(participants_module.UpdateNormBound))
            if variant == "projection":
                patch.setattr(participants_module, "AGAINST_DESCENT_MULTIPLE", None)
        quality, summary = drill(patch, app, make[name](), attack, speed, seed=seed, arrivals=ARRIVALS, **options)
    finally:
        patch.close()
    return {"quality": quality, "clipped": summary.get("update-norm-clipped"),
            "projected": summary.get("trusted-direction-projected"),
            "bound-us-per-arrival": 1e6 * TimedBound.seconds / TimedBound.calls if TimedBound.calls else None}


class _NoCeiling:
    """The engine's count ceiling, absent (as before issue 56)."""

    def apply(self, arrival):
        return arrival

    def summary(self) -> dict:
        return {}


def run_flower(app: str, name: str, attack: str, seed: int) -> dict:
    import random

    random.seed(seed)
    client_app, initial, quality = APPS[app]
    strategy = {"flower-fedavg": FlowerFedAvg, "flower-fedmedian": FedMedian,
                "flower-fedtrimmedavg": FedTrimmedAvg}[name](fraction_evaluate=0.0)
    grid = InProcessGrid(client_app, NODES, {}, drill=(attack, 1 if attack else 0))
    result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=ARRIVALS // NODES,
                            train_config=ConfigRecord({}))
    return {"quality": quality(result.arrays)}


def main() -> None:
    logging.disable(logging.WARNING)
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    old_bound = bound_before()
    rows = []
    for app in APPS:
        for seed in SEEDS:
            for attack, speed in DRILLS:
                for name in ASYNCFL:
                    if name == "fedavg" and speed != 1.0:  # synchronous: a faster attacker waits for the round
                        continue
                    for variant in VARIANTS:
                        rows.append({"app": app, "strategy": name, "variant": variant, "attack": attack or "clean",
                                     "speed": speed, "seed": seed,
                                     **run_asyncfl(app, name, variant, attack, speed, seed, old_bound)})
                if speed == 1.0:
                    for name in ("flower-fedavg", "flower-fedmedian", "flower-fedtrimmedavg"):
                        rows.append({"app": app, "strategy": name, "variant": "flower", "attack": attack or "clean",
                                     "speed": speed, "seed": seed, **run_flower(app, name, attack, seed)})
            print(f"{app} seed {seed} done", flush=True)
    (HERE / "small-apps.json").write_text(json.dumps(rows, indent=1) + "\n")
    (HERE / "small-apps.md").write_text(table(rows))
    print(table(rows))


def table(rows: list[dict]) -> str:
    """Markdown: mean quality over seeds per app, strategy and drill; the bound's cost in the clean runs."""
    drills = [(a or "clean", s) for a, s in DRILLS]
    lines = []
    for app in APPS:
        unit = "1 - distance / start" if app == "toy" else "test accuracy"
        lines += [f"### {app} ({unit}, mean of seeds {', '.join(map(str, SEEDS))})", "",
                  "| strategy | bound | " + " | ".join(f"{a}" + (f" x{s:g}" if a in SPED else "")
                                                     for a, s in drills) + " |",
                  "|---|---|" + "---|" * len(drills)]
        for name, variant in [(n, v) for n in ASYNCFL for v in VARIANTS] + \
                             [(n, "flower") for n in ("flower-fedavg", "flower-fedmedian", "flower-fedtrimmedavg")]:
            cells = []
            for attack, speed in drills:
                got = [r["quality"] for r in rows if (r["app"], r["strategy"], r["variant"], r["attack"], r["speed"])
                       == (app, name, variant, attack, speed)]
                cells.append(f"{statistics.mean(got):.3f}" if got else "(= x1)")
            lines.append(f"| {name} | {variant if variant != 'flower' else '-'} | " + " | ".join(cells) + " |")
        lines.append("")
        for name in ASYNCFL:
            cost = {v: [r["bound-us-per-arrival"] for r in rows if (r["app"], r["strategy"], r["variant"],
                                                                       r["attack"]) == (app, name, v, "clean")]
                    for v in ("now", "before")}
            clipped = {v: [r["clipped"] for r in rows if (r["app"], r["strategy"], r["variant"], r["attack"])
                           == (app, name, v, "clean")] for v in ("now", "before")}
            lines.append(f"- {app}, {name}, clean runs: the bound takes {statistics.mean(cost['now']):.0f} us per "
                         f"arrival now, {statistics.mean(cost['before']):.0f} us before; honest updates clipped "
                         f"{' / '.join(map(str, clipped['now']))} now, {' / '.join(map(str, clipped['before']))} "
                         f"before (of {ARRIVALS}, per seed)")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
