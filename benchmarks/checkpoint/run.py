"""What checkpoints cost the built-in app: write time and size, as a share of the run's own time.

Each case is one real ``asyncfl run`` (Flower simulation, Ray ClientApps); the run's summary
reports how many checkpoints it wrote, their mean write time (capture of the server state +
atomic .npz write, measured in the ServerApp) and the last one's size. The share is
checkpoint seconds / the run's training wall time (first push to last accepted reply), both
from the same run on the same machine.

    .venv/bin/python benchmarks/checkpoint/run.py            # all cases, results.json + the table
    .venv/bin/python benchmarks/checkpoint/run.py --table    # the table from results.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: name -> (run-config overrides, simulated clients); the defaults are the built-in app's (FedBuff, mnist5k CNN).
CASES = {
    "fedbuff default, every 10 versions (the default)": ("checkpoint-every=10", 50),
    "fedbuff default, every version": ("checkpoint-every=1", 50),
    "fedrevive default, every 10 versions": ("strategy='fedrevive' checkpoint-every=10", 50),
    "fedrevive default, every version": ("strategy='fedrevive' checkpoint-every=1", 50),
}


def run_case(name: str, overrides: str, clients: int, out: Path) -> dict:
    folder = out / name.replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
    command = [sys.executable, "-m", "asyncfl.cli", "run", "--app", str(ROOT), "--num-supernodes", str(clients),
               "-c", f"{overrides} progress=false output-dir='{folder.parent}' run-name='{folder.name}'"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: asyncfl run failed:\n{(result.stdout + result.stderr)[-3000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    checkpoint_s = summary["checkpoints-written"] * summary["checkpoint-ms-mean"] / 1000.0
    return {"case": name, "arrivals": summary["arrivals"], "server-versions": summary["server-versions"],
            "checkpoints": summary["checkpoints-written"], "checkpoint-ms-mean": summary["checkpoint-ms-mean"],
            "checkpoint-mb": summary["checkpoint-mb"], "training-wall-s": summary["training-wall-s"],
            "wall-seconds": summary["wall-seconds"], "checkpoint-share": round(checkpoint_s / summary["training-wall-s"], 5),
            "server-ms-per-arrival": summary["server-ms-per-arrival"], "final-accuracy": summary["final-accuracy"]}


def table(rows: list[dict]) -> str:
    lines = ["| case | versions | checkpoints | ms each | MB each | training wall s | share of run |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['server-versions']} | {r['checkpoints']} | {r['checkpoint-ms-mean']:.1f} | "
                     f"{r['checkpoint-mb']:.2f} | {r['training-wall-s']:.1f} | {100 * r['checkpoint-share']:.2f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="only print the table of results.json")
    args = parser.parse_args()
    results = HERE / "results.json"
    if not args.table:
        rows = []
        with tempfile.TemporaryDirectory() as out:
            for name, (overrides, clients) in CASES.items():
                rows.append(run_case(name, overrides, clients, Path(out)))
                print(json.dumps(rows[-1]), flush=True)
        results.write_text(json.dumps(rows, indent=2) + "\n")
    print(table(json.loads(results.read_text())))


if __name__ == "__main__":
    main()
