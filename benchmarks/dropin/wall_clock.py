"""The drop-in on the wall clock: Flower's two examples through real ``flwr run``, FedAvg vs FedBuff / FedAsync.

Issue 44's table on the wall clock, where the virtual clock's seeded studies (``run.py``,
``advanced_example.py``) have a twin. Each run copies an example of ``examples/`` and swaps only
the strategy, as a user would: the import line (``from asyncfl import FedBuff`` becomes Flower's
``FedAvg`` or asyncfl's ``FedAsync``); for Flower's FedAvg on ``advanced-pytorch`` the asyncfl
callbacks are dropped (Flower's ``start()`` takes none; the server-side accuracy is read from its
``Result`` instead). Then ``asyncfl run`` runs it on a private simulation SuperLink with Ray: the
arrival order is Ray's, not seeded, so every cell is repeated (``--runs``). Equal speeds: every
node runs the same-sized job on the same machine, the case where async gains no time and must
simply match FedAvg at equal client updates.

The per-round server-side accuracy comes from ``Result.evaluate_metrics_serverapp`` (one line
appended to the copy's ``main`` writes it as JSON). Federated evaluation is off (``fraction-evaluate
= 0``: it costs client jobs and measures nothing the server-side accuracy does not). A
**collapse** is an evaluation after the first quarter of the rounds below half the best so far.

Cells are appended to ``<out>/cells.jsonl`` as they finish and skipped when present (resumes).

The examples' ClientApps carry asyncfl's optional ``report_train_seconds`` mod (one line, as
``docs/library.md`` tells a user): replies say how long they trained, and the engine reads the rest
of a round trip as time the job waited for a worker (``dispatch-hold``'s window). ``--no-client-mod``
takes it out of the copy (the cells before it existed). A cell records whether the mod was on and
the means of both times from asyncfl's closing line.

Usage::

    .venv/bin/python benchmarks/dropin/wall_clock.py --examples quickstart-pytorch --runs 5
    .venv/bin/python benchmarks/dropin/wall_clock.py --table
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

# the virtual-clock twin's collapse rule, cells reader and row figures
from advanced_example import collapsed, load, row_figures  # noqa: E402

STRATEGIES = ("flower-fedavg", "fedbuff", "fedasync")
#: example -> (its ServerApp module, nodes, run-config overrides): the quickstart at the drop-in study's shape (8
#: nodes, 40 rounds, its own lr 0.1); the advanced example as shipped (50 nodes, 10 rounds of a quarter of them)
EXAMPLES = {
    "quickstart-pytorch": ("pytorchexample/server_app.py", 8, "num-server-rounds=40 fraction-evaluate=0.0"),
    "advanced-pytorch": ("advancedexample/server_app.py", 50, "fraction-evaluate=0.0"),
    # issue 60's setting: Flower's example as published (lr 0.1, 20 nodes) on a fixed subset of Fashion-MNIST,
    # the first 12,000 training and 2,000 test images ({subset}: written by fmnist_subset)
    "advanced-pytorch-20": ("advancedexample/server_app.py", 20,
                            "fraction-evaluate=0.0 learning-rate=0.1 data-dir='{subset}'"),
}
#: a variant's example folder, where its name is not the folder's
FOLDER = {"advanced-pytorch-20": "advanced-pytorch"}
FMNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
SUBSET = {"train": 12_000, "t10k": 2_000}


def fmnist_subset(folder: Path) -> Path:
    """The first ``SUBSET`` images of each of Fashion-MNIST's splits as IDX files in ``folder`` (written once)."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for split, count in SUBSET.items():
        for kind, header, item in (("images", 16, 28 * 28), ("labels", 8, 1)):
            target = folder / f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz"
            if target.exists():
                continue
            raw = gzip.decompress((FMNIST / target.name).read_bytes())
            head = bytearray(raw[:header])
            head[4:8] = count.to_bytes(4, "big")  # the item count, big-endian after the magic number
            target.write_bytes(gzip.compress(bytes(head) + raw[header:header + count * item]))
    return folder
RESULT_LINE = "    result = strategy.start("
MOD = re.compile(r"^app = ClientApp\(mods=\[report_train_seconds\]\)", re.M)


