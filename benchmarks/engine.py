"""Engine benchmark (not a test): how close the Flower path gets to bare local training.

Measures, in one run on this machine:

(a) local-training throughput of the CNN in-process, one thread per worker:
    the ideal jobs/s of ``workers`` Ray workers;
(b) the async engine's accepted arrivals/s in a real Flower simulation with the
    same training (``flwr run`` through ``asyncfl run``), steady state, and the
    ratio b / (a * workers);
(c) server milliseconds per arrival of each strategy (decode + validate +
    strategy + re-encode), in-process with instant replies, CNN-sized model;
(d) peak server memory and arrivals/s in a Flower simulation with 1000 clients
    and 100 jobs in flight (the FedRevive paper's setting), light training.

Usage: ``.venv/bin/python benchmarks/engine.py [--quick]``; writes
``benchmarks/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.client_app.training import train_local  # noqa: E402
from asyncfl.data import load_dataset, partition_indices  # noqa: E402
from asyncfl.models import build_model  # noqa: E402
from asyncfl.server_app.codec import ModelCodec  # noqa: E402
from asyncfl.server_app.engine import AsyncEngine  # noqa: E402
from asyncfl.options import RunOptions  # noqa: E402
from asyncfl.server_app.evaluation import state_as_numpy  # noqa: E402
from asyncfl.strategies.registry import strategy_class  # noqa: E402
from asyncfl.strategies.resources import StrategyResources  # noqa: E402
from benchmarks.cpu_usage import TreeCpu, machine_busy_seconds  # noqa: E402
from benchmarks.run_timing import steady_arrivals_per_s, timing_rows  # noqa: E402


def _train_jobs(jobs: int) -> float:
    """Train ``jobs`` ClientApp-identical jobs on one thread; returns the seconds it took."""
    torch.set_num_threads(1)
    data = load_dataset("mnist5k", "", 0.2, 42)
    rows = partition_indices(data.y_train, 0, 50, "dirichlet", 0.5, 2, 42)
    model = build_model("cnn", data.input_shape, data.num_classes, seed=0)
    x, y = data.x_train[rows], data.y_train[rows]
    train_local(model, x, y, steps=25, epochs=0, batch_size=32, optimizer="adam", lr=1e-3)  # warm-up
    start = time.perf_counter()
    for job in range(jobs):
        train_local(model, x, y, steps=25, epochs=0, batch_size=32, optimizer="adam", lr=1e-3, seed=job)
    return time.perf_counter() - start


def ideal_jobs_per_second(jobs: int, workers: int) -> float:
    """(a) Jobs/s of ``workers`` processes training side by side, one thread each (25 Adam steps, batch 32).

    Measured concurrently, like the Ray workers, so shared memory bandwidth and
    clock limits count against the ideal too.
    """
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        seconds = pool.map(_train_jobs, [jobs] * workers)
    return workers * jobs / max(seconds)


def flower_run(tag: str, supernodes: int, overrides: str, out: Path) -> dict:
    """Run ``asyncfl run`` and return its summary, steady-state arrivals/s from timing.csv, and where the CPU went.

    CPU is split per command over the whole command and over the steady window: each
    new timing.csv row (an evaluation point) is paired with the CPU seconds every
    process had spent when the row was seen, so the window's CPU is the difference
    between its first and last rows' snapshots.
    """
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(ROOT), "--num-supernodes", str(supernodes),
               "-c", f"{overrides} output-dir='{out}' run-name='{tag}' progress=false"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    timing_path = out / tag / "timing.csv"
    rows_seen, snapshots = 0, []  # (arrivals, timing row's wall seconds, CPU by command, machine busy seconds)
    with TreeCpu({"run": process.pid}, period=0.5) as cpu:
        while process.poll() is None:
            if time.perf_counter() - started > 1200:
                process.kill()
                raise TimeoutError(f"{tag}: flwr run took over 1200 s")
            rows = timing_rows(timing_path)
            if len(rows) > rows_seen:
                busy = machine_busy_seconds()
                snapshots.append((*rows[-1], cpu.seconds_by_command("run"), busy))
                rows_seen = len(rows)
            time.sleep(0.5)
        if process.returncode != 0:
            raise subprocess.CalledProcessError(process.returncode, command)
    total = time.perf_counter() - started
    summary = json.loads((out / tag / "summary.json").read_text())
    timing = timing_rows(timing_path)
    total_arrivals = timing[-1][0]
    steady = steady_arrivals_per_s(timing, 0.1)
    return {"summary": summary, "steady-arrivals-per-s": steady, "process-seconds": total,
            "cpu-seconds": {"machine": cpu.seconds()["machine"], **cpu.seconds_by_command("run")},
            "steady-cpu-share": _steady_cpu_share(snapshots, 0.1 * total_arrivals)}


def _steady_cpu_share(snapshots: list, first_arrivals: float) -> dict:
    """CPU of the steady window: each command's share of all cores' time (and the idle share), per arrival."""
    steady = [s for s in snapshots if s[0] >= first_arrivals]
    if len(steady) < 2:
        return {}
    (arrivals0, wall0, cpu0, busy0), (arrivals1, wall1, cpu1, busy1) = steady[0], steady[-1]
    capacity = (wall1 - wall0) * (os.cpu_count() or 1)
    used = {name: seconds - cpu0.get(name, 0.0) for name, seconds in cpu1.items()}
    shares = {name: round(u / capacity, 3) for name, u in sorted(used.items(), key=lambda kv: -kv[1])
              if u / capacity >= 0.001}
    shares["idle"] = round(1.0 - (busy1 - busy0) / capacity, 3)
    arrivals = arrivals1 - arrivals0
    return {"seconds": round(wall1 - wall0, 2), "arrivals": arrivals, "share-of-cores": shares,
            "cpu-s-per-arrival": {name: round(u / max(arrivals, 1), 4) for name, u in used.items()
                                  if u / capacity >= 0.01}}


class InstantGrid:
    """Replies at once with base + small noise: measures the server's own cost."""

    def __init__(self, num_nodes: int) -> None:
        from flwr.app import Message, MetricRecord, RecordDict

        self._Message, self._MetricRecord, self._RecordDict = Message, MetricRecord, RecordDict
        self.nodes = list(range(1, num_nodes + 1))
        self.waiting = {}
        self.count = 0
        self.rng = np.random.default_rng(0)

    def get_node_ids(self):
        return self.nodes

    def push_messages(self, messages):
        ids = []
        for message in messages:
            self.count += 1
            mid = str(self.count)
            message.metadata.__dict__["_message_id"] = mid
            if message.metadata.message_type == "train":
                arrays = message.content.array_records["arrays"]
                content = self._RecordDict({"arrays": arrays, "metrics": self._MetricRecord({"num-examples": 80, "train-loss": 0.1})})
                self.waiting[mid] = self._Message(content, reply_to=message)
            else:
                from flwr.app import Error

                self.waiting[mid] = self._Message(Error(code=0, reason="no query"), reply_to=message)
            self.waiting[mid].metadata.__dict__["_src_node_id"] = message.metadata.dst_node_id
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.waiting.pop(i) for i in list(ids) if i in self.waiting]


