"""How well does gradient inversion turn a stale update into the unstale one? (the GI paper's Fig. 4, Tables 4 and 6)

In process, no Flower: a FedAvg trajectory of LeNet-5 on ``mnist5k`` (100
Dirichlet-alpha clients, 10 per round, the clients' SGD program) is trained
and kept; for the client holding most samples of the affected class, at round
``T`` and staleness ``tau`` we compute

* the stale update ``LocalUpdate(w^{T-tau}) - w^{T-tau}`` and the true one ``LocalUpdate(w^T) - w^T``
  (same data, same batch order),
* estimates of the true update: the raw stale update, DC-ASGD (lambda 4, the authors' value) and
  gradient inversion at several iteration budgets and top-K shares,

and report relative L1 error ``|est - true|_1 / |true|_1`` and cosine distance,
with the seconds each inversion took (error vs compute). The privacy check
compares recovered inputs with the client's real samples (nearest-neighbour
MSE) and asks a trained model whether it recognises them, at 0% and 95%
sparsification, against random-noise inputs.

``--rec-sizes`` instead sweeps ``|D_rec|`` as a share of the client's data at
the largest staleness (the paper's Appendix D, Tables 17-18: GI loss and time
vs that share, which it settles at 1/2): final disparity, seconds and the
estimate's error for each share.

Usage::

    python benchmarks/gi_error.py --out benchmarks/gi/error.json
    python benchmarks/gi_error.py --staleness 40 --budgets 100 --rec-sizes 1/64,1/16,1/4,1/2,1,2 \
        --out benchmarks/gi/rec_size.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

from asyncfl.client_app.training import train_local
from asyncfl.data import load_dataset
from asyncfl.data.partition import partition_indices
from asyncfl.models import build_model
from asyncfl.models.flat import load_flat, model_to_flat
from asyncfl.simulation.intertwined import most_holding
from asyncfl.strategies.gi.inversion import InversionConfig, invert_update, random_recovered_set, replay_update
from asyncfl.strategies.gi.uniqueness import cosine_distance
from asyncfl.strategies.gi.unrolled import FlatLayout, LocalProgram
from asyncfl.strategies.stale_compensation import dc_asgd_compensation

CPU = torch.device("cpu")


def local_update(model, flat, x, y, program: LocalProgram, seed: int) -> np.ndarray:
    load_flat(model, flat)
    train_local(model, x, y, steps=program.steps, epochs=program.epochs, batch_size=program.batch_size,
                optimizer="sgd", lr=program.lr, momentum=program.momentum, weight_decay=program.weight_decay,
                seed=seed, device=CPU)
    return model_to_flat(model) - flat


def fedavg_trajectory(model, flat0, clients, program, rounds, per_round, seed) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    trajectory = [flat0]
    for r in range(rounds):
        chosen = rng.choice(len(clients), size=per_round, replace=False)
        updates = [local_update(model, trajectory[-1], *clients[c], program, seed=1000 * r + int(c)) for c in chosen]
        sizes = np.array([len(clients[c][1]) for c in chosen], dtype=np.float64)
        trajectory.append(trajectory[-1] + np.sum([w * u for w, u in zip(sizes / sizes.sum(), updates)], axis=0)
                          .astype(np.float32))
    return trajectory


def errors(estimate: np.ndarray, true: np.ndarray) -> dict[str, float]:
    return {"rel-l1": round(float(np.abs(estimate - true).sum() / np.abs(true).sum()), 4),
            "cos-dist": round(cosine_distance(estimate, true), 4)}


def privacy(recovered_x: np.ndarray, client_x: np.ndarray, classifier, labels: np.ndarray) -> dict[str, float]:
    flat_rec = recovered_x.reshape(len(recovered_x), -1)
    flat_real = client_x.reshape(len(client_x), -1)
    distances = ((flat_rec[:, None, :] - flat_real[None, :, :]) ** 2).mean(axis=2)
    with torch.no_grad():
        predicted = classifier(torch.from_numpy(recovered_x)).argmax(1).numpy()
    return {"nn-mse": round(float(distances.min(axis=1).mean()), 4),
            "classifier-agrees-with-label": round(float((predicted == labels).mean()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--staleness", default="5,10,20,40")
    parser.add_argument("--budgets", default="25,50,100,200", help="inversion iterations to compare")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--affected-class", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/gi/error.json"))
    parser.add_argument("--rec-sizes", default="",
                        help="sweep |D_rec| as these shares of the client's data (e.g. 1/16,1/2,2) instead")
    parser.add_argument("--keep", type=float, default=1.0, help="top-K share kept in the disparity (--rec-sizes)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    splits = load_dataset("mnist5k", "", 0.2, 42)
    indices = [partition_indices(splits.y_train, i, 100, "dirichlet", args.alpha, 2, 42) for i in range(100)]
    clients = [(splits.x_train[ix], splits.y_train[ix]) for ix in indices if len(ix)]
    counts = np.array([np.bincount(y, minlength=10) for _, y in clients])
    target = int(most_holding(counts, args.affected_class, 1)[0])
    x_i, y_i = clients[target]
    program = LocalProgram(epochs=args.epochs, steps=0, batch_size=args.batch_size, lr=0.01, momentum=0.5)
    model = build_model("lenet5", (1, 28, 28), 10, seed=args.seed)
    layout = FlatLayout(build_model("lenet5", (1, 28, 28), 10))
    started = time.perf_counter()
    trajectory = fedavg_trajectory(model, model_to_flat(model), clients, program, args.rounds, 10, args.seed)
    out: dict = {"setting": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                             "client-samples": int(len(y_i)), "client-class-counts": counts[target].tolist(),
                             "replayed-steps": program.total_steps(len(y_i)),
                             "trajectory-seconds": round(time.perf_counter() - started, 1)}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    current = trajectory[-1]
    true = layout.param_vector(local_update(model, current, x_i, y_i, program, seed=7))
    if args.rec_sizes:
        rec_size_sweep(args, out, layout, model, trajectory, x_i, y_i, program, true)
    else:
        staleness_table(args, out, layout, model, trajectory, x_i, y_i, program, true)
    out["total-seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(out, indent=2))


def parse_share(text: str) -> float:
    """``'1/16'`` or ``'0.5'`` or ``'2'`` as a float."""
    numerator, _, denominator = text.partition("/")
    return float(numerator) / float(denominator or 1)


def gi_estimate(layout, base, current, stale, program, num_examples, config, seed):
    """Invert the stale update from ``base``, then replay the recovered set from ``current``:
    ``(inversion result, estimated unstale update)``."""
    params, buffers = layout.split(base)
    result = invert_update(layout.model, params, buffers, torch.from_numpy(stale), program, num_examples,
                           (1, 28, 28), 10, config, torch.Generator().manual_seed(seed))
    cur_params, cur_buffers = layout.split(current)
    estimate = replay_update(layout.model, cur_params, cur_buffers, result.recovered, program, num_examples).numpy()
    return result, estimate


def rec_size_sweep(args, out, layout, model, trajectory, x_i, y_i, program, true) -> None:
    """GI from the stale update at the largest staleness with ``|D_rec|`` = each share of the client's data;
    ``out["rec-size"]`` gets a row per share (written as it comes) and the raw stale update's error last."""
    tau = max(int(t) for t in args.staleness.split(","))
    iterations = max(int(b) for b in args.budgets.split(","))
    base, current = trajectory[-1 - tau], trajectory[-1]
    stale = layout.param_vector(local_update(model, base, x_i, y_i, program, seed=7))
    rows = out["rec-size"] = []
    for share_text in args.rec_sizes.split(","):
        config = InversionConfig(iterations=iterations, keep_fraction=args.keep, rec_fraction=parse_share(share_text),
                                 max_rec=10 * len(y_i))
        result, estimate = gi_estimate(layout, base, current, stale, program, len(y_i), config, tau)
        rows.append({"share": share_text, "rec-size": len(result.recovered), "tau": tau, "iterations": iterations,
                     "keep": args.keep, "seconds": round(result.seconds, 2), "gi-loss": round(result.disparity, 6),
                     "fit": round(result.disparity / result.initial_disparity, 4), **errors(estimate, true)})
        print(rows[-1], flush=True)
        args.out.write_text(json.dumps(out, indent=2))
    rows.append({"share": "raw stale update", **errors(stale, true)})


