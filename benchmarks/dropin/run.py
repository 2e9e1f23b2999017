"""The drop-in study: swap Flower's FedAvg for each asyncfl strategy, keep the app, compare at equal client work.

Every cell runs one app (``apps.py``) with one local optimizer under one server strategy for
``rounds`` rounds, i.e. ``rounds x nodes`` client updates for every strategy (asyncfl's
``num_rounds`` buys what Flower's FedAvg buys), and records the server-side test accuracy
after every round. Flower's own ``FedAvg`` runs through its own ``Strategy.start``; asyncfl's
strategies through theirs, on the virtual clock with the FedRevive paper's delay model
(heterogeneous speeds, so updates arrive stale). Both talk to the same ClientApp through
:class:`asyncfl.simulation.inprocess.InProcessGrid`.

Cells are appended to ``<out>/cells.jsonl`` as they finish and skipped when present, so an
interrupted study resumes. Two worker processes, one torch thread each.

Usage::

    .venv/bin/python benchmarks/dropin/run.py                       # the whole matrix, then the table
    .venv/bin/python benchmarks/dropin/run.py --strategies fedbuff fedasync --settings sgdm-0.05
    .venv/bin/python benchmarks/dropin/run.py --table               # only rebuild the table
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

#: (app, optimizer, lr, rounds): the client side of a cell
SETTINGS = {
    "sgdm-0.05": ("quickstart", "sgdm", 0.05, 40),
    "sgdm-0.1": ("quickstart", "sgdm", 0.1, 40),
    "sgdm-0.01": ("quickstart", "sgdm", 0.01, 40),  # FedAvg still climbs steeply at round 40 (takes off ~20)
    "sgdm-0.01-r80": ("quickstart", "sgdm", 0.01, 80),  # the same app given the rounds to converge
    "adam-1e-3": ("quickstart", "adam", 1e-3, 40),
    "bn-sgdm-0.05": ("bn-mnist5k", "sgdm", 0.05, 15),
    "bn-sgdm-0.05-r40": ("bn-mnist5k", "sgdm", 0.05, 40),  # the BatchNorm CNN given FADAS's horizon
    # the shape of the quickstart example's `flwr run` e2e test: 6 nodes, the example's lr 0.1, 16 rounds
    "e2e-shape": ("quickstart", "sgdm", 0.1, 16),
    "e2e-shape-r32": ("quickstart", "sgdm", 0.1, 32),  # the same given twice the rounds (CA2FL's cache lag)
    # the attack drills' "10 % of 50 nodes": sgdm-0.05's data over 50 nodes, ~23 images each (one SGD step a job,
    # so FedAvg needs 3x the rounds: 0.38 after 40)
    "sgdm-0.05-n50": ("quickstart", "sgdm", 0.05, 120),
}
NODES = 8
#: settings run on another number of nodes than NODES
SETTING_NODES = {"e2e-shape": 6, "e2e-shape-r32": 6, "sgdm-0.05-n50": 50}

#: name -> (class name, keywords): what the matrix swaps in. "before" rows spell out the defaults that the
#: issue measured, so they stay reproducible once the defaults change.
STRATEGIES = {
    "flower-fedavg": ("flwr.FedAvg", {}),
    "fedavg": ("FedAvg", {}),
    "fedasync": ("FedAsync", {}),
    "fedbuff": ("FedBuff", {}),
    "afl-dw": ("AFLDW", {}),
    "ca2fl": ("CA2FL", {}),
    "fadas": ("FADAS", {}),
    "fedfa": ("FedFa", {}),
    # the methods that add server-side distillation or inversion to a parameter-space step; they need the
    # app's model and (FedEcho, FedADT) its server set, handed over by build_strategy
    "fedecho": ("FedEcho", {}),
    "fedrevive": ("FedRevive", {}),
    "fedadt": ("FedADT", {}),
    # semi-asynchronous rounds (GI's setting): a round closes ROUND_DEADLINE after it opens, late updates join a
    # later round stale; "fedavg-deadline" is the paper's "Unweighted" baseline on the same clock
    "gi": ("GICompensation", {}),
    "fedavg-deadline": ("FedAvg", {}),
    # the GI paper's other baselines for late updates, on the same semi-asynchronous rounds
    "staleweighted": ("StaleWeighted", {}),
    "dcasgd": ("DCASGD", {}),
    "wpred": ("WPred", {}),
    "asyntiers": ("AsynTiers", {}),
    # FedBuff's defaults before the buffer followed the concurrency (rows "fedbuff" of cells files written before then)
    "fedbuff-b5-stable": ("FedBuff", {"buffer_size": 5, "pace": "stable"}),
    "fedbuff-before": ("FedBuff", {"buffer_size": 5, "server_lr": 1.0, "staleness_weighting": "none"}),
    "afl-dw-before": ("AFLDW", {"server_lr": 0.1}),
    "ca2fl-before": ("CA2FL", {"buffer_size": 5, "server_lr": 1.0}),
    "fedfa-before": ("FedFa", {"queue_size": 10}),
    # attack drills (issue 42): Flower's robust synchronous strategies, and asyncfl's without its update bound
    "flower-fedmedian": ("flwr.FedMedian", {}),
    "flower-fedtrimmedavg": ("flwr.FedTrimmedAvg", {}),
    "fedbuff-nobound": ("FedBuff", {}),
    "fedasync-nobound": ("FedAsync", {}),
    "fedbuff-reject": ("FedBuff", {}),
    "fedasync-reject": ("FedAsync", {}),
    # differential privacy (issue 42): DP-FedBuff, buffer 4 and server step 1 (DP needs a step the clients' updates
    # do not set), clipped at 0.3 (about the honest updates' median norm in sgdm-0.05), against the same FedBuff
    "fedbuff-b4": ("FedBuff", {"buffer_size": 4, "server_lr": 1.0}),
    "fedbuff-b4-dp1": ("DP", {"noise_multiplier": 1.0, "clipping_norm": 0.3}),
    "fedbuff-b4-dp0.05": ("DP", {"noise_multiplier": 0.05, "clipping_norm": 0.3}),
    "fedbuff-b4-dp0.2": ("DP", {"noise_multiplier": 0.2, "clipping_norm": 0.3}),
}
DELAYS = "fedrevive-default"
#: engine keywords per strategy (on top of the clock, delays and seed every asyncfl cell gets)
ROUND_DEADLINE = 1.5  # fedrevive-default: a job takes 0.1 + Exp(1.0-1.6) + ~0.2, so about a third are late
ENGINE = {name: {"round_deadline": ROUND_DEADLINE}
          for name in ("gi", "fedavg-deadline", "staleweighted", "dcasgd", "wpred", "asyntiers")}
ENGINE.update({"fedbuff-nobound": {"update_norm_bound": 0.0}, "fedasync-nobound": {"update_norm_bound": 0.0},
               "fedbuff-reject": {"update_norm_action": "reject"}, "fedasync-reject": {"update_norm_action": "reject"}})
#: Flower's own strategies, run through their own start() (no virtual clock)
FLOWER = ("flower-fedavg", "flower-fedmedian", "flower-fedtrimmedavg")


def parse_strategy(name: str) -> tuple[str, dict]:
    """``"fedbuff"`` or ``"fedbuff:server_lr=0.5,staleness_weighting=sqrt"`` (a row with keywords changed)."""
    base, _, extra = name.partition(":")
    if base not in STRATEGIES:
        raise SystemExit(f"unknown strategy {base!r}; valid: {', '.join(STRATEGIES)} (optionally ':key=value,...')")
    cls_name, keywords = STRATEGIES[base]
    return cls_name, {**keywords, **keyword_changes(extra)}


def split_run_options(keywords: dict) -> tuple[dict, dict]:
    """A row's keywords as (the strategy's, ``start()``'s run options such as ``dispatch_hold``)."""
    from asyncfl.options import RunOptions

    names = set(RunOptions.names())
    return ({k: v for k, v in keywords.items() if k not in names}, {k: v for k, v in keywords.items() if k in names})


