"""Probe: can the direction of an update tell a sign-flipped one from an honest one? (issue 42)

Runs one drop-in cell with a direction check wrapped around the engine's update-norm bound (a
probe, not a shipped defence): the cosine of each arriving update (trained entries) with a
running mean of the accepted updates' unit directions (decay 15/16), kept per node. With
``--threshold T --min-updates K``, a node whose mean cosine over at least K updates is below T has
its updates rejected (reason ``update-direction``); without ``--threshold`` nothing is rejected
and the cosines are only recorded. Writes ``<out>/<setting>_<strategy>_<seed>_<attack>.json``
(final accuracy, each arrival's node, staleness, cosine, refused) and prints the final accuracy,
the refusals per node and the share of negative cosines by quarter of the run.

Usage::

    .venv/bin/python benchmarks/dropin/direction_probe.py sgdm-0.05 fedasync 1 none
    .venv/bin/python benchmarks/dropin/direction_probe.py sgdm-0.05 fedasync 3 sign-flip --threshold -0.1 --min-updates 5
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import run as dropin  # noqa: E402
from asyncfl.server_app import participants as update_bound  # noqa: E402
from asyncfl.server_app.codec import RejectedReply  # noqa: E402

DECAY = 15 / 16


def install(threshold: float | None, min_updates: int, log: list) -> None:
    """Wrap ``UpdateNormBound.apply`` with the direction check (the bound itself runs unchanged after it)."""
    bound_apply = update_bound.UpdateNormBound.apply

    def apply(self, arrival):
        if not hasattr(self, "probe_reference"):
            self.probe_reference, self.probe_nodes = None, collections.defaultdict(list)
        mask = self.groups[0]
        delta = arrival.delta if mask is None else arrival.delta[mask]
        norm = float(np.linalg.norm(delta))
        reference, cosine = self.probe_reference, None
        if reference is not None and norm > 0 and np.linalg.norm(reference) > 0:
            cosine = float(delta @ reference / norm / np.linalg.norm(reference))
            self.probe_nodes[arrival.client_index].append(cosine)
        mine = self.probe_nodes[arrival.client_index]
        refused = threshold is not None and len(mine) >= min_updates and float(np.mean(mine)) < threshold
        log.append((arrival.client_index, arrival.staleness, cosine, refused))
        if refused:
            return RejectedReply("update-direction", f"node's mean cosine {np.mean(mine):.3f} < {threshold}")
        outcome = bound_apply(self, arrival)
        if norm > 0:
            unit = delta / norm
            self.probe_reference = unit if reference is None else DECAY * reference + (1 - DECAY) * unit
        return outcome

    update_bound.UpdateNormBound.apply = apply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", choices=list(dropin.SETTINGS))
    parser.add_argument("strategy")
    parser.add_argument("seed", type=int)
    parser.add_argument("attack", help="a drill attack (node 0 makes it), or 'none'")
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--min-updates", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "direction-probe")
    args = parser.parse_args()
    log: list = []
    install(args.threshold, args.min_updates, log)
    cell = {"setting": args.setting, "strategy": args.strategy, "seed": args.seed}
    if args.attack != "none":
        cell.update(attack=args.attack, attackers=1)
    row = dropin.run_cell(cell)
    args.out.mkdir(parents=True, exist_ok=True)
    rule = "record" if args.threshold is None else f"t{args.threshold}-k{args.min_updates}"
    name = f"{args.setting}_{args.strategy}_{args.seed}_{args.attack}_{rule}.json"
    (args.out / name).write_text(json.dumps({"final": row["final"], "log": log}))
    quarters = [[c for _, _, c, _ in log[q * len(log) // 4:(q + 1) * len(log) // 4] if c is not None]
                for q in range(4)]
    negative = [round(float(np.mean(np.array(q) < 0)), 3) for q in quarters]
    refused = dict(collections.Counter(node for node, _, _, r in log if r))
    print(f"{name}: final {row['final']}, refused by node {refused}, negative cosines by quarter {negative}")


if __name__ == "__main__":
    main()
