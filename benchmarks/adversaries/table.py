"""The quickstart-app drill table of benchmarks/adversaries/README.md, from the stored cells (run_all.sh).

Usage: ``.venv/bin/python benchmarks/adversaries/table.py`` (writes quickstart.md next to this file and prints it).
Each cell is the final test accuracy after 320 client updates (40 rounds of 8); mean +- sd over seeds 1-3, and the
mean paired difference from the same row's clean run (seed by seed). The "+ trusted direction" rows ran with the
server's ``trusted_train_fn`` (folders ``trusted-<drill>``); a second table pairs them, seed by seed, with the same
strategy without it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRILLS = [("clean", "clean"), ("noise-x1", "noise x1"), ("noise-x3", "noise x3"), ("noise-x10", "noise x10"),
          ("flip-scale-x1", "flip-scale x1"), ("flip-scale-x3", "flip-scale x3"),
          ("flip-scale-x10", "flip-scale x10"), ("replace", "replace (first)"), ("forged-count", "forged count")]
#: (strategy, folder prefix, label): the rows
STRATEGIES = [("fedbuff", "", "asyncfl FedBuff (bound on, default)"),
              ("fedasync", "", "asyncfl FedAsync (bound on, default)"),
              ("fedbuff", "trusted-", "asyncfl FedBuff + trusted direction"),
              ("fedasync", "trusted-", "asyncfl FedAsync + trusted direction"),
              ("flower-fedavg", "", "Flower FedAvg"), ("flower-fedmedian", "", "Flower FedMedian"),
              ("flower-fedtrimmedavg", "", "Flower FedTrimmedAvg (beta 0.2)")]
TRUSTED = "trusted-"


def cells(folder: str) -> list[dict]:
    path = HERE / folder / "cells.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def finals(data: dict, prefix: str, folder: str, strategy: str) -> dict[int, float]:
    """seed -> final accuracy of ``strategy``'s cells in ``prefix + folder``."""
    return {c["seed"]: c["final"] for c in data[prefix + folder] if c["strategy"] == strategy}


def render() -> str:
    """Both tables, from the stored cells."""
    data = {prefix + folder: cells(prefix + folder) for folder, _ in DRILLS for prefix in ("", TRUSTED)}
    lines = ["| strategy | " + " | ".join(label for _, label in DRILLS) + " |", "|---|" + "---|" * len(DRILLS)]
    for strategy, prefix, label in STRATEGIES:
        clean = finals(data, prefix, "clean", strategy)
        row = []
        for folder, _ in DRILLS:
            got = finals(data, prefix, folder, strategy)
            if not got:
                row.append("(= x1)" if "-x" in folder and strategy.startswith("flower") else "–")
                continue
            values = [got[seed] for seed in sorted(got)]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cell = f"{statistics.mean(values):.3f} ± {sd:.3f}"
            if folder != "clean":
                paired = [got[seed] - clean[seed] for seed in sorted(got) if seed in clean]
                cell += f" ({statistics.mean(paired):+.3f})" if paired else ""
            row.append(cell)
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines += ["", "The trusted direction against the same strategy without it (paired by seed: seed 1 / 2 / 3, mean):",
              "", "| strategy | " + " | ".join(label for _, label in DRILLS) + " |", "|---|" + "---|" * len(DRILLS)]
    for strategy in ("fedbuff", "fedasync"):
        row = []
        for folder, _ in DRILLS:
            with_, without = finals(data, TRUSTED, folder, strategy), finals(data, "", folder, strategy)
            seeds = sorted(set(with_) & set(without))
            gains = [with_[seed] - without[seed] for seed in seeds]
            row.append(" / ".join(f"{g:+.3f}" for g in gains) + f" ({statistics.mean(gains):+.3f})" if gains else "–")
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    text = render()
    (HERE / "quickstart.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