def staleness_table(args, out, layout, model, trajectory, x_i, y_i, program, true) -> None:
    """Raw stale, DC-ASGD and GI (every budget, 5% and all coordinates) vs the true update, per staleness."""
    current = trajectory[-1]
    out["by-staleness"] = []
    for tau in [int(t) for t in args.staleness.split(",")]:
        base = trajectory[-1 - tau]
        stale_full = local_update(model, base, x_i, y_i, program, seed=7)
        stale = layout.param_vector(stale_full)
        dc = layout.param_vector(dc_asgd_compensation(stale_full, current, base, 4.0))
        row = {"tau": tau, "raw-stale": errors(stale, true), "dc-asgd": errors(dc, true), "gi": []}
        for keep in (0.05, 1.0):
            for budget in [int(b) for b in args.budgets.split(",")]:
                config = InversionConfig(iterations=budget, keep_fraction=keep)
                result, estimate = gi_estimate(layout, base, current, stale, program, len(y_i), config, tau)
                row["gi"].append({"keep": keep, "iterations": budget, "seconds": round(result.seconds, 2),
                                  "fit": round(result.disparity / result.initial_disparity, 4),
                                  **errors(estimate, true)})
                print(tau, keep, budget, row["gi"][-1], flush=True)
                if tau == max(int(t) for t in args.staleness.split(",")) and budget == max(
                        int(b) for b in args.budgets.split(",")):
                    classifier = copy.deepcopy(model)
                    load_flat(classifier, current)
                    classifier.eval()
                    rec = result.recovered
                    labels = rec.label_logits.argmax(1).numpy()
                    noise = random_recovered_set(len(rec), (1, 28, 28), 10, torch.Generator().manual_seed(99))
                    out.setdefault("privacy", {})[f"keep-{keep:g}"] = privacy(rec.inputs.numpy(), x_i, classifier, labels)
                    out["privacy"]["random-noise"] = privacy(noise.inputs.numpy(), x_i, classifier, labels)
        print(tau, "raw", row["raw-stale"], "dc", row["dc-asgd"], flush=True)
        out["by-staleness"].append(row)
        args.out.write_text(json.dumps(out, indent=2))

if __name__ == "__main__":
    main()
