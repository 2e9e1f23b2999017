"""Where FedEcho's teacher gets its scale: replay a stored run from a checkpoint and log its logits (issue 43).

FedEcho's teacher is the plain mean of every client's latest logits on ``U`` (Algorithm 1), so
one client whose model returns far larger logits than the others decides the teacher's
prediction on its own. This script replays a stored run of the built-in app from one of its
checkpoints (a copy of the run folder: the stored run is left as it is; on the virtual clock the
replay is the run itself) up to ``--until`` arrivals, and logs

- per arrival: the client, and the largest ``|logit|`` its model gives on ``U`` (what enters the bank);
- per aggregation: the teacher's largest ``|logit|`` on ``U``, the distilled global model's, and
  the global model's parameter norm.

Writes ``<study folder>/logit-replay-<run>.json`` next to the study's ``runs/`` (or ``--out``). A run keeps
its newest ``checkpoint-keep`` checkpoints (2 in the studies): to replay an earlier stretch, copy the run
folder while it has the checkpoint you need.

Usage::

    python benchmarks/fedecho_logit_replay.py \\
        benchmarks/fedecho-fmnist-paper/runs/fedecho-q60-eta1e-4__large-dir0.1__s3 --version 250 --until 1290
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from asyncfl.models.flat import load_flat  # noqa: E402
from asyncfl.models.inference import chunked_forward  # noqa: E402
from asyncfl.strategies import registry  # noqa: E402
from asyncfl.strategies.fedecho import FedEcho  # noqa: E402
from asyncfl.strategies.strategy_state import check_saved_strategy  # noqa: E402
from matrix import run_in_process  # noqa: E402

_LOG: dict[str, list[dict]] = {"arrivals": [], "aggregations": []}


class LoggedFedEcho(FedEcho):
    """FedEcho logging the scale of what enters its bank and what its distillation returns (same math)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replay_net = copy.deepcopy(self.client_net)  # the background logit thread keeps client_net

    def check_state(self, state: dict) -> None:
        """A FedEcho checkpoint is this class's own state (the same attributes, the same knobs)."""
        check_saved_strategy(state, FedEcho.__qualname__, self.config)

    def record_logits(self, client: int, weights: np.ndarray) -> None:
        logits = self.client_logits(weights)
        _LOG["arrivals"].append({"client": client, "largest-logit": float(np.abs(logits).max()),
                                 "finite": bool(np.isfinite(logits).all())})
        self.bank.store(client, logits)

    def distill(self, model: np.ndarray) -> np.ndarray:
        distilled = super().distill(model)
        own = chunked_forward(load_flat(self._replay_net, distilled).eval(), self.unlabeled)
        _LOG["aggregations"].append({
            "aggregation": self.aggregations, "arrivals-logged": len(_LOG["arrivals"]),
            "teacher-largest-logit": float(np.abs(self.bank.mean()).max()),
            "global-largest-logit": float(own.abs().max()), "model-norm": float(np.linalg.norm(distilled))})
        return distilled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a stored FedEcho run folder with checkpoints/")
    parser.add_argument("--version", type=int, required=True, help="the checkpoint's server version to start from")
    parser.add_argument("--until", type=int, required=True, help="stop after this many accepted updates")
    parser.add_argument("--supernodes", type=int, default=50)
    parser.add_argument("--out", type=Path, help="the JSON file (default: logit-replay-<run>.json in the study folder "
                                                  "above the run's runs/)")
    args = parser.parse_args(argv)
    found = sorted((args.run / "checkpoints").glob(f"checkpoint-v{args.version:06d}-*.npz"))
    if not found:
        parser.error(f"no checkpoint of version {args.version} in {args.run / 'checkpoints'}")
    config = tomllib.loads((args.run / "run_config.toml").read_text())
    if config.get("strategy") != "fedecho":
        parser.error(f"{args.run} is a {config.get('strategy')} run; this replays FedEcho runs")
    with tempfile.TemporaryDirectory() as scratch:
        copy_dir = Path(scratch) / args.run.name
        shutil.copytree(args.run, copy_dir)
        config.update({"output-dir": scratch, "run-name": args.run.name, "max-arrivals": args.until,
                       "resume-from": str(copy_dir / "checkpoints" / found[0].name)})
        registry.STRATEGY_CLASSES["fedecho"] = f"{__name__}:LoggedFedEcho"
        run_in_process(config, args.supernodes)
        summary = json.loads((copy_dir / "summary.json").read_text())
    out = args.out or args.run.parent.parent / f"logit-replay-{args.run.name}.json"
    result = {"run": str(args.run), "checkpoint": found[0].name, "until": args.until,
              "logits-beyond-float16": summary.get("logits-beyond-float16"), **_LOG}
    out.write_text(json.dumps(result, indent=1) + "\n")
    largest = max(_LOG["arrivals"], key=lambda a: a["largest-logit"]) if _LOG["arrivals"] else None
    print(f"{out}: {len(_LOG['arrivals'])} arrivals, {len(_LOG['aggregations'])} aggregations; largest client "
          f"logit {largest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
