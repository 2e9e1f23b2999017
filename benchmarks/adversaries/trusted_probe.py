"""Probe: how do honest and hostile updates compare with the server's own update on its trusted data? (issue 56)

Runs one quickstart drill cell (benchmarks/dropin/run.py, virtual clock) with the engine as shipped, no trusted
direction: a wrapper around the update bound only records, for every arrival, the cosine of its update with the
server's step ``s`` from the same base (``apps.trusted_program``: one epoch on the server's 288 images, shuffled
by the version, as ``--trusted`` runs use), the ratio of their norms and AFLGuard's distance ``|Delta - s| / |s|``.
It is the evidence for the rule in asyncfl/server_app/trusted_direction.py: a sign test or a distance test on
these figures, and why the opposing component is removed instead. Writes
``trusted-probe/<strategy>_<seed>_<attack>.json`` (the arrivals) and prints quartiles per quarter of the run.

Usage: ``.venv/bin/python benchmarks/adversaries/trusted_probe.py fedasync 1 none`` (or ``fedbuff 1 flip-scale``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks" / "dropin"))
sys.path.insert(0, str(HERE.parents[1]))

import run as dropin  # noqa: E402
from asyncfl.server_app import participants as update_bound  # noqa: E402
from asyncfl.server_app.codec import ModelCodec  # noqa: E402

SETTING = "sgdm-0.05"


def install(log: list) -> None:
    """Record each arrival's figures against the server's step; the bound then runs unchanged."""
    from apps import APPS, trusted_program

    app_name, optimizer, lr, _ = dropin.SETTINGS[SETTING]
    app = APPS[app_name]
    trained = trusted_program(app, optimizer, lr, dropin.NODES)
    bound_apply = update_bound.UpdateNormBound.apply
    steps: dict[int, np.ndarray] = {}
    codec = ModelCodec.from_state(OrderedDict((k, v.numpy()) for k, v in app.model_fn().state_dict().items()))

    def apply(self, arrival, *args):
        if arrival.base_version not in steps:
            after = trained(arrival.base_version, codec.to_record(arrival.base)).to_numpy_ndarrays()
            steps.clear()
            steps[arrival.base_version] = codec.flatten(after) - arrival.base
        mask = self.groups[0]
        s = steps[arrival.base_version] if mask is None else steps[arrival.base_version][mask]
        d = arrival.delta if mask is None else arrival.delta[mask]
        ns, nd = float(np.linalg.norm(s)), float(np.linalg.norm(d))
        if ns > 0 and nd > 0:
            log.append({"client": arrival.client_index, "staleness": arrival.staleness,
                        "cosine": float(d @ s) / ns / nd, "norm-ratio": nd / ns,
                        "distance": float(np.linalg.norm(d - s)) / ns})
        return bound_apply(self, arrival, *args)

    update_bound.UpdateNormBound.apply = apply


def quartiles(values: list[float]) -> str:
    return " / ".join(f"{np.quantile(values, q):+.3f}" for q in (0.05, 0.25, 0.5, 0.75)) if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy", choices=["fedbuff", "fedasync"])
    parser.add_argument("seed", type=int)
    parser.add_argument("attack", help="a drill attack of partition 0, or 'none'")
    args = parser.parse_args()
    log: list = []
    install(log)
    cell = {"setting": SETTING, "strategy": args.strategy, "seed": args.seed}
    if args.attack != "none":
        cell.update(attack=args.attack, attackers=1)
    row = dropin.run_cell(cell)
    out = HERE / "trusted-probe"
    out.mkdir(exist_ok=True)
    (out / f"{args.strategy}_{args.seed}_{args.attack}.json").write_text(json.dumps({"final": row["final"],
                                                                                   "arrivals": log}) + "\n")
    print(f"{args.strategy} seed {args.seed} {args.attack}: final {row['final']}; quantiles 5/25/50/75 %")
    for who, mine in (("honest", lambda c: c != 0 or args.attack == "none"),
                      ("attacker", lambda c: c == 0 and args.attack != "none")):
        for quarter in range(4):
            rows = [r for r in log[quarter * len(log) // 4:(quarter + 1) * len(log) // 4] if mine(r["client"])]
            if rows:
                print(f"  {who} quarter {quarter + 1} ({len(rows)}): cosine {quartiles([r['cosine'] for r in rows])}"
                      f"; |Delta|/|s| {quartiles([r['norm-ratio'] for r in rows])}"
                      f"; |Delta - s|/|s| {quartiles([r['distance'] for r in rows])}")


if __name__ == "__main__":
    main()
