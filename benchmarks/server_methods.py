"""Server-side method cost, before and after, as a ratio to one client's local job (issue: server-side methods
at their cost bound).

Everything runs in this one process, on the same machine, one measurement after
another, so the ratios compare like with like:

* **FedEcho** (default knobs: |U| = 1000 resized digits, M = 5, Q = 10, batch 64) on the CNN: server ms per
  arrival spent inside ``on_arrival`` (logits of the arriving model on U, plus Q distillation steps every M
  arrivals), arrivals ``--arrival-gap`` seconds apart: the logits computed as before (chunks of 500), in
  cache-sized chunks of 64, and in chunks of 64 on the background thread (``overlap_logits``, the default);
  all three give the same logits and models (checked here, bit for bit). The passes the math needs are
  timed alone as the bound.
* **Server evaluation** of the CNN on the mnist5k test split (1000 samples; the built-in app evaluates every
  ``evaluate-every-time``): batch 500 (the old ``eval-batch-size``) vs 64 (the new default).
* **GI compensation** (LeNet-5, the intertwined scenario's client program: 5 epochs of SGD at batch 64 over
  a client's mnist5k samples, |D_rec| = 64, 100 iterations from a random start): one round with ``--stale``
  unique stale updates of real clients, inverted one at a time on one thread (before) and with
  ``inversion_workers = --workers`` (after); both give the same bits (checked here).
* Local jobs, on one thread: the CNN job (25 Adam steps of batch 32, FedRevive's Table 1 program and the
  default app's) for FedEcho and the evaluation, and GI's client program on LeNet-5 for GI.

Usage::

    python benchmarks/server_methods.py [--stale 4] [--workers 2] [--arrivals 20]

Writes ``benchmarks/server_methods/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.client_app.training import evaluate_per_class, train_local  # noqa: E402
from asyncfl.data import load_dataset, partition_indices  # noqa: E402
from asyncfl.data.unlabeled import distillation_inputs  # noqa: E402
from asyncfl.models import build_model  # noqa: E402
from asyncfl.models.flat import load_flat, model_to_flat  # noqa: E402
from asyncfl.models.inference import chunked_forward  # noqa: E402
from asyncfl.simulation.intertwined import most_holding  # noqa: E402
from asyncfl.strategies.base import Arrival  # noqa: E402
from asyncfl.strategies.fedecho import FedEcho  # noqa: E402
from asyncfl.strategies.gi.strategy import GICompensation  # noqa: E402
from asyncfl.strategies.gi.unrolled import LocalProgram  # noqa: E402
from timing import median_seconds  # noqa: E402

OLD_CHUNK = 500  # FedEcho's inference chunk and the default eval-batch-size before




class FedEchoOneBigChunk(FedEcho):
    """FedEcho as it was: the arriving model's logits on U in chunks of 500."""

    def client_logits(self, weights: np.ndarray) -> np.ndarray:
        return chunked_forward(load_flat(self.client_net, weights).eval(), self.unlabeled, OLD_CHUNK).numpy()


def fedecho_ms_per_arrival(cls, make_model, unlabeled, uploads, base, gap_s: float = 0.0,
                           **knobs) -> tuple[float, FedEcho]:
    """Mean ms the server spends inside ``on_arrival`` over ``uploads[5:]``, arrivals ``gap_s`` apart."""
    strategy = cls(make_model, unlabeled, seed=0, **knobs)
    current = base.copy()
    for client, weights in uploads[:5]:  # warm-up: one full buffer and one distillation
        current = _step(strategy, client, weights, base, current)
    inside = 0.0
    for client, weights in uploads[5:]:
        time.sleep(gap_s)  # the clients' time between arrivals, which the background pass can use
        started = time.perf_counter()
        current = _step(strategy, client, weights, base, current)
        inside += time.perf_counter() - started
    strategy.wait_for_logits()
    return 1000.0 * inside / len(uploads[5:]), strategy


def _step(strategy, client, weights, base, current):
    update = strategy.on_arrival(Arrival(client, 0, 0, weights, base, 100, 0.0, 0.0), current)
    return current if update is None else update


