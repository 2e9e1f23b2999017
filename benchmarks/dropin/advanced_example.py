"""The drop-in on Flower's advanced-pytorch example (examples/advanced-pytorch): Flower's FedAvg vs FedBuff and FedAsync.

Issue 44's reporting app (defaults were chosen on the quickstart app, not here). Every cell runs the
example as shipped: 50 nodes with Dirichlet(1.0) partitions of Fashion-MNIST, personal heads in
``context.state``, SGD momentum at the example's ``learning-rate``, halved from round 5 by
``configure_train``, ``num-server-rounds`` rounds of ``fraction-train`` x 50 client updates, the
server-side test accuracy after every round. Only the strategy changes: Flower's ``FedAvg``
through its own ``start()``, or asyncfl's ``FedBuff`` / ``FedAsync`` with their defaults on the
virtual clock (``--delays``: ``uniform-speed`` = equal speeds, the case where async must simply
match FedAvg; ``quarter-slow`` = a quarter of the nodes several times slower). The schedule is
the same ``configure_train`` override on every strategy. Federated evaluation is off (it costs
client jobs and measures nothing the server-side accuracy does not).

A **collapse** is an evaluation after the first quarter of the rounds below half the best one so
far. Cells are appended to ``<out>/cells.jsonl`` as they finish and skipped when present (resumes);
one torch thread per worker. Needs Fashion-MNIST (Debian: dataset-fashion-mnist).

Usage::

    .venv/bin/python benchmarks/dropin/advanced_example.py --delays uniform-speed --seeds 1 2 3
    .venv/bin/python benchmarks/dropin/advanced_example.py --table
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from run import keyword_changes, run_cells, split_run_options  # noqa: E402  (the drop-in study's row parser and cell runner)

EXAMPLE = ROOT / "examples" / "advanced-pytorch"
STRATEGIES = ("flower-fedavg", "fedbuff", "fedasync")
NODES = 50


def _quarter_5x_slower():
    """The virtual clock's stand-in for benchmarks/wall_sooner's fleet (``device_speed`` profile
    ``quarter-5x-slower``): a quarter of the nodes 5x slower, on every run; jobs +-0.2 around their node's mean
    (the wall study's fast nodes spread lognormally around 1 instead, one factor per node)."""
    from asyncfl.simulation.delays import ComponentDelay, DelayModel

    none = ComponentDelay("constant", ((1.0, 0.0),))
    return DelayModel(download=none, upload=none, train=ComponentDelay(
        "uniform", ((0.75, 1.0), (0.25, 5.0)), spread=0.2, exact_shares=True))


#: the tail means recorded: the accuracy of the mean of the last N rounds' models, for each N
TAIL_ROUNDS = (2, 3, 5)
#: delay names this study adds to asyncfl's presets
DELAYS = {"quarter-5x-slower": _quarter_5x_slower()}


def scheduled(cls):
    """``cls`` with the example's schedule: the clients' ``lr`` halved from round 5 (its ``configure_train``)."""

    class Scheduled(cls):
        def configure_train(self, server_round, arrays, config, grid):
            if server_round == 5:
                config["lr"] = config["lr"] * 0.5
            return super().configure_train(server_round, arrays, config, grid)

    Scheduled.__name__ = f"Scheduled{cls.__name__}"
    return Scheduled


def run_cell(cell: dict) -> dict:
    """One run of the example under ``cell["strategy"]``; the cell with its accuracy curve (index = round)."""
    sys.path[:0] = [str(EXAMPLE), str(ROOT)]
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    from advancedexample import client_app
    from advancedexample.task import Net, load_centralized_dataset, test
    from asyncfl.simulation.inprocess import InProcessGrid

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    # the ablation: every client trains the received model, head included (set per cell: a worker runs many cells)
    with_heads = getattr(client_app, "_with_heads", client_app._model_and_data)
    client_app._with_heads = with_heads

    def without_heads(msg, context):
        model, loaders = with_heads(msg, context)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())  # the received head back over its own
        return model, loaders

    client_app._model_and_data = with_heads if cell.get("personal-heads", True) else without_heads
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config.update(cell.get("config", {}))  # --fraction-train / --rounds: the run config a user would change
    seed = cell["seed"]
    random.seed(seed)  # Flower's FedAvg samples its cohort with `random`
    np.random.seed(seed)
    torch.manual_seed(seed)
    testloader = load_centralized_dataset(config["data-dir"])
    curve: dict[int, float] = {}
    scored: dict[int, dict] = {}  # the last TAIL_ROUNDS rounds' models, for the tail means

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        state = arrays.to_torch_state_dict()
        model.load_state_dict(state)
        loss, accuracy = test(model, testloader, "cpu")
        curve[server_round] = accuracy
        scored[server_round] = state
        scored.pop(server_round - max(TAIL_ROUNDS), None)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def tail_mean_accuracy(rounds: int) -> float:
        """The accuracy of the mean of the last ``rounds`` rounds' models (Polyak averaging, a diagnostic)."""
        last = sorted(scored)[-rounds:]
        model = Net()
        model.load_state_dict({key: sum(scored[r][key] for r in last) / len(last) for key in scored[last[-1]]})
        return round(test(model, testloader, "cpu")[1], 4)

    common = dict(grid=InProcessGrid(client_app.app, NODES, config), initial_arrays=ArrayRecord(Net().state_dict()),
                  num_rounds=config["num-server-rounds"], train_config=ConfigRecord({"lr": config["learning-rate"]}),
                  evaluate_fn=evaluate)
    started = time.perf_counter()
    summary: dict = {}
    if cell["strategy"] == "flower-fedavg":
        from flwr.serverapp.strategy import FedAvg

        scheduled(FedAvg)(fraction_train=config["fraction-train"], fraction_evaluate=0.0).start(**common)
    else:
        import asyncfl

        name, keywords = variant(cell["strategy"])
        keywords, run_options = split_run_options(keywords)
        cls = scheduled({"fedbuff": asyncfl.FedBuff, "fedasync": asyncfl.FedAsync}[name])
        summary = cls(fraction_train=config["fraction-train"], fraction_evaluate=0.0, **keywords).start(
            **common, clock="virtual", delay_model=DELAYS.get(cell["delays"], cell["delays"]), seed=seed,
            **run_options).summary
    accuracies = [round(curve[r], 4) for r in sorted(curve)]
    return {**cell, "curve": accuracies, "final": accuracies[-1], "best": max(accuracies),
            "collapsed": collapsed(accuracies), "tail-means": {n: tail_mean_accuracy(n) for n in TAIL_ROUNDS},
            "updates": summary.get("arrivals"),
            "staleness-mean": summary.get("staleness-mean"), "seconds": round(time.perf_counter() - started, 1),
            "virtual-time": summary.get("final-time"), "held-dispatches": summary.get("held-dispatches"),
            **{key: summary[key] for key in ("server-versions", "update-norm-clipped", "pace-response", "pace-bound")
               if key in summary}}


