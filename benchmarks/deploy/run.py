"""Loopback deployment benchmark: our engine vs Flower's ``send_and_receive`` loop, same SuperNodes.

One SuperLink and 4 SuperNode processes on this machine (``LocalDeployment``),
then two runs on them, back to back:

* ours: the asyncfl ServerApp, FedBuff, wall clock, 4 jobs in flight;
* peer: ``flower_loop_server.py``, rounds of one train message per node through
  ``Grid.send_and_receive`` (Flower's own loop: pull, sleep 3 s, repeat).

Both train the default CNN (25 Adam steps of 32 on mnist5k) in the same
ClientApp. Reported: accepted replies per second, bytes per update (the
serialized arrays of a reply), and the per-dispatch overhead: round trip from
push to reply minus the client's own reported compute time.

Usage: ``.venv/bin/python benchmarks/deploy/run.py`` (results in ``benchmarks/deploy/results.json``).
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

NODES = 4
JOBS = 24
COMMON = f"concurrency={NODES} progress=false clock='wall' eval-every=1000.0 wait-for-nodes=60.0"


def _submit(deployment: LocalDeployment, overrides: str, app: Path | None = None) -> float:
    if app is not None:
        deployment.app_dir = app
    started = time.monotonic()
    flwr = deployment.submit([overrides])
    output = flwr.communicate(timeout=1800)[0]
    if flwr.returncode != 0:
        raise RuntimeError(output[-3000:])
    return time.monotonic() - started


def _peer_app(tmp: Path) -> Path:
    return write_app_copy(tmp / "peer", ROOT, [Path(__file__).with_name("flower_loop_server.py")],
                          serverapp="flower_loop_server:app")


def main() -> int:
    out = ROOT / "benchmarks" / "deploy"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with LocalDeployment(ROOT, NODES, workdir=tmp / "deployment") as deployment:
            warm = _submit(deployment, f"{COMMON} max-arrivals={NODES} output-dir='{tmp}' run-name='warm-up'")
            ours_wall = _submit(deployment, f"{COMMON} max-arrivals={JOBS} strategy='fedbuff' "
                                            f"fedbuff.buffer-size={NODES} output-dir='{tmp}' run-name='ours'")
            peer_wall = _submit(deployment, f"{COMMON} max-arrivals={JOBS} output-dir='{tmp / 'peer-out'}'",
                                app=_peer_app(tmp))
        ours = json.loads((tmp / "ours" / "summary.json").read_text())
        peer = json.loads((tmp / "peer-out" / "flower-loop.json").read_text())
    peer_jobs = sum(r["replies"] for r in peer["rounds"])
    peer_seconds = sum(r["seconds"] for r in peer["rounds"])
    peer_overheads = [r["seconds"] - t for r in peer["rounds"] for t in r["train-seconds"]]
    result = {
        "nodes": NODES,
        "warm-up-command-s": round(warm, 1),
        "ours": {
            "accepted-per-s": round(ours["arrivals"] / ours["wall-seconds"], 3),
            "reply-mb": ours["reply-mb-mean"],
            "round-trip-s": ours["job-round-trip-s-mean"],
            "client-train-s": ours["client-train-s-mean"],
            "dispatch-overhead-s": ours["dispatch-overhead-s-mean"],
            "command-s": round(ours_wall, 1),
        },
        "flower-send-and-receive": {
            "accepted-per-s": round(peer_jobs / peer_seconds, 3),
            "round-s-mean": round(statistics.fmean(r["seconds"] for r in peer["rounds"]), 3),
            "client-train-s": round(statistics.fmean(t for r in peer["rounds"] for t in r["train-seconds"]), 4),
            "dispatch-overhead-s": round(statistics.fmean(peer_overheads), 4),
            "command-s": round(peer_wall, 1),
        },
    }
    result["ratio-accepted-per-s"] = round(result["ours"]["accepted-per-s"] / result["flower-send-and-receive"]["accepted-per-s"], 3)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
