"""The quickstart-app drill table of benchmarks/adversaries/README.md, from the stored cells (run_all.sh).

Usage: ``.venv/bin/python benchmarks/adversaries/table.py`` (writes quickstart.md next to this file and prints it).
Each cell is the final test accuracy after 320 client updates (40 rounds of 8); mean +- sd over seeds 1-3, and the
mean paired difference from the same strategy's clean run (seed by seed).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRILLS = [("clean", "clean"), ("noise-x1", "noise x1"), ("noise-x3", "noise x3"), ("noise-x10", "noise x10"),
          ("flip-scale-x1", "flip-scale x1"), ("flip-scale-x3", "flip-scale x3"),
          ("flip-scale-x10", "flip-scale x10"), ("replace", "replace (first)"), ("forged-count", "forged count")]
STRATEGIES = [("fedbuff", "asyncfl FedBuff (bound on, default)"), ("fedasync", "asyncfl FedAsync (bound on, default)"),
              ("flower-fedavg", "Flower FedAvg"), ("flower-fedmedian", "Flower FedMedian"),
              ("flower-fedtrimmedavg", "Flower FedTrimmedAvg (beta 0.2)")]


def cells(folder: str) -> list[dict]:
    path = HERE / folder / "cells.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main() -> None:
    data = {folder: cells(folder) for folder, _ in DRILLS}
    clean = {(c["strategy"], c["seed"]): c["final"] for c in data["clean"]}
    lines = ["| strategy | " + " | ".join(label for _, label in DRILLS) + " |", "|---|" + "---|" * len(DRILLS)]
    for strategy, label in STRATEGIES:
        row = []
        for folder, _ in DRILLS:
            got = sorted((c for c in data[folder] if c["strategy"] == strategy), key=lambda c: c["seed"])
            if not got:
                row.append("(= x1)" if "-x" in folder and strategy.startswith("flower") else "–")
                continue
            finals = [c["final"] for c in got]
            sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
            cell = f"{statistics.mean(finals):.3f} ± {sd:.3f}"
            if folder != "clean":
                paired = [c["final"] - clean[(strategy, c["seed"])] for c in got if (strategy, c["seed"]) in clean]
                cell += f" ({statistics.mean(paired):+.3f})" if paired else ""
            row.append(cell)
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (HERE / "quickstart.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
