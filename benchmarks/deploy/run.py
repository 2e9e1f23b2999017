"""Loopback deployment benchmark: our engine vs Flower's ``send_and_receive`` loop, same SuperNodes.

One SuperLink and 4 SuperNode processes on this machine (``LocalDeployment``),
then two runs on them, back to back:

* ours: the asyncfl ServerApp, FedBuff, wall clock, 4 jobs in flight;
* peer: ``flower_loop_server.py``, rounds of one train message per node through
  ``Grid.send_and_receive`` (Flower's own loop: pull, sleep 3 s, repeat).

Both train the default CNN (25 Adam steps of 32 on mnist5k) in the same
ClientApp. Reported: accepted replies per second in steady state (first train
push to last accepted reply: ours from the run's summary, Flower's as the sum of
its rounds) and over the whole ``flwr run`` command (start-up, our identity
query and evaluations included), bytes per update (the serialized arrays of a
reply), the per-dispatch overhead (round trip from push to reply minus the
client's own reported compute time), and where the CPU went: the SuperLink's
process tree (the ServerApp runs in it), the SuperNodes' trees (ClientApp
processes included) and the whole machine.

Usage: ``.venv/bin/python benchmarks/deploy/run.py [JOBS] [JOBS_PER_CLIENT]``
(default 60 jobs each way, 1 job per client; results in
``benchmarks/deploy/results.json``, or ``results-jobs-per-client-J.json`` for
J > 1: ours then runs ``jobs-per-client=J`` with ``J * 4`` jobs in flight, so each
SuperNode finds its next job waiting when it pushes a reply).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from asyncfl.deploy.app_copy import write_app_copy  # noqa: E402
from asyncfl.deploy.local import LocalDeployment  # noqa: E402
from benchmarks.cpu_usage import TreeCpu  # noqa: E402

NODES = 4
COMMON = "progress=false clock='wall' evaluate-every-time=1000.0 wait-for-nodes=60.0"


def _submit(deployment: LocalDeployment, overrides: str, app: Path | None = None) -> tuple[float, dict]:
    """Run one ``flwr run`` to its end; its wall seconds and the CPU seconds of each process tree meanwhile."""
    if app is not None:
        deployment.app_dir = app
    roots = {"superlink+serverapp": deployment.superlink.pid,
             **{f"supernode-{p}": node.pid for p, node in deployment.supernodes.items()}}
    started = time.monotonic()
    with TreeCpu(roots, period=0.5) as cpu:
        flwr = deployment.submit([overrides])
        output = flwr.communicate(timeout=3600)[0]
    if flwr.returncode != 0:
        raise RuntimeError(output[-3000:])
    seconds = cpu.seconds()
    return time.monotonic() - started, {
        "superlink+serverapp": seconds["superlink+serverapp"],
        "supernodes+clientapps": round(sum(v for k, v in seconds.items() if k.startswith("supernode-")), 1),
        "machine": seconds["machine"],
    }


def _peer_app(tmp: Path) -> Path:
    return write_app_copy(tmp / "peer", ROOT, [Path(__file__).with_name("flower_loop_server.py")],
                          serverapp="flower_loop_server:app")


def main(jobs: int = 60, jobs_per_client: int = 1) -> dict:
    out = ROOT / "benchmarks" / "deploy"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with LocalDeployment(ROOT, NODES, workdir=tmp / "deployment") as deployment:
            warm, _ = _submit(deployment, f"{COMMON} concurrency={NODES} max-arrivals={NODES} output-dir='{tmp}' "
                                          "run-name='warm-up'")
            ours_wall, ours_cpu = _submit(deployment, f"{COMMON} concurrency={NODES * jobs_per_client} "
                                                      f"jobs-per-client={jobs_per_client} max-arrivals={jobs} "
                                                      f"cap-in-flight={str(jobs_per_client == 1).lower()} "
                                                      f"strategy='fedbuff' fedbuff.buffer-size={NODES} "
                                                      f"output-dir='{tmp}' run-name='ours'")
            peer_wall, peer_cpu = _submit(deployment, f"{COMMON} concurrency={NODES} max-arrivals={jobs} "
                                                      f"output-dir='{tmp / 'peer-out'}'", app=_peer_app(tmp))
        ours = json.loads((tmp / "ours" / "summary.json").read_text())
        peer = json.loads((tmp / "peer-out" / "flower-loop.json").read_text())
    peer_jobs = sum(r["replies"] for r in peer["rounds"])
    peer_seconds = sum(r["seconds"] for r in peer["rounds"])
    peer_overheads = [r["seconds"] - t for r in peer["rounds"] for t in r["train-seconds"]]
    result = {
        "nodes": NODES,
        "jobs-each": jobs,
        "jobs-per-client": jobs_per_client,
        "warm-up-command-s": round(warm, 1),
        "ours": {
            "accepted-per-s": ours["accepted-per-training-s"],
            "accepted-per-s-whole-command": round(ours["arrivals"] / ours_wall, 4),
            "training-s": ours["training-wall-s"],
            "reply-mb": ours["reply-mb-mean"],
            "round-trip-s": ours["job-round-trip-s-mean"],
            "client-train-s": ours["client-train-s-mean"],
            "dispatch-overhead-s": ours["dispatch-overhead-s-mean"],
            "staleness-mean": round(ours["staleness-mean"], 3),
            "command-s": round(ours_wall, 1),
            "cpu-s": ours_cpu,
        },
        "flower-send-and-receive": {
            "accepted-per-s": round(peer_jobs / peer_seconds, 4),
            "accepted-per-s-whole-command": round(peer_jobs / peer_wall, 4),
            "training-s": round(peer_seconds, 3),
            "round-s-mean": round(statistics.fmean(r["seconds"] for r in peer["rounds"]), 3),
            "client-train-s": round(statistics.fmean(t for r in peer["rounds"] for t in r["train-seconds"]), 4),
            "dispatch-overhead-s": round(statistics.fmean(peer_overheads), 4),
            "command-s": round(peer_wall, 1),
            "cpu-s": peer_cpu,
        },
    }
    for key in ("accepted-per-s", "accepted-per-s-whole-command"):
        result[f"ratio-{key}"] = round(result["ours"][key] / result["flower-send-and-receive"][key], 3)
    name = "results.json" if jobs_per_client == 1 else f"results-jobs-per-client-{jobs_per_client}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