def keyword_changes(extra: str) -> dict:
    """``"buffer_size=5,aggregation=median"`` -> ``{"buffer_size": 5, "aggregation": "median"}`` (JSON values, else
    strings)."""
    keywords = {}
    for item in filter(None, extra.split(",")):
        key, _, value = item.partition("=")
        try:
            keywords[key] = json.loads(value)
        except json.JSONDecodeError:
            keywords[key] = value
    return keywords


def build_strategy(name: str, app, optimizer: str, lr: float, seed: int, nodes: int = NODES):
    """The strategy of row ``name`` with its defaults; the KD/GI methods get what only the app knows
    (its ``Net``, input shape and classes, the server's data, the clients' SGD program)."""
    cls_name, keywords = parse_strategy(name)
    keywords, _ = split_run_options(keywords)
    if cls_name.startswith("flwr."):
        import flwr.serverapp.strategy

        return getattr(flwr.serverapp.strategy, cls_name[len("flwr."):])(fraction_evaluate=0.0, **keywords)
    import asyncfl

    if cls_name == "DP":
        inner = asyncfl.FedBuff(fraction_evaluate=0.0, **STRATEGIES["fedbuff-b4"][1])
        return asyncfl.DifferentialPrivacyServerSideFixedClipping(inner, insecure_noise_seed=seed, **keywords)
    cls = getattr(asyncfl, cls_name)
    if cls_name == "FedEcho":
        keywords = {"model_fn": app.model_fn, "distill_inputs": app.server_set(nodes)[0], "seed": seed, **keywords}
    elif cls_name == "FedADT":
        keywords = {"model_fn": app.model_fn, "server_data": app.server_set(nodes), "seed": seed, **keywords}
    elif cls_name == "FedRevive":
        keywords = {"model_fn": app.model_fn, "num_classes": app.num_classes, "input_shape": app.input_shape,
                    "seed": seed, **keywords}
    elif cls_name == "GICompensation":
        program = asyncfl.LocalProgram(epochs=1, steps=0, batch_size=32, lr=lr, momentum=0.9)  # apps.local_train
        keywords = {"model_fn": app.model_fn, "input_shape": app.input_shape, "num_classes": app.num_classes,
                    "local_program": program, "seed": seed, **keywords}
    return cls(fraction_evaluate=0.0, **keywords)


