"""Containers per client with CPU limits: physical speed tiers seen by the wall-clock engine as staleness.

Starts the deployment ``asyncfl docker up`` starts (SuperLink, ServerApp SuperExec,
and per client a SuperNode + a ClientApp SuperExec container whose CPU limit cycles
over ``--tiers``), runs FedBuff (or ``--strategy``) on the default CNN with real local training (no
emulated delays), and reports per client its CPU limit, accepted arrivals, mean
staleness and round trip (from the run's ``clients.csv``) and the run's staleness
histogram. Needs the images (``asyncfl docker build``) and a Docker engine.

    .venv/bin/python benchmarks/docker/run.py --clients 4 --tiers 0.25,1 --arrivals 48
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from asyncfl.deploy.containers import DockerDeployment  # noqa: E402
from asyncfl.deploy.topology import cpu_tiers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tiers", default="0.25,1", help="CPU limits cycled over the ClientApp containers")
    parser.add_argument("--arrivals", type=int, default=48)
    parser.add_argument("--strategy", default="fedbuff")
    parser.add_argument("--run-name", default="tiers")
    parser.add_argument("--extra", default="", help="more run-config overrides")
    args = parser.parse_args()
    tiers = cpu_tiers(args.tiers)
    out = ROOT / "benchmarks" / "docker" / "runs"
    work = ROOT / ".flwr-docker" / "benchmark"
    shutil.rmtree(work, ignore_errors=True)
    overrides = (f"strategy='{args.strategy}' concurrency={args.clients} max-arrivals={args.arrivals} evaluate-every-time=30.0 "
                 f"progress=false timeout=600.0 wait-for-nodes=120.0 run-name='{args.run_name}' {args.extra}")
    started = time.monotonic()
    with DockerDeployment(args.clients, name="asyncfl-bench", workdir=work, cpus_per_client=tiers) as deployment:
        flwr = deployment.submit(ROOT, [overrides], stream=False)
        output = flwr.communicate()[0]
        if flwr.returncode != 0:
            raise SystemExit(output[-3000:])
        while not (deployment.outputs / args.run_name / "clients.csv").exists():
            time.sleep(2.0)
            if time.monotonic() - started > 3600:
                raise SystemExit("the run did not finish within an hour")
        time.sleep(2.0)
    run = out / args.run_name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(work / "outputs" / args.run_name, run)
    summary = json.loads((run / "summary.json").read_text())
    rows = list(csv.DictReader(open(run / "clients.csv")))
    print("| client | CPU limit | arrivals | mean staleness | mean round trip (s) |")
    print("|---|---|---|---|---|")
    for row in rows:
        cpus = tiers[int(row["client"]) % len(tiers)]
        print(f"| {row['client']} | {cpus:g} | {row['arrivals']} | {row['staleness_mean']} | "
              f"{row['round_trip_s_mean']} |")
    print(f"staleness histogram {summary['staleness-histogram']}, mean {summary['staleness-mean']:.2f}, "
          f"final accuracy {summary['final-accuracy']}, wall {summary['wall-seconds']} s, "
          f"client compute {summary.get('client-train-s-mean')} s per job")
    results = {"strategy": args.strategy, "clients": args.clients, "tiers": tiers, "arrivals": args.arrivals, "per_client": rows,
               "summary": {k: summary[k] for k in ("staleness-histogram", "staleness-mean", "final-accuracy",
                                                   "wall-seconds", "job-round-trip-s-mean", "client-train-s-mean")}}
    (out.parent / f"results-{args.run_name}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
