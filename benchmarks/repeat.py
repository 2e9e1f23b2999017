"""Same seed, same metrics under load: identical seeded simulations run several at once, compared byte for byte.

Each setting runs ``--runs`` times through ``asyncfl run`` (real Flower simulation,
Ray), ``--together`` processes at a time across all settings, so the runs share this
machine's cores with each other (Ray workers start late, replies arrive in a
different wall-clock order). A seeded run must still give the same ``metrics.csv``:
the virtual clock fixes the order in which replies are accepted, and the start-up
identity query fixes which partition each node holds. Any run whose log says a node
missed the identity query is named (that is the one known way to lose it).

Usage::

    python benchmarks/repeat.py [--runs 3] [--together 4] [--supernodes 20]

Writes ``benchmarks/determinism/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Small BatchNorm-CNN settings: a parameter-space method, and FedRevive with its KD from the 10th update
#: (batched teacher passes, synthesis, the KD pool's seeded draws).
SETTINGS = {
    "fedbuff-bn-cnn": "strategy='fedbuff' model.batchnorm=true max-arrivals=40 concurrency=10 evaluate-every-time=1.0",
    "fedrevive-bn-cnn": ("strategy='fedrevive' model.batchnorm=true max-arrivals=30 concurrency=10 evaluate-every-time=1.0 "
                         "fedrevive.synthesis-start=0 fedrevive.kd-start=10"),
}
MISSED_IDENTITY = "did not answer the identity query"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "missing"


def run_batch(jobs: list[tuple[str, int]], supernodes: int, out: Path) -> dict[tuple[str, int], dict]:
    """Start every ``(setting, repeat)`` of ``jobs`` at once and wait for all of them."""
    started, processes = time.perf_counter(), {}
    for setting, repeat in jobs:
        tag = f"{setting}-{repeat}"
        log = open(out / f"{tag}.log", "w")
        command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(ROOT), "--num-supernodes",
                   str(supernodes), "-c", f"{SETTINGS[setting]} output-dir='{out}' run-name='{tag}' progress=false"]
        processes[(setting, repeat)] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    results = {}
    for key, (process, log) in processes.items():
        code = process.wait(timeout=1800)
        log.close()
        tag = f"{key[0]}-{key[1]}"
        text = (out / f"{tag}.log").read_text(errors="replace")
        summary_path = out / tag / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        results[key] = {"exit": code, "metrics-sha256": _digest(out / tag / "metrics.csv"),
                        "arrivals": summary.get("arrivals"), "kd-updates": summary.get("kd-updates"),
                        "missed-identity-query": MISSED_IDENTITY in text,
                        "wall-s": round(time.perf_counter() - started, 1), "together": len(jobs)}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="repeats of each setting")
    parser.add_argument("--together", type=int, default=4, help="runs started at once")
    parser.add_argument("--supernodes", type=int, default=20)
    args = parser.parse_args(argv)
    if args.runs < 2 or args.together < 1 or args.supernodes < 1:
        parser.error("need --runs >= 2, --together >= 1 and --supernodes >= 1")
    # Interleave settings so that every batch mixes them; the last run of each setting runs alone-ish.
    queue = [(setting, repeat) for repeat in range(args.runs) for setting in SETTINGS]
    runs: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        while queue:
            batch, queue = queue[: args.together], queue[args.together :]
            print(f"running {len(batch)} at once: {batch}", flush=True)
            runs.update(run_batch(batch, args.supernodes, Path(tmp)))
    by_setting = {}
    for setting in SETTINGS:
        mine = [runs[(setting, r)] for r in range(args.runs)]
        digests = {m["metrics-sha256"] for m in mine}
        by_setting[setting] = {"run-config": SETTINGS[setting], "runs": mine,
                               "identical": len(digests) == 1 and all(m["exit"] == 0 for m in mine)}
    results = {"supernodes": args.supernodes, "runs-each": args.runs, "together": args.together,
               "settings": by_setting, "all-identical": all(s["identical"] for s in by_setting.values())}
    out = ROOT / "benchmarks" / "determinism" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if results["all-identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
