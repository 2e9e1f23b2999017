"""FedRevive's server overhead per arrival, split into probing, synthesis and distillation (its App. C).

Everything runs in this one process on the same thread budget, so the ratios
compare like with like: one client's local job (the Table 1 setting: BN CNN,
25 Adam steps of batch 32 on a Dirichlet-0.5 partition of mnist5k) against
FedRevive's work per arrival with c = 8 trained teachers, T_gen = 10,
K_synth = 2 (batch 64), K_KD = 10 (batch 32 per teacher). Teachers are real
client models (trained from a common start), so BatchNorm statistics and the
proxies see realistic inputs.

Steady state per arrival = KD update + synthesis round / T_gen (probing stops
after a client's first T_est = 2 uploads; its cost is reported per probe).
Memory: the strategy's state (teachers, generator, KD pool, proxies) in bytes
for 200 and for 2000 clients.

Usage::

    python benchmarks/fedrevive_overhead.py [--threads 1] [--arrivals 60] [--kd-batch-size 32]

Writes ``benchmarks/fedrevive/overhead.json`` (``overhead-kd4.json`` for ``--kd-batch-size 4``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.client_app.training import train_local  # noqa: E402
from asyncfl.data import load_dataset, partition_indices  # noqa: E402
from asyncfl.models import build_model  # noqa: E402
from asyncfl.models.flat import load_flat, model_to_flat  # noqa: E402
from asyncfl.strategies.base import Arrival  # noqa: E402
from asyncfl.strategies.fedrevive import FedRevive  # noqa: E402


def _state_bytes(strategy: FedRevive) -> int:
    """Bytes of the strategy's tensors and arrays: teachers, student, probe net, generator, pool, proxies."""
    nets = [strategy.student, strategy.probe_net, strategy.generator, *strategy._teacher_nets]
    total = sum(t.numel() * t.element_size() for net in nets for t in [*net.parameters(), *net.buffers()])
    if strategy.pool.x is not None:
        total += strategy.pool.x.numel() * 4 + strategy.pool.y.numel() * 8
    total += strategy.proxies.probe.numel() * 4 + sum(v.nbytes for v in strategy.proxies._sum.values())
    return int(total)


def _kd_passes_ms(strategy: FedRevive, current: np.ndarray, repeats: int = 3) -> dict[str, float]:
    """The network passes one KD update is made of, each kind alone (median ms of ``repeats``): every
    teacher's minibatch through its teacher without gradients, and every minibatch through the student
    with one backward, as the strategy computes them; no Adam, no pool sampling, no loss.

    In line a KD update costs at least their sum; with the teachers on the background thread and a
    core for it, at least the larger of the two (Step 4 of the paper's KD-Revive: ``K_KD`` steps of
    ``c`` teacher minibatches).
    """
    teachers = [net for _, net in strategy._buffer]
    proportions = [strategy._proportions(c) for c, _ in strategy._buffer]
    rng = np.random.default_rng(0)
    batches = [strategy.pool.sample(p, strategy.config.kd_batch_size, rng) for p in proportions]
    student = strategy.make_model().eval()
    load_flat(student, current)

    def teacher_passes() -> None:
        for _ in range(strategy.config.kd_steps):
            with torch.no_grad():
                for teacher, batch in zip(teachers, batches):
                    teacher(batch)

    def student_passes() -> None:
        for _ in range(strategy.config.kd_steps):
            torch.stack([student(batch).sum() for batch in batches]).sum().backward()

    seconds: dict[str, list[float]] = {"teachers": [], "student": []}
    for _ in range(repeats + 1):
        for name, passes in (("teachers", teacher_passes), ("student", student_passes)):
            started = time.perf_counter()
            passes()
            seconds[name].append(time.perf_counter() - started)
    return {name: 1000.0 * float(np.median(values[1:])) for name, values in seconds.items()}


