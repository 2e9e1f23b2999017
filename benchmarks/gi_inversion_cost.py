"""What one gradient-inversion iteration costs against the passes its unrolled local program needs.

One iteration of GI compensation's inversion (``asyncfl.strategies.gi.inversion.invert_update``)
replays the client's local program on ``D_rec`` with a graph (S SGD steps, each a forward and a
backward that keeps its graph), then differentiates the top-K disparity through all of it back to
``D_rec`` (a second-order backward), then takes an Adam step on ``D_rec``. Its floor is the passes
that program requires: S forward + S backward passes with graph + the backward through them.
This script times, on one thread, in one process, for the gi-fmnist study's program (LeNet-5, 5
full-batch SGD steps):

- ``plain``: S training steps (forward + backward, no graph) on ``D_rec``: the first-order work;
- ``floor``: the replay with graph and one backward of a scalar through it, as bare torch calls
  (``torch.func.functional_call``, no Adam, no top-K): the passes an iteration cannot avoid;
- ``ours``: one iteration of ``invert_update`` (mean of ``--iterations``).

and reports ``ours / floor`` (what asyncfl adds) and ``floor / plain`` (what second order costs).

Usage::

    python benchmarks/gi_inversion_cost.py                  # |D_rec| 64, 5 steps: the gi-fmnist study's
    python benchmarks/gi_inversion_cost.py --rec 600        # the paper preset's |D_rec| (half of 1,200)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.func import functional_call

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.models import build_model  # noqa: E402
from asyncfl.strategies.gi.inversion import InversionConfig, invert_update  # noqa: E402
from asyncfl.strategies.gi.unrolled import LocalProgram, flatten_params, soft_cross_entropy  # noqa: E402
from timing import median_seconds  # noqa: E402


def _timed(fn, repeats: int) -> float:
    return median_seconds(fn, repeats)  # one warm-up call: allocator and autograd caches


def measure(rec: int, steps: int, iterations: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    names = list(params)
    inputs = torch.randn(rec, 1, 28, 28)
    targets = torch.softmax(torch.randn(rec, 10), dim=1)
    lr = 0.1

    def plain() -> None:
        current = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        for _ in range(steps):
            loss = soft_cross_entropy(functional_call(model, {**current, **buffers}, (inputs,)), targets)
            grads = torch.autograd.grad(loss, list(current.values()))
            current = {n: (p - lr * g).detach().requires_grad_(True) for (n, p), g in zip(current.items(), grads)}

    def floor() -> None:
        x = inputs.clone().requires_grad_(True)
        start = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        current = start
        for _ in range(steps):
            loss = soft_cross_entropy(functional_call(model, {**current, **buffers}, (x,)), targets)
            grads = torch.autograd.grad(loss, list(current.values()), create_graph=True)
            current = {n: p - lr * g for (n, p), g in zip(current.items(), grads)}
        disparity = (flatten_params(current, names) - flatten_params(start, names)).abs().mean()
        torch.autograd.grad(disparity, [x])

    program = LocalProgram(epochs=0, steps=steps, batch_size=60000, lr=lr)
    target = torch.randn(sum(p.numel() for p in params.values())) * 1e-3
    config = InversionConfig(rec_fraction=1.0, max_rec=rec, iterations=iterations, warm_iterations=iterations)

    def ours() -> float:
        result = invert_update(model, params, buffers, target, program, rec, (1, 28, 28), 10, config,
                               torch.Generator().manual_seed(0))
        return result.seconds / iterations

    ours()  # warm-up
    per_iteration = statistics.median(ours() for _ in range(repeats))
    t_plain, t_floor = _timed(plain, repeats), _timed(floor, repeats)
    return {"rec": rec, "steps": steps, "threads": 1, "plain-ms": round(1000 * t_plain, 2),
            "floor-ms": round(1000 * t_floor, 2), "ours-ms-per-iteration": round(1000 * per_iteration, 2),
            "ours-over-floor": round(per_iteration / t_floor, 3), "floor-over-plain": round(t_floor / t_plain, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rec", type=int, default=64, help="|D_rec| (default 64: the gi-fmnist study's)")
    parser.add_argument("--steps", type=int, default=5, help="local SGD steps replayed (default 5: the reference's)")
    parser.add_argument("--iterations", type=int, default=10, help="inversion iterations timed per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.rec, args.steps, args.iterations, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