def fedecho_part(data, args, results) -> None:
    def make_model():
        return build_model("cnn", data.input_shape, data.num_classes)

    base_model = build_model("cnn", data.input_shape, data.num_classes, seed=0)
    base = model_to_flat(base_model)
    job_seconds, uploads = [], []
    for job in range(args.arrivals + 5 + 2):
        rows = partition_indices(data.y_train, job % 50, 50, "dirichlet", 0.5, 2, 42)
        model = load_flat(make_model(), base)
        started = time.perf_counter()
        train_local(model, data.x_train[rows], data.y_train[rows], steps=25, epochs=0, batch_size=32,
                    optimizer="adam", lr=1e-3, seed=job)
        job_seconds.append(time.perf_counter() - started)
        uploads.append((job % 50, model_to_flat(model)))
    job_ms = 1000.0 * float(np.median(job_seconds[2:]))
    uploads = uploads[2:]
    unlabeled = distillation_inputs("digits", data.x_train, data.y_train, 1000, 0)

    gap = args.arrival_gap
    before_ms, before = fedecho_ms_per_arrival(FedEchoOneBigChunk, make_model, unlabeled, uploads, base, gap,
                                               overlap_logits=False)
    after_ms, after = fedecho_ms_per_arrival(FedEcho, make_model, unlabeled, uploads, base, gap, overlap_logits=False)
    overlap_ms, overlap = fedecho_ms_per_arrival(FedEcho, make_model, unlabeled, uploads, base, gap)
    same_logits = all(np.array_equal(before.client_logits(w), after.client_logits(w)) for _, w in uploads[:3])
    same_model = all(np.array_equal(model_to_flat(before.student), model_to_flat(s.student)) for s in (after, overlap))

    net = load_flat(make_model(), uploads[0][1]).eval()
    inputs = torch.from_numpy(unlabeled)
    logits_old = median_seconds(lambda: chunked_forward(net, inputs, OLD_CHUNK), 5)
    logits_new = median_seconds(lambda: chunked_forward(net, inputs), 5)
    distill_ms = 1000.0 * median_seconds(lambda: after.distill(base), 3)
    bound_ms = 1000.0 * logits_new + distill_ms / after.config.buffer_size

    evaluate = {}
    for batch in (OLD_CHUNK, 64):
        evaluate[batch] = 1000.0 * median_seconds(
            lambda: evaluate_per_class(net, data.x_test, data.y_test, data.num_classes, batch), 5)

    results["cnn-local-job-ms"] = round(job_ms, 1)
    results["fedecho"] = {
        "setting": f"|U| = {len(unlabeled)}, M = {after.config.buffer_size}, Q = {after.config.distill_steps}, "
                   f"batch {after.config.distill_batch_size}, CNN; {len(uploads) - 5} timed arrivals",
        "arrival-gap-s": gap,
        "before-ms-per-arrival": round(before_ms, 1),
        "after-ms-per-arrival": round(after_ms, 1),
        "before-ratio-to-local-job": round(before_ms / job_ms, 3),
        "after-ratio-to-local-job": round(after_ms / job_ms, 3),
        "with-background-logits-ms-per-arrival": round(overlap_ms, 1),
        "with-background-logits-ratio-to-local-job": round(overlap_ms / job_ms, 3),
        "logits-on-U-ms": {"chunks-of-500": round(1000 * logits_old, 1), "chunks-of-64": round(1000 * logits_new, 1)},
        "distillation-ms-per-aggregation": round(distill_ms, 1),
        "passes-alone-ms-per-arrival": round(bound_ms, 1),
        "after-over-passes-alone": round(after_ms / bound_ms, 3),
        "same-logits-bits": bool(same_logits),
        "same-global-model-bits": bool(same_model),
    }
    results["server-evaluation"] = {
        "setting": f"CNN on the mnist5k test split ({len(data.y_test)} samples)",
        "batch-500-ms": round(evaluate[OLD_CHUNK], 1),
        "batch-64-ms": round(evaluate[64], 1),
        "batch-500-ratio-to-local-job": round(evaluate[OLD_CHUNK] / job_ms, 3),
        "batch-64-ratio-to-local-job": round(evaluate[64] / job_ms, 3),
    }
    print(json.dumps({k: results[k] for k in ("cnn-local-job-ms", "fedecho", "server-evaluation")}, indent=2),
          flush=True)