def _kd_update_ms_by_teacher_placement(strategy: FedRevive, current: np.ndarray, repeats: int = 3) -> dict[str, float]:
    """One KD update (``strategy.distil``) with the teachers' passes in line and on the background thread
    (``overlap_teachers``), interleaved, median ms of ``repeats`` each; checks both give the same bits."""
    thread = strategy._teacher_thread
    seconds: dict[str, list[float]] = {"in-line": [], "background-thread": []}
    results = {}
    for _ in range(repeats + 1):
        for placement, worker in (("in-line", None), ("background-thread", thread)):
            strategy._teacher_thread = worker
            strategy._np_rng = np.random.default_rng([0, 9])  # the same minibatches for both placements
            started = time.perf_counter()
            results[placement] = strategy.distil(current)
            seconds[placement].append(time.perf_counter() - started)
    strategy._teacher_thread = thread
    if not np.array_equal(results["in-line"], results["background-thread"]):
        raise AssertionError("teacher passes on the background thread changed the KD update")
    return {k: 1000.0 * float(np.median(v[1:])) for k, v in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a Ray client actor uses 1)")
    parser.add_argument("--arrivals", type=int, default=60, help="timed arrivals (all past warm-up)")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--kd-batch-size", type=int, default=32,
                        help="per-teacher KD minibatch (32 = the paper's text; 4 = its App. C FLOPs count)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset("mnist5k", "", 0.2, 42)
    shape, classes = data.input_shape, data.num_classes

    def make_model():
        return build_model("cnn", shape, classes, batchnorm=True)

    start_model = build_model("cnn", shape, classes, batchnorm=True, seed=0)
    train_local(start_model, data.x_train[:512], data.y_train[:512], steps=50, epochs=0, batch_size=32,
                optimizer="adam", lr=1e-3)
    base = model_to_flat(start_model)

    # Client jobs (also the teachers): the Table 1 local program, timed.
    job_seconds, uploads = [], []
    for job in range(args.arrivals + 8):
        client = job % args.clients
        rows = partition_indices(data.y_train, client, args.clients, "dirichlet", 0.5, 2, 42)
        model = load_flat(make_model(), base)
        started = time.perf_counter()
        train_local(model, data.x_train[rows], data.y_train[rows], steps=25, epochs=0, batch_size=32,
                    optimizer="adam", lr=1e-3, seed=job)
        job_seconds.append(time.perf_counter() - started)
        uploads.append((client, model_to_flat(model)))
    job_ms = 1000.0 * float(np.median(job_seconds[2:]))

    knobs = dict(synthesis_start=0, kd_start=0, kd_batch_size=args.kd_batch_size)
    strategy = FedRevive(make_model, classes, shape, seed=0, **knobs)
    strategy.on_start(args.clients)
    current = base.copy()
    for client, weights in uploads[:8]:  # fill the teacher buffer and the pool (untimed)
        current = strategy.on_arrival(Arrival(client, 0, 20, weights, base, 100, 0.0, 0.0), current)
    for key in strategy.seconds:
        strategy.seconds[key] = 0.0
    rounds0, kd0 = strategy.synthesis_rounds, strategy.kd_updates
    probes0 = sum(strategy.proxies._count.values())
    for client, weights in uploads[8:]:
        current = strategy.on_arrival(Arrival(client, 0, 20, weights, base, 100, 0.0, 0.0), current)
    rounds = strategy.synthesis_rounds - rounds0
    kd = strategy.kd_updates - kd0
    probes = sum(strategy.proxies._count.values()) - probes0
    probe_ms = 1000.0 * strategy.seconds["probing"] / max(probes, 1)
    synthesis_ms = 1000.0 * strategy.seconds["synthesis"] / max(rounds, 1)
    kd_ms = 1000.0 * strategy.seconds["distillation"] / max(kd, 1)
    steady_ms = kd_ms + synthesis_ms / strategy.config.synthesis_every
    passes_ms = _kd_passes_ms(strategy, current)
    placement_ms = _kd_update_ms_by_teacher_placement(strategy, current)

    memory = {}
    for clients in (200, 2000):  # the proxies grow with clients; everything else is fixed
        sized = FedRevive(make_model, classes, shape, seed=0, **knobs)
        sized.on_start(clients)
        sized.pool = strategy.pool
        for client in range(clients):
            sized.proxies._sum[client] = np.zeros(classes)
        memory[str(clients)] = _state_bytes(sized)

    results = {
        "machine": f"{platform.machine()} {platform.processor() or ''} torch threads={args.threads}".strip(),
        "local-job-ms": round(job_ms, 1),
        "probe-ms-per-probe": round(probe_ms, 2),
        "synthesis-ms-per-round": round(synthesis_ms, 1),
        "kd-ms-per-update": round(kd_ms, 1),
        "steady-ms-per-arrival": round(steady_ms, 1),
        "ratio-steady-to-local-job": round(steady_ms / job_ms, 2),
        "ratio-kd-to-local-job": round(kd_ms / job_ms, 2),
        "ratio-synthesis-round-to-local-job": round(synthesis_ms / job_ms, 2),
        "kd-teacher-passes-alone-ms-per-update": round(passes_ms["teachers"], 1),
        "kd-student-passes-alone-ms-per-update": round(passes_ms["student"], 1),
        "ratio-kd-to-its-passes-in-line": round(kd_ms / (passes_ms["teachers"] + passes_ms["student"]), 3),
        "ratio-kd-to-its-student-passes": round(kd_ms / passes_ms["student"], 3),
        "kd-ms-per-update-teachers-in-line": round(placement_ms["in-line"], 1),
        "kd-ms-per-update-teachers-on-background-thread": round(placement_ms["background-thread"], 1),
        "ratio-kd-to-local-job-teachers-in-line": round(placement_ms["in-line"] / job_ms, 2),
        "ratio-kd-to-local-job-teachers-on-background-thread": round(placement_ms["background-thread"] / job_ms, 2),
        "kd-batch-size": args.kd_batch_size,
        "timed": {"arrivals": len(uploads) - 8, "synthesis-rounds": rounds, "kd-updates": kd, "probes": probes},
        "state-bytes-by-clients": memory,
        "pool-size": len(strategy.pool),
    }
    suffix = "" if args.kd_batch_size == 32 else f"-kd{args.kd_batch_size}"
    out = ROOT / "benchmarks" / "fedrevive" / f"overhead{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
