"""Scale benchmark (not a test): 1k / 5k / 10k simulated clients through ``flwr run`` on this machine.

For each client count ``N`` (``N / 10`` jobs in flight, a light model, one local step,
``partitioning='sampled'`` so every client has data whatever ``N``), it runs the
built-in app through ``asyncfl run`` and samples, every 0.5 s, the proportional set
size (PSS: shared pages split between their users) of

* the simulation process (``flwr-simulation``: our ServerApp with the engine, and
  Flower's simulation runtime, which keeps a context per simulated node), and
* everything Ray runs (GCS, raylet, the ClientApp actors).

It reports peak memory of both, steady arrivals/s, server ms per arrival, the
identity-query time at start-up and the wall time, one row per ``N``, into
``benchmarks/scale/results.json``.

Usage: ``.venv/bin/python benchmarks/scale.py [--clients 1000,5000,10000] [--arrivals 3000] [--in-flight K]
[--append]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "scale"
sys.path.insert(0, str(ROOT))

from asyncfl.deploy.processes import descendants  # noqa: E402
from benchmarks.run_timing import steady_arrivals_per_s, timing_rows  # noqa: E402


def _pss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class MemorySampler(threading.Thread):
    """Peak PSS of the simulation process and of Ray's processes under ``root_pid``."""

    def __init__(self, root_pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.every_s = root_pid, every_s
        self.peak_server_mb = self.peak_ray_mb = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            server = ray = 0.0
            for pid in descendants(self.root_pid):
                command = _cmdline(pid)
                if "flwr-simulation" in command:
                    server += _pss_mb(pid)
                elif "ray" in command or "raylet" in command or "gcs_server" in command:
                    ray += _pss_mb(pid)
            self.peak_server_mb = max(self.peak_server_mb, server)
            self.peak_ray_mb = max(self.peak_ray_mb, ray)
            self.stop.wait(self.every_s)


def run_scale(clients: int, arrivals: int, out: Path, in_flight: int | None = None) -> dict:
    in_flight = in_flight or max(1, clients // 10)
    tag = f"scale-{clients}-{in_flight}"
    overrides = (f"dataset='mnist5k' model='mlp' partitioning='sampled' samples-per-client=32 local-steps=1 "
                 f"batch-size=32 concurrency={in_flight} max-arrivals={arrivals} evaluate-every-time=2.0 eval-batch-size=1000 "
                 f"wait-for-nodes=1200.0 timeout=1200.0 progress=false output-dir='{out}' run-name='{tag}'")
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(ROOT), "--num-supernodes", str(clients),
               "-c", overrides]
    started = time.monotonic()
    with open(out / f"{tag}.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        sampler = MemorySampler(process.pid)
        sampler.start()
        process.wait(timeout=7200)
        sampler.stop.set()
        sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"{tag} failed: see {out / (tag + '.log')}")
    wall = time.monotonic() - started
    summary = json.loads((out / tag / "summary.json").read_text())
    timing = timing_rows(out / tag / "timing.csv")
    steady = steady_arrivals_per_s(timing, 0.2)
    return {
        "clients": clients, "in-flight": in_flight, "arrivals": summary["arrivals"],
        "steady-arrivals-per-s": round(steady, 2),
        "server-ms-per-arrival": summary["server-ms-per-arrival"],
        "peak-server-pss-mb": round(sampler.peak_server_mb, 1),
        "server-peak-rss-mb (getrusage)": summary.get("server-peak-rss-mb"),
        "peak-ray-pss-mb": round(sampler.peak_ray_mb, 1),
        "peak-stored-versions": summary.get("peak-stored-versions"),
        "first-evaluation-wall-s": timing[0][1],
        "wall-seconds": round(wall, 1),
        "staleness-mean": round(summary["staleness-mean"], 2),
        "final-accuracy": summary["final-accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1000,5000,10000")
    parser.add_argument("--arrivals", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=None, help="jobs in flight (default: clients / 10)")
    parser.add_argument("--append", action="store_true", help="add the rows to results.json instead of replacing it")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = json.loads((OUT / "results.json").read_text()) if args.append else []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in (int(c) for c in args.clients.split(",")):
            row = run_scale(clients, args.arrivals, Path(tmp), args.in_flight)
            rows.append(row)
            print(json.dumps(row), flush=True)
            (OUT / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