def swapped(source: str, strategy: str, accuracy_file: Path, start_options: str = "") -> str:
    """``server_app.py`` with its strategy swapped and a line writing the per-round server-side accuracy;
    ``start_options`` (``"concurrency=4"``) go into an asyncfl strategy's ``start()`` call."""

    imports = re.compile(r"^from asyncfl import ([^\n]*)$", re.M)
    if not imports.search(source) or "FedBuff" not in imports.search(source).group(1):
        raise SystemExit(f"the example's server_app.py no longer imports FedBuff from asyncfl: "
                         f"update {Path(__file__).name}")
    if strategy == "fedasync":
        source = imports.sub(
            lambda m: "from asyncfl import " + re.sub(r"\bFedBuff\b", "FedAsync as FedBuff", m.group(1)), source)
    elif strategy == "flower-fedavg":
        source = imports.sub("from flwr.serverapp.strategy import FedAvg as FedBuff\nCallback = object", source)
        source = re.sub(r",\s*callbacks=\[[^\]]*\]", "", source)
    elif strategy != "fedbuff":
        raise SystemExit(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if RESULT_LINE not in source:
        raise SystemExit(f"the example's server_app.py has no {RESULT_LINE.strip()!r}: update {Path(__file__).name}")
    if start_options:
        if strategy == "flower-fedavg":
            raise SystemExit("--start-options are asyncfl's run options: Flower's FedAvg.start() takes none")
        source = source.replace(RESULT_LINE, f"{RESULT_LINE}{start_options}, ", 1)
    # appended to main, whose last statement (saving the final model) follows start()
    source = source.rstrip("\n") + (
        "\n    import json as _json\n"
        f"    open({str(accuracy_file)!r}, 'w').write(_json.dumps({{int(r): float(m['accuracy']) for r, m in "
        "result.evaluate_metrics_serverapp.items()}))\n")
    return source


def without_mod(source: str) -> str:
    """``client_app.py`` with the ``report_train_seconds`` mod taken off its ClientApp."""
    if not MOD.search(source):
        raise SystemExit(f"the example's client_app.py has no {MOD.pattern[1:]!r}: update {Path(__file__).name}")
    return MOD.sub("app = ClientApp()", source)


def run_cell(example: str, strategy: str, run: int, client_mod: bool = True, start_options: str = "",
             cpus_per_client: int = 1) -> dict:
    """One ``asyncfl run`` of ``example`` with ``strategy`` swapped in; the cell with its accuracy curve."""
    module, nodes, overrides = EXAMPLES[example]
    if "{subset}" in overrides:
        overrides = overrides.replace("{subset}", str(fmnist_subset(HERE / ".fmnist-subset")))
    with tempfile.TemporaryDirectory() as folder:
        app = Path(folder) / example
        shutil.copytree(ROOT / "examples" / FOLDER.get(example, example), app,
                        ignore=shutil.ignore_patterns(".flwr", "*.pt", "outputs"))
        accuracy_file = Path(folder) / "accuracy.json"
        server_app = app / module
        server_app.write_text(swapped(server_app.read_text(), strategy, accuracy_file, start_options))
        client_app = server_app.with_name("client_app.py")
        if not client_mod:
            client_app.write_text(without_mod(client_app.read_text()))
        client_mod = bool(MOD.search(client_app.read_text()))
        if FOLDER.get(example, example) == "advanced-pytorch":
            overrides += f" save-dir='{Path(folder) / 'saved'}'"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "asyncfl.cli", "run", "--app", str(app), "--num-supernodes",
                               str(nodes), "--cpus-per-client", f"{cpus_per_client:g}", "-c", overrides],
                              capture_output=True, text=True, cwd=folder)
        seconds = time.perf_counter() - started
        output = done.stdout + done.stderr
        if done.returncode != 0 or not accuracy_file.exists():
            raise SystemExit(f"{example} / {strategy} run {run} failed (rc {done.returncode}):\n{output[-4000:]}")
        by_round = json.loads(accuracy_file.read_text())
    curve = [round(by_round[r], 4) for r in sorted(by_round, key=int)]
    # asyncfl's closing line: "... mean staleness S[, N dispatch(es) held for the next version]"
    closing = [line for line in output.splitlines() if "mean staleness" in line]
    staleness = re.search(r"mean staleness ([0-9.]+)", closing[-1]) if closing else None
    held = re.search(r"(\d+) dispatch\(es\) held", closing[-1]) if closing else None
    trained = re.search(r"jobs trained ([0-9.]+)s of a ([0-9.]+)s round trip", closing[-1]) if closing else None
    timing = {"client-train-s-mean": float(trained.group(1)), "job-round-trip-s-mean": float(trained.group(2))} \
        if trained else {}
    capped = re.search(r"jobs in flight capped at ([0-9.]+) \(mean; least (\d+)\)", closing[-1]) if closing else None
    if capped:
        timing.update({"in-flight-cap-mean": float(capped.group(1)), "in-flight-cap-min": int(capped.group(2))})
    return {"example": example, "strategy": strategy, "run": run, "curve": curve, "final": curve[-1],
            "cpus-per-client": cpus_per_client,
            "best": max(curve), "collapsed": collapsed(curve), "seconds": round(seconds, 1),
            "staleness-mean": float(staleness.group(1).rstrip(".")) if staleness else None,
            "held-dispatches": int(held.group(1)) if held else (0 if closing else None), "client-mod": client_mod,
            **({"start-options": start_options} if start_options else {}),
            **timing}