def runnable(setting: str, strategy: str) -> bool:
    """GI compensation replays SGD clients only (its paper: inversion fails under Adam)."""
    return not (parse_strategy(strategy)[0] == "GICompensation" and SETTINGS[setting][1] != "sgdm")


def run_cell(cell: dict) -> dict:
    """One run; returns the cell with its accuracy curve (index = round) and run figures."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    from apps import APPS, client_app, test_accuracy, trusted_program
    from asyncfl.simulation.inprocess import InProcessGrid

    torch.set_num_threads(1)
    logging.disable(logging.INFO)  # Flower's and asyncfl's per-round lines; warnings still show
    app_name, optimizer, lr, rounds = SETTINGS[cell["setting"]]
    app = APPS[app_name]
    seed = cell["seed"]
    random.seed(seed)  # Flower's FedAvg samples nodes with `random`
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = app.model_fn()
    x_test, y_test = app.test_set()
    grid = InProcessGrid(client_app, SETTING_NODES.get(cell["setting"], NODES),
                         {"app": app_name, "optimizer": optimizer, "batch-size": 32, "local-epochs": 1},
                         drill=(cell.get("attack", ""), cell.get("attackers", 0)))
    curve: dict[int, float] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = app.model_fn()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = test_accuracy(net, x_test, y_test)
        curve[server_round] = acc
        return MetricRecord({"accuracy": acc, "loss": loss})

    strategy = build_strategy(cell["strategy"], app, optimizer, lr, seed, SETTING_NODES.get(cell["setting"], NODES))
    started = time.perf_counter()
    common = dict(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                  train_config=ConfigRecord({"lr": lr}), evaluate_fn=evaluate)
    times: list[float] = []
    if cell["strategy"] in FLOWER:
        strategy.start(**common)
        summary = {"arrivals": grid.messages_by_type.get("train", 0), "server-versions": rounds}
    else:
        from asyncfl.errors import ClientAppsFailing

        with tempfile.TemporaryDirectory() as folder, attacker_pace(cell), \
                bound_weight_ablated(cell), projection_only(cell):  # metrics.csv: each evaluation's time
            try:
                trusted = (trusted_program(app, optimizer, lr, SETTING_NODES.get(cell["setting"], NODES))
                           if cell.get("trusted") else None)
                summary = strategy.start(**common, clock="virtual", delay_model=cell.get("delays", DELAYS), seed=seed,
                                         output_dir=folder, run_name="run", trusted_train_fn=trusted,
                                         **ENGINE.get(cell["strategy"].partition(":")[0], {}),
                                         **split_run_options(parse_strategy(cell["strategy"])[1])[1]).summary
            except ClientAppsFailing as failed:
                # the model diverged far enough that every client's update is non-finite: a result, not a crash
                # of the study; its curve so far is kept and the cell is marked (final = the last evaluation)
                summary = {"arrivals": None, "server-versions": None, "diverged": str(failed)}
            with open(Path(folder) / "run" / "metrics.csv") as handle:
                times = [float(row["time"]) for row in csv.DictReader(handle)]
    accuracies = [round(curve[r], 4) for r in sorted(curve)]
    row = {**cell, "curve": accuracies, "times": times, "final": accuracies[-1], "best": max(accuracies),
           "updates": summary["arrivals"], "versions": summary["server-versions"],
           "staleness-mean": summary.get("staleness-mean", 0.0), "seconds": round(time.perf_counter() - started, 1)}
    if "diverged" in summary:
        row["diverged"] = summary["diverged"]
    # the measured pace's last reading and bound, where a strategy measures its clients (server_lr=0, pace="measured")
    row.update({key: summary[key] for key in ("pace-response", "pace-bound", "update-norm-clipped",
                                               "update-norm-rejected", "update-norm-largest-ratio",
                                               "update-norm-rate-limited", "num-examples-capped",
                                               "update-norm-median", "dp-epsilon", "dp-delta", "dp-releases",
                                               "dp-most-participations", "distill-move-ratio", "teacher-accuracy-on-u",
                                               "global-accuracy-on-u", "trusted-direction-checked",
                                               "trusted-direction-projected", "trusted-direction-removed-share-mean",
                                               "trusted-direction-trainings", "trusted-direction-seconds")
                       if key in summary})
    return row


@contextlib.contextmanager
def attacker_pace(cell: dict):
    """The drill's attackers (client indices 0 .. attackers-1) finish each job ``speed`` times sooner than their
    drawn durations, and under the ``replace`` drill their first job at once (their reply arrives first)."""
    import asyncfl.server_app.engine as engine
    from asyncfl.simulation.delays import FasterClients

    attackers = range(cell.get("attackers", 0))
    speed, first = cell.get("speed", 1.0), frozenset(attackers) if cell.get("attack") == "replace" else frozenset()
    if speed == 1.0 and not first:
        yield
        return
    original = engine.delay_sampler
    engine.delay_sampler = lambda model, seed: FasterClients(original(model, seed), dict.fromkeys(attackers, speed),
                                                             first)
    try:
        yield
    finally:
        engine.delay_sampler = original


@contextlib.contextmanager
def bound_weight_ablated(cell: dict):
    """With ``"bound-weight": False`` in the cell, the update bound compares each update's norm alone, not the
    strategy's staleness weight x norm (the ablation of asyncfl.server_app.participants.relative_weight)."""
    if cell.get("bound-weight", True):
        yield
        return
    import asyncfl.server_app.participants as participants

    original = participants.relative_weight
    participants.relative_weight = lambda strategy, arrival: 1.0
    try:
        yield
    finally:
        participants.relative_weight = original