def server_ms_per_arrival(arrivals: int) -> dict[str, float]:
    """(c) Server ms per arrival for each strategy, CNN-sized model, 10 in flight."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    state = state_as_numpy(model)
    codec = ModelCodec.from_state(state)
    from asyncfl.run_config_args import app_defaults

    # the built-in app's defaults (pyproject.toml), as a default run would configure each strategy
    run_config = app_defaults(ROOT)
    names = ("fedavg", "fedasync", "fedbuff", "afl-dw", "ca2fl", "fadas", "fedfa", "fedadt", "fedecho")
    distilling = {"fedadt", "fedecho"}  # ~100x the server work per arrival: fewer arrivals suffice
    data = load_dataset("mnist5k", "", 0.2, 42)
    resources = StrategyResources(lambda: build_model("cnn", (1, 28, 28), 10), data.x_train, data.y_train, 0)
    out = {}
    for name in names:
        cls = strategy_class(name)
        strategy = cls.from_config(cls.config_class.from_run_config(run_config), resources)
        # the engine alone: no evaluation, no update bound (its cost is measured on its own)
        config = RunOptions(clock="virtual", max_arrivals=max(20, arrivals // 10) if name in distilling else arrivals,
                            evaluate_every=0, evaluate_every_time=1e9, delay_model="fedrevive-default",
                            update_norm_bound=0.0).engine_config(num_rounds=0, timeout=60.0, concurrency=10,
                                                                 round_arrivals=0, node_wait=0.0)
        engine = AsyncEngine(InstantGrid(50), strategy, codec, codec.flatten(list(state.values())),
                             config, {}, lambda m: (0.0, 0.0))
        stats = engine.run()
        out[name] = 1000 * stats.server_seconds / stats.arrivals
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer arrivals (a smoke run of the benchmark)")
    parser.add_argument("--parts", default="abcd", help="which measurements to take (default: abcd)")
    args = parser.parse_args()
    workers = 2  # Ray workers: one CPU each on this 2-core machine
    arrivals = 60 if args.quick else 200
    results: dict = {"machine": {"cpus": torch.get_num_threads(), "torch": torch.__version__}}

    ideal_total = ideal_jobs_per_second(10 if args.quick else 40, workers)
    ideal = ideal_total / workers
    results["a-ideal-jobs-per-s-per-worker"] = ideal
    print(f"(a) ideal: {ideal_total:.2f} jobs/s for {workers} concurrent single-thread trainers ({ideal:.2f} each)")
    if "c" in args.parts:
        results["c-server-ms-per-arrival"] = server_ms_per_arrival(200 if args.quick else 1000)
        job_ms = 1000.0 / ideal  # one client's local training on one thread
        results["c-ratio-to-one-local-job"] = {n: ms / job_ms for n, ms in results["c-server-ms-per-arrival"].items()}
        for name, ms in results["c-server-ms-per-arrival"].items():
            print(f"(c) {name:<9} {ms:.3f} ms per arrival (CNN, 421k parameters) = {ms / job_ms:.4f} of a local job")
    if "b" in args.parts:
        flower_simulation_ratio(results, arrivals, ideal, workers)
    if "d" in args.parts:
        many_clients(results, arrivals)
    name = "results.json" if set(args.parts) == set("abcd") else f"results-{args.parts}.json"
    (ROOT / "benchmarks" / name).write_text(json.dumps(results, indent=2))


def flower_simulation_ratio(results: dict, arrivals: int, ideal: float, workers: int) -> None:
    """(b) steady arrivals/s through ``flwr run`` against the ideal of (a), and where the CPU went."""
    with tempfile.TemporaryDirectory() as tmp:
        run = flower_run("bench-cnn", 50, f"max-arrivals={arrivals} concurrency=10 evaluate-every-time=5.0", Path(tmp))
    ratio = run["steady-arrivals-per-s"] / (ideal * workers)
    results["b-flower-arrivals-per-s"] = run["steady-arrivals-per-s"]
    results["b-ratio"] = ratio
    results["b-process-seconds"] = run["process-seconds"]
    results["b-cpu-seconds"] = run["cpu-seconds"]  # per command name over the whole run, and the machine's
    print(f"(b) flower simulation: {run['steady-arrivals-per-s']:.2f} arrivals/s steady; ratio b/(a*workers) = {ratio:.3f}")
    window = run["steady-cpu-share"]
    results["b-steady-window"] = window  # share of all cores per command, CPU s per arrival
    print(f"(b) CPU seconds: {run['cpu-seconds']}")
    if window:
        # ratio = (the actors' share of the cores) x (the ideal's CPU per job / an actor's CPU per job)
        actor_share = window["share-of-cores"].get("ray::ClientAppA", 0.0)
        actor_job_s = window["cpu-s-per-arrival"].get("ray::ClientAppA", float("nan"))
        handler_s = run["summary"].get("client-train-s-mean", float("nan"))
        results["b-explained"] = {
            "actors-share-of-cores": actor_share,
            "ideal-cpu-s-per-job": round(1.0 / ideal, 4),
            "actor-cpu-s-per-job": actor_job_s,
            "clientapp-handler-s-per-job": handler_s,
            "predicted-ratio": round(actor_share * (1.0 / ideal) / actor_job_s, 3),
        }
        print(f"(b) steady window: {window}")
        print(f"(b) explained: {results['b-explained']}")


def many_clients(results: dict, arrivals: int) -> None:
    """(d) 1000 clients, 100 in flight: arrivals/s, server memory, stored versions."""
    with tempfile.TemporaryDirectory() as tmp:
        large = flower_run("bench-1000", 1000, f"max-arrivals={arrivals * 2} concurrency=100 partitioning='iid' "
                                                "local-steps=1 evaluate-every-time=1.0", Path(tmp))
    results["d-1000-clients"] = {
        "arrivals-per-s": large["steady-arrivals-per-s"],
        "server-peak-rss-mb": large["summary"].get("server-peak-rss-mb"),
        "peak-stored-versions": large["summary"].get("peak-stored-versions"),
        "server-ms-per-arrival": large["summary"].get("server-ms-per-arrival"),
        "process-seconds": large["process-seconds"],
    }
    print(f"(d) 1000 clients, 100 in flight: {large['steady-arrivals-per-s']:.2f} arrivals/s, server peak RSS "
          f"{results['d-1000-clients']['server-peak-rss-mb']} MB, peak stored versions "
          f"{results['d-1000-clients']['peak-stored-versions']}")


if __name__ == "__main__":
    main()
