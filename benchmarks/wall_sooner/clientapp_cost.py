"""What one ClientApp process costs the host in a loopback deployment, and the device time that keeps it off the pace.

Flower 1.42 deploys a ClientApp as one process per message (``flwr-clientapp``, started by the SuperNode
or by ``flower-superexec``): every train job pays the process's imports, then loads its data and trains,
and FedAvg pays it as asyncfl does. This measures both as CPU seconds (user + system of the child, from
``getrusage``: unlike wall time it does not grow when other work shares the cores), ``--runs`` fresh
processes each: ``imports`` (what ``flwr-clientapp`` imports to run the quickstart app: torch, Flower's
ClientApp runtime, the app's module) and ``job`` (the same imports, then one train message through the
app's own ``ClientApp``, mods included: the partition's data loaded and one local epoch trained, as the
app's ``pyproject.toml`` sets it). The job is what a process costs before Flower's own transport (the
SuperNode's and SuperLink's work per message, not counted here). From the job's cost, for the study's
fleet (``--profile``, ``--nodes``, ``--seed`` as in ``study.py``), the smallest ``device-seconds`` at
which the fleet's ideal update rate uses at most ``--host-share`` of the host's cores for those
processes alone: below it the host, not the emulated devices, sets the pace of a loopback run.

Usage: ``.venv/bin/python benchmarks/wall_sooner/clientapp_cost.py [--runs 5]`` (prints one JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.client_app.device_speed import DeviceProfile  # noqa: E402

APP = ROOT / "examples" / "quickstart-pytorch"
IMPORTS = "import torch, flwr; from flwr.supernode.runtime import run_clientapp; import pytorchexample.client_app"


#: one train message through the app's ClientApp, as a SuperNode would hand it over (node 0 of 8)
JOB = IMPORTS + """
import tomllib
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from pytorchexample.client_app import app
from pytorchexample.task import Net
TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0  # set by Flower's runtime in a real process
config = tomllib.load(open("pyproject.toml", "rb"))["tool"]["flwr"]["app"]["config"]
message = Message(RecordDict({"arrays": ArrayRecord(Net().state_dict()), "config": ConfigRecord({"lr": 0.1})}),
                  dst_node_id=1, message_type="train")
context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 8}, state=RecordDict(),
                  run_config=config)
reply = app(message, context)
assert reply.has_content(), reply.error
"""


def process_cpu_seconds(runs: int, code: str = IMPORTS) -> list[float]:
    """User + system CPU seconds of each of ``runs`` fresh processes running ``code`` in the app's folder
    (``IMPORTS``: what a ClientApp process imports; ``JOB``: those imports and one train job)."""
    costs = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], cwd=APP, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        costs.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return costs


def least_device_seconds(fleet: list[float], cost: float, cores: int, host_share: float) -> float:
    """The ``device-seconds`` at which the fleet's ideal rate, ``Σ 1 / (s_i d)`` jobs per second, spends
    ``host_share`` of ``cores`` on ClientApp processes of ``cost`` CPU seconds each: ``d = cost Σ (1 / s_i) / (share cores)``."""
    return cost * sum(1.0 / s for s in fleet) / (host_share * cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", default="quarter-5x-slower")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-share", type=float, default=0.5, help="share of the cores the ClientApp processes may use")
    args = parser.parse_args()
    imports = process_cpu_seconds(args.runs)
    jobs = process_cpu_seconds(args.runs, JOB)
    cost = statistics.median(jobs)
    cores = os.cpu_count() or 1
    fleet = DeviceProfile.parse(args.profile).fleet(args.nodes, args.seed)
    seconds = least_device_seconds(fleet, cost, cores, args.host_share)
    print(json.dumps({"imports-cpu-seconds": [round(c, 2) for c in imports],
                      "imports-median": round(statistics.median(imports), 2),
                      "job-cpu-seconds": [round(c, 2) for c in jobs], "job-median": round(cost, 2),
                      "cores": cores, "jobs-per-s-at-most": round(cores / cost, 3),
                      "fleet": [round(s, 3) for s in fleet], "host-share": args.host_share,
                      "least-device-seconds": round(seconds, 1),
                      "ideal-updates-per-s-then": round(sum(1 / (s * seconds) for s in fleet), 3),
                      "synchronous-round-s-then": round(max(fleet) * seconds, 1)}, indent=1))


if __name__ == "__main__":
    main()