def gi_part(data, args, results) -> None:
    shape, classes = data.input_shape, data.num_classes
    program = LocalProgram(epochs=5, steps=0, batch_size=64, lr=0.01, momentum=0.5)
    indices = [partition_indices(data.y_train, i, 100, "dirichlet", 0.1, 2, 42) for i in range(100)]
    counts = np.array([np.bincount(data.y_train[ix], minlength=classes) for ix in indices])
    clients = [int(c) for c in most_holding(counts, 5, args.stale)]

    def make_model():
        return build_model("lenet5", shape, classes)

    stale_base = model_to_flat(build_model("lenet5", shape, classes, seed=0))
    job_seconds, arrivals = [], []
    for client in clients:
        rows = indices[client]
        model = load_flat(make_model(), stale_base)
        started = time.perf_counter()
        train_local(model, data.x_train[rows], data.y_train[rows], steps=0, epochs=program.epochs,
                    batch_size=program.batch_size, optimizer="sgd", lr=program.lr, momentum=program.momentum,
                    seed=client)
        job_seconds.append(time.perf_counter() - started)
        arrivals.append(Arrival(client, 0, 2, model_to_flat(model), stale_base, len(rows), 0.0, 0.0))
    job_ms = 1000.0 * float(np.median(job_seconds))
    current = (stale_base + np.mean([a.delta for a in arrivals], axis=0)).astype(np.float32)

    def one_round(workers: int, iterations: int = 100) -> tuple[float, list[np.ndarray], GICompensation]:
        strategy = GICompensation(make_model, shape, classes, program, uniqueness=False, inversion_workers=workers,
                                  inversion_iterations=iterations)
        started = time.perf_counter()
        deltas, _ = strategy.round_updates(arrivals, current)
        return time.perf_counter() - started, deltas, strategy

    one_round(1, iterations=3)  # warm-up: oneDNN primitives, the optimiser's first use
    one_round(args.workers, iterations=3)
    seconds_one, deltas_one, _ = one_round(1)
    seconds_many, deltas_many, strategy = one_round(args.workers)
    same = all(np.array_equal(a, b) for a, b in zip(deltas_one, deltas_many))
    per_one = 1000.0 * seconds_one / len(arrivals)
    per_many = 1000.0 * seconds_many / len(arrivals)
    results["gi"] = {
        "setting": f"LeNet-5, {len(arrivals)} unique stale updates in one round (the clients holding most of class 5, "
                   f"{', '.join(str(a.num_examples) for a in arrivals)} samples), |D_rec| <= 64, 100 iterations",
        "local-job-ms": round(job_ms, 1),
        "before-seconds-per-round": round(seconds_one, 2),
        "after-seconds-per-round": round(seconds_many, 2),
        "inversion-workers": args.workers,
        "before-ms-per-inversion": round(per_one, 1),
        "after-ms-per-inversion": round(per_many, 1),
        "before-ratio-to-local-job": round(per_one / job_ms, 1),
        "after-ratio-to-local-job": round(per_many / job_ms, 1),
        "speed-up": round(seconds_one / seconds_many, 2),
        "same-round-bits": bool(same),
        "inversions": strategy.inversions,
    }
    print(json.dumps(results["gi"], indent=2), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrivals", type=int, default=20, help="timed FedEcho arrivals (multiple of M = 5)")
    parser.add_argument("--arrival-gap", type=float, default=0.25,
                        help="seconds between FedEcho arrivals (the clients' time the background logit pass can use)")
    parser.add_argument("--stale", type=int, default=4, help="stale updates in the GI round")
    parser.add_argument("--workers", type=int, default=2, help="GI inversion workers (after)")
    parser.add_argument("--parts", default="fedecho,gi")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the built-in server's default (server-threads = 1); a Ray client actor's too
    data = load_dataset("mnist5k", "", 0.2, 42)
    results: dict = {"machine": f"{platform.machine()} {platform.processor() or ''}, "
                                f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}"}
    out = ROOT / "benchmarks" / "server_methods" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if "fedecho" in args.parts:
        fedecho_part(data, args, results)
        out.write_text(json.dumps(results, indent=2) + "\n")
    if "gi" in args.parts:
        gi_part(data, args, results)
        out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