def variant(strategy: str) -> tuple[str, dict]:
    """``"fedbuff"`` or ``"fedbuff:buffer_size=12,server_lr=1.0"`` (a row with keywords changed: the strategy's, or
    run options of ``start()`` such as ``dispatch_hold``)."""
    name, _, extra = strategy.partition(":")
    return name, keyword_changes(extra)


def collapsed(curve: list[float]) -> bool:
    """An evaluation after the first quarter of the rounds below half the best one so far."""
    best = 0.0
    for index, accuracy in enumerate(curve):
        if index > len(curve) // 4 and accuracy < 0.5 * best:
            return True
        best = max(best, accuracy)
    return False


def late_swing(curve: list[float]) -> float:
    """Mean absolute change between consecutive evaluations over the second half of the rounds: how much the
    model oscillates once it has learnt most of what it will (a collapse is the extreme)."""
    tail = curve[len(curve) // 2:]
    return statistics.fmean(abs(b - a) for a, b in zip(tail, tail[1:])) if len(tail) > 1 else 0.0


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def table(rows: list[dict]) -> str:
    """Markdown: per strategy and clock, the mean final accuracy, its gap to Flower's FedAvg, the worst run's
    gap to FedAvg's mean, and collapses."""
    reference = [r["final"] for r in rows if r["strategy"] == "flower-fedavg" and r.get("personal-heads", True)]
    ref = statistics.mean(reference) if reference else None
    lines = ["| strategy | delays | final (mean ± sd) | − Flower FedAvg | worst run − FedAvg's mean | collapses | "
             "late swing | staleness | runs |", "|---|---|---|---|---|---|---|---|---|"]
    rows = [{**r, "strategy": r["strategy"] + ("" if r.get("personal-heads", True) else " (no personal heads)")}
            for r in rows]
    keys = sorted({(r["strategy"], r["delays"]) for r in rows},
                  key=lambda k: (STRATEGIES.index(k[0].partition(":")[0].partition(" ")[0]), k[0], k[1]))
    for strategy, delays in keys:
        cells = [r for r in rows if r["strategy"] == strategy and r["delays"] == delays]
        clock = "(no clock)" if strategy.startswith("flower-fedavg") else delays
        lines.append(f"| {strategy} | {clock} | {row_figures(cells, ref)} | "
                     f"{len(cells)} (seeds {', '.join(str(s) for s in sorted(r['seed'] for r in cells))}) |")
    return "\n".join(lines)


def tail_table(rows: list[dict]) -> str:
    """Markdown: per strategy, the final accuracy beside that of the mean of the last N rounds' models
    (``tail-average-rounds`` N, computed from the stored rounds' models), each against Flower's FedAvg's mean
    final, and the worst run."""
    rows = [r for r in rows if "tail-means" in r and r.get("personal-heads", True)]
    reference = [r["final"] for r in rows if r["strategy"] == "flower-fedavg"]
    if not reference:
        return ""
    ref = statistics.mean(reference)
    names = sorted(rows[0]["tail-means"], key=int)
    lines = ["| strategy | delays | runs | final (mean; worst) − FedAvg's final | " +
             " | ".join(f"mean of {n} rounds (mean; worst) − FedAvg's final" for n in names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    for strategy, delays in sorted({(r["strategy"], r["delays"]) for r in rows},
                                   key=lambda k: (STRATEGIES.index(k[0].partition(":")[0]), k)):
        cells = [r for r in rows if (r["strategy"], r["delays"]) == (strategy, delays)]

        def gap(values: list[float]) -> str:
            return f"{statistics.mean(values) - ref:+.3f}; {min(values) - ref:+.3f}"

        lines.append(f"| {strategy} | {delays} | {len(cells)} | {gap([r['final'] for r in cells])} | " +
                     " | ".join(gap([r["tail-means"][n] for r in cells]) for n in names) + " |")
    return "\n".join(lines)


def row_figures(cells: list[dict], reference: float | None) -> str:
    """A table row's figures over ``cells``: final mean ± sd, its gap to ``reference`` (Flower FedAvg's mean), the
    worst run's gap, collapses, late swing and mean staleness, as ``|``-separated Markdown cells."""
    finals = [r["final"] for r in cells]
    sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
    gap = f"{statistics.mean(finals) - reference:+.3f}" if reference is not None else "n/a"
    worst = f"{min(finals) - reference:+.3f}" if reference is not None else "n/a"
    stale = [r["staleness-mean"] for r in cells if r.get("staleness-mean") is not None]
    return (f"{statistics.mean(finals):.3f} ± {sd:.3f} | {gap} | {worst} | "
            f"{sum(r['collapsed'] for r in cells)} of {len(cells)} | "
            f"{statistics.mean(late_swing(r['curve']) for r in cells):.3f} | "
            f"{statistics.mean(stale) if stale else 0:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES),
                        help=f"{', '.join(STRATEGIES)}; asyncfl's optionally with ':key=value,...' keyword changes")
    parser.add_argument("--delays", default="uniform-speed",
                        help=f"the virtual clock's delay preset, or this study's {', '.join(DELAYS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "advanced-example")
    parser.add_argument("--fraction-train", type=float,
                        help="the example's fraction-train (jobs in flight = fraction x 50; default: its pyproject's)")
    parser.add_argument("--rounds", type=int, help="the example's num-server-rounds (default: its pyproject's)")
    parser.add_argument("--no-personal-heads", action="store_true",
                        help="the ablation: clients train the received head instead of their own")
    parser.add_argument("--table", action="store_true", help="only print the table of the stored cells")
    args = parser.parse_args()
    path = args.out / "cells.jsonl"
    def key(cell: dict) -> tuple:
        return (cell["strategy"], cell["delays"], cell["seed"], cell.get("personal-heads", True),
                json.dumps(cell.get("config", {}), sort_keys=True))

    done = {key(r) for r in load(path)}
    heads = {} if not args.no_personal_heads else {"personal-heads": False}
    config = {name: value for name, value in (("fraction-train", args.fraction_train),
                                              ("num-server-rounds", args.rounds)) if value is not None}
    extra = {**heads, **({"config": config} if config else {})}
    todo = [{"strategy": s, "delays": "none" if s == "flower-fedavg" else args.delays, "seed": seed, **extra}
            for seed in args.seeds for s in args.strategies]
    todo = [c for c in todo if key(c) not in done]
    if not args.table and todo:
        for row in run_cells(run_cell, todo, path, args.workers):
            print(f"{row['strategy']:>14} {row['delays']:>14} seed {row['seed']}: final {row['final']:.3f} best "
                  f"{row['best']:.3f}{' COLLAPSED' if row['collapsed'] else ''} ({row['seconds']} s)", flush=True)
    print(table(load(path)))
    print(tail_table(load(path)))


if __name__ == "__main__":
    main()