@contextlib.contextmanager
def projection_only(cell: dict):
    """With ``"trusted-tight": False`` in the cell, an update that pointed against the trusted descent loses that
    component only: what remains keeps the run's norm bound instead of the median (the ablation of
    asyncfl.server_app.participants.AGAINST_DESCENT_MULTIPLE)."""
    if cell.get("trusted-tight", True):
        yield
        return
    import asyncfl.server_app.participants as participants

    original = participants.AGAINST_DESCENT_MULTIPLE
    participants.AGAINST_DESCENT_MULTIPLE = None
    try:
        yield
    finally:
        participants.AGAINST_DESCENT_MULTIPLE = original


def run_cells(run: Callable[[dict], dict], todo: list[dict], path: Path, workers: int) -> Iterator[dict]:
    """Run ``todo`` on ``workers`` spawned processes, appending each finished cell to ``path`` (JSON lines) as it
    comes, so a stopped study keeps every cell already done; yields the cells in the order they finish."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(workers) as pool, path.open("a") as out:
        for row in pool.imap_unordered(run, todo):
            out.write(json.dumps(row) + "\n")
            out.flush()
            yield row


def done_cells(path: Path) -> dict[tuple, dict]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["setting"], r["strategy"], r["seed"]): r for r in rows}


def table(rows: list[dict], settings: list[str], strategies: list[str]) -> str:
    """Markdown: mean final (last round) and best accuracy over seeds, and final minus Flower FedAvg's."""
    lines = ["| setting | strategy | updates | versions | final (mean ± sd) | best | final − best | "
             "final − Flower FedAvg | seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for setting in settings:
        by = {s: [r for r in rows if r["setting"] == setting and r["strategy"] == s] for s in strategies}
        reference = by.get("flower-fedavg") or []
        ref = statistics.mean(r["final"] for r in reference) if reference else None
        for s in strategies:
            cells = by[s]
            if not cells:
                continue
            finals = [r["final"] for r in cells]
            final, best = statistics.mean(finals), statistics.mean(r["best"] for r in cells)
            sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
            gap = f"{final - ref:+.3f}" if ref is not None else "n/a"
            finished = [r for r in cells if not r.get("diverged")]
            updates = finished[0]["updates"] if finished else "n/a"
            versions = f"{statistics.mean(r['versions'] for r in finished):.0f}" if finished else "n/a"
            diverged = len(cells) - len(finished)
            seeds = f"{len(cells)} ({diverged} diverged)" if diverged else f"{len(cells)}"
            lines.append(f"| {setting} | {s} | {updates} | {versions} "
                         f"| {final:.3f} ± {sd:.3f} | {best:.3f} | {final - best:+.3f} | {gap} | {seeds} |")
    return "\n".join(lines)


def sooner_table(rows: list[dict], settings: list[str], strategies: list[str], reference: str = "fedavg") -> str:
    """Markdown: virtual time to reach the reference's final accuracy (mean over its seeds), per strategy.

    The reference is asyncfl's synchronous FedAvg on the same virtual clock (Flower's own FedAvg runs no clock;
    at equal updates the two end within a point of each other, see the equal-work table).
    """
    lines = ["| setting | strategy | target (FedAvg's mean final) | time to target, mean (seeds reaching it) | "
             "vs FedAvg | time for all rounds | final |", "|---|---|---|---|---|---|---|"]
    for setting in settings:
        ref_rows = [r for r in rows if r["setting"] == setting and r["strategy"] == reference]
        if not ref_rows:
            continue
        target = statistics.mean(r["final"] for r in ref_rows) - 1e-9
        ref_time = None
        for s in strategies:
            cells = [r for r in rows if r["setting"] == setting and r["strategy"] == s and r.get("times")]
            if not cells:
                continue
            reached = [next((t for t, a in zip(r["times"], r["curve"]) if a >= target), None) for r in cells]
            hit = [t for t in reached if t is not None]
            mean_time = statistics.mean(hit) if hit else None
            if s == reference:
                ref_time = mean_time
            ratio = f"{mean_time / ref_time:.2f}x" if mean_time and ref_time else "n/a"
            shown = f"{mean_time:.1f} ({len(hit)}/{len(cells)})" if hit else f"not reached (0/{len(cells)})"
            lines.append(f"| {setting} | {s} | {target:.3f} | {shown} | {ratio} | "
                         f"{statistics.mean(r['times'][-1] for r in cells):.1f} | "
                         f"{statistics.mean(r['final'] for r in cells):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES),
                        help="names from STRATEGIES, each optionally with ':key=value,...' keyword changes")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--delays", default=DELAYS, help=f"the virtual clock's delay preset (default {DELAYS}); "
                        "with another one the table is time to FedAvg's final accuracy")
    parser.add_argument("--attack", default="", help="attack drill: partitions 0 .. attackers-1 poison their "
                        "train replies (noise, sign-flip, scale, replace, forged-count: asyncfl/client_app/drills.py); use its own --out")
    parser.add_argument("--attackers", type=int, default=0, help="how many nodes make the --attack")
    parser.add_argument("--attacker-speed", type=float, default=1.0, help="the --attack's nodes finish each job "
                        "this many times sooner than drawn (asynchronous strategies; a synchronous round waits anyway)")
    parser.add_argument("--no-bound-weight", action="store_true", help="ablation: the update bound on each update's "
                        "norm alone, not the strategy's staleness weight x norm")
    parser.add_argument("--trusted", action="store_true", help="the server checks each update against its own "
                        "descent on its server set (trusted_train_fn: asyncfl.server_app.trusted_direction)")
    parser.add_argument("--projection-only", action="store_true", help="ablation of --trusted: an update against "
                        "the trusted descent loses that component only (its remainder keeps the run's norm bound)")
    parser.add_argument("--table", action="store_true", help="only rebuild the table from finished cells")
    args = parser.parse_args()
    for name in args.strategies:
        parse_strategy(name)
    cells_path = args.out / "cells.jsonl"
    done = done_cells(cells_path)
    drill = {"attack": args.attack, "attackers": args.attackers} if args.attack else {}
    if args.attacker_speed != 1.0:
        drill["speed"] = args.attacker_speed
    if args.no_bound_weight:
        drill["bound-weight"] = False
    if args.trusted:
        drill["trusted"] = True
    if args.projection_only:
        drill["trusted-tight"] = False
    todo = [{"setting": st, "strategy": s, "seed": seed, "delays": args.delays, **drill} for seed in args.seeds
            for st in args.settings for s in args.strategies if (st, s, seed) not in done and runnable(st, s)]
    if not args.table and todo:
        for row in run_cells(run_cell, todo, cells_path, args.workers):
            print(f"{row['setting']:>12} {row['strategy']:>16} seed {row['seed']}: final {row['final']:.3f} "
                  f"best {row['best']:.3f} ({row['updates']} updates, {row['versions']} versions, "
                  f"{row['seconds']} s){' DIVERGED' if row.get('diverged') else ''}", flush=True)
    rows = list(done_cells(cells_path).values())
    print(table(rows, args.settings, args.strategies))
    if args.delays != DELAYS:
        print()
        print(sooner_table(rows, args.settings, args.strategies))


if __name__ == "__main__":
    main()
