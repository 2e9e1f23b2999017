"""What the measured pace costs the server per arrival, against the stable pace and a client's local job.

Everything runs in this one process, one measurement after another, on one thread, so the
ratios compare like with like:

* FedBuff (``B = 5``) with ``pace="stable"`` (no measurement) and ``pace="measured"`` (the
  default: one secant per arrival, six model copies kept; ``asyncfl/strategies/pace.py``),
  fed the same arrivals: models of the built-in CNN's size and of ResNet-18's (11.2 M entries),
  each arrival from a newer base version than the last (every arrival is measured). Server ms per arrival
  is the mean of ``on_arrival`` over ``--arrivals`` arrivals after a warm-up.
* One client's local job of the built-in app on the CNN (25 Adam steps of batch 32, FedRevive's
  Table 1 program), to put the per-arrival cost next to the work it answers.

Memory: the meter's copies (bytes) for each model size.

Usage::

    python benchmarks/pace_overhead.py [--arrivals 200]

Writes ``benchmarks/pace_overhead.json``.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from asyncfl.strategies.arrival import Arrival  # noqa: E402
from asyncfl.strategies.fedbuff import FedBuff  # noqa: E402


def entries(name: str, input_shape: tuple[int, int, int]) -> int:
    """Flat size of one of the zoo's models (parameters and BatchNorm statistics: what a strategy holds)."""
    from asyncfl.models import build_model

    return sum(t.numel() for t in build_model(name, input_shape, 10).state_dict().values())


def arrivals(size: int, count: int, seed: int = 0) -> list[Arrival]:
    """``count`` arrivals on a ``size``-entry model, base versions increasing (one new version per arrival)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(size).astype(np.float32)
    out = []
    for i in range(count):
        base = base + np.float32(1e-3) * rng.standard_normal(size).astype(np.float32)
        weights = base + np.float32(1e-2) * rng.standard_normal(size).astype(np.float32)
        out.append(Arrival(i % 8, i, 7, weights, base, 32, 0.5, float(i)))
    return out


def per_arrival_ms(pace: str, stream: list[Arrival], warmup: int = 10) -> float:
    strategy = FedBuff(pace=pace)
    strategy.on_start(num_clients=8, concurrency=8)
    current = stream[0].base.copy()
    for arrival in stream[:warmup]:
        strategy.on_arrival(arrival, current)
    started = time.perf_counter()
    for arrival in stream[warmup:]:
        new = strategy.on_arrival(arrival, current)
        if new is not None:
            current = new
    return 1000 * (time.perf_counter() - started) / (len(stream) - warmup)


def local_job_ms(steps: int = 25) -> float:
    """One client's job of the built-in app: ``steps`` Adam steps of batch 32 on the CNN."""
    from asyncfl.models import build_model

    net = build_model("cnn", (1, 28, 28), 10)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    return 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrivals", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job_ms = local_job_ms()
    results = {"machine": platform.processor() or platform.machine(), "threads": 1, "local-job-ms": round(job_ms, 2),
               "models": {}}
    for name, size, count in (("cnn", entries("cnn", (1, 28, 28)), args.arrivals),
                              ("resnet18", entries("resnet18", (3, 32, 32)), 40)):
        stream = arrivals(size, count)
        stable, measured = per_arrival_ms("stable", stream), per_arrival_ms("measured", stream)
        results["models"][name] = {
            "entries": size, "stable-ms": round(stable, 3), "measured-ms": round(measured, 3),
            "measured-over-stable": round(measured / stable, 2),
            "extra-ms-over-local-job": round((measured - stable) / job_ms, 4) if name == "cnn" else None,
            "meter-bytes": 6 * 4 * size}
        print(f"{name:>14} ({size:,} entries): stable {stable:.3f} ms, measured {measured:.3f} ms per arrival "
              f"({measured / stable:.2f}x); meter {6 * 4 * size / 2**20:.1f} MiB", flush=True)
    print(f"local job (CNN, 25 Adam steps of batch 32): {job_ms:.1f} ms")
    (HERE / "pace_overhead.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