def table(rows: list[dict], reference_rows: list[dict] | None = None) -> str:
    """Markdown per example and strategy: mean final, gap to Flower's FedAvg (its cells in ``rows``, else in
    ``reference_rows``), worst run's gap, collapses, seconds."""
    lines = ["| example | strategy | final (mean ± sd) | − Flower FedAvg | worst run − FedAvg's mean | "
             "collapses | late swing | staleness | wall s per run | runs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for example in EXAMPLES:
        reference = [r["final"] for r in rows if r["example"] == example and r["strategy"] == "flower-fedavg"] or \
            [r["final"] for r in reference_rows or [] if r["example"] == example and r["strategy"] == "flower-fedavg"]
        ref = statistics.mean(reference) if reference else None
        for strategy in STRATEGIES:
            cells = [r for r in rows if r["example"] == example and r["strategy"] == strategy]
            if not cells:
                continue
            lines.append(f"| {example} | {strategy} | {row_figures(cells, ref)} | "
                         f"{statistics.mean(r['seconds'] for r in cells):.0f} | {len(cells)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--runs", type=int, default=5, help="runs per cell (the wall clock is not seeded)")
    parser.add_argument("--out", type=Path, default=HERE / "wall-clock")
    parser.add_argument("--table", action="store_true", help="only print the table of the stored cells")
    parser.add_argument("--no-client-mod", action="store_true",
                        help="take asyncfl's report_train_seconds mod out of the copy's ClientApp")
    parser.add_argument("--start-options", default="",
                        help="keywords for an asyncfl strategy's start(), as Python: \"concurrency=4\"")
    parser.add_argument("--cpus-per-client", type=int, default=1,
                        help="Ray CPUs per ClientApp (Flower's own default is 2: one actor on 2 cores)")
    parser.add_argument("--reference", type=Path, default=HERE / "wall-clock" / "cells.jsonl",
                        help="cells with Flower's FedAvg, where --out has none (default: wall-clock/cells.jsonl)")
    args = parser.parse_args()
    path = args.out / "cells.jsonl"
    done = {(r["example"], r["strategy"], r["run"]) for r in load(path)}
    # runs interleaved over strategies, so a stop part-way leaves every strategy with about as many runs
    todo = [(e, s, run) for e in args.examples for run in range(1, args.runs + 1) for s in args.strategies
            if (e, s, run) not in done]
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        for example, strategy, run in todo:
            row = run_cell(example, strategy, run, not args.no_client_mod, args.start_options, args.cpus_per_client)
            with path.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(f"{example:>18} {strategy:>14} run {run}: final {row['final']:.3f} best {row['best']:.3f}"
                  f"{' COLLAPSED' if row['collapsed'] else ''} ({row['seconds']} s)", flush=True)
    print(table(load(path), load(args.reference) if args.reference.exists() else None))


if __name__ == "__main__":
    main()
