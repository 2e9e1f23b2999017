"""What one FedRevive KD update does, measured inside a real run (issue 29; the paper's Sec. 3.2 / App. G).

The FedRevive paper separates Eq. (3)'s halves by applying, at a server round, only the stale
client update, only the KD-revived update, or both, and reading the test accuracy (its Fig. 4
left, Fig. 10). This script does that inside a real built-in-app run (the ServerApp's ``main``
on the in-process Grid, asyncfl's ClientApp, the virtual clock): at every ``--every``-th KD
update it takes the arrival's ``Delta``, the ``Delta_KD`` the run computed, ``beta(tau)`` and
``eta_s``, and evaluates on real held-out images (test split rows 0-1999, never trained on):

- the current model, and the current model plus ``eta_s Delta`` (the stale update alone, as
  FedBuff with buffer 1), ``eta_s (1 - beta) Delta`` (AFL-DW), ``eta_s Delta_KD`` (KD alone),
  ``eta_s [(1 - beta) Delta + beta Delta_KD]`` (Eq. 3, what the run applies), and the student
  itself (``current + Delta_KD``);
- the same KD update distilled on *real* images instead of synthetic ones (test rows 2000-2999,
  labels drawn by the same teacher proportions): is the limit the synthetic data or KD?
- the teachers: each buffered client model's accuracy, and their ensembles (plain mean of the
  softmaxes, and class-weighted as KD weights them), the targets KD pulls the student towards;
- the synthetic pool: class balance, and the teachers' confidence on it and agreement with the
  label the generator was asked for.

The probe leaves the run as it is: its own random stream, its own networks. Writes
``benchmarks/fedrevive-fmnist/kd-probe-<name>.json`` (every probe and the means).

Usage::

    python benchmarks/fedrevive_kd_probe.py --name tau30 -c fedrevive.max-staleness=30
    python benchmarks/fedrevive_kd_probe.py --table     # kd-probe.md from every kd-probe-*.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from asyncfl.client_app.training import evaluate  # noqa: E402
from asyncfl.data import load_dataset  # noqa: E402
from asyncfl.models.flat import load_flat  # noqa: E402
from asyncfl.strategies import registry  # noqa: E402
from asyncfl.strategies.fedrevive import FedRevive  # noqa: E402
from asyncfl.strategies.revive.pool import KDPool  # noqa: E402
from asyncfl.strategies.revive.proxies import teacher_class_weights  # noqa: E402
from matrix import run_in_process  # noqa: E402

OUT = ROOT / "benchmarks" / "fedrevive-fmnist"
EVAL_ROWS = slice(0, 2000)
REAL_KD_ROWS = slice(2000, 3000)

#: FedRevive's Table 1 setting (benchmarks/matrix.py FEDREVIVE) on Fashion-MNIST.
SETTING = {"dataset": "fashion-mnist", "strategy": "fedrevive", "model": "cnn", "model.batchnorm": True,
           "optimizer": "adam", "lr": 0.001, "local-steps": 25, "batch-size": 32, "concurrency": 20,
           "dirichlet-alpha": 0.5, "delay-model": "fedrevive-default", "fedrevive.server-lr": 0.05,
           "max-arrivals": 400, "evaluate-every-time": 1.0, "progress": False, "checkpoint-every": 0}
SUPERNODES = 200

_PROBE: dict = {}  # held-out data, cadence and records, set by main() before the run


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def _softmaxes(nets: list[torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([F.softmax(net(x), dim=1) for net in nets])  # teachers x samples x classes


class ProbedFedRevive(FedRevive):
    """FedRevive with the probe above around its KD updates (the run's own math is untouched)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delta_kd: np.ndarray | None = None
        self._probe_net = self.make_model().eval()
        self._probe_rng = np.random.default_rng(12345)

    def distil(self, current: np.ndarray) -> np.ndarray:
        self._delta_kd = super().distil(current)
        return self._delta_kd

    def on_arrival(self, arrival, current):
        self._delta_kd = None
        new = super().on_arrival(arrival, current)
        if self._delta_kd is not None and self.kd_updates % _PROBE["every"] == 1 % _PROBE["every"]:
            _PROBE["records"].append(self._probe(arrival, current, self._delta_kd))
            print(f"probe {len(_PROBE['records'])} at update {self.updates}: "
                  f"{json.dumps(_PROBE['records'][-1]['delta-loss'])}", flush=True)
        return new

    def _real_kd(self, current: np.ndarray) -> np.ndarray:
        """The same KD update (same teachers, steps, lr, per-teacher proportions) on real images."""
        pool, rng = self.pool, self._np_rng
        self.pool, self._np_rng = _PROBE["real_pool"], self._probe_rng
        try:
            return super().distil(current)
        finally:
            self.pool, self._np_rng = pool, rng

    def _probe(self, arrival, current: np.ndarray, delta_kd: np.ndarray) -> dict:
        x, y = _PROBE["x"], _PROBE["y"]
        xs, ys = x.numpy(), y.numpy()
        beta, lr = self.beta(arrival.staleness), self._paced_lr(self.config.server_lr)
        delta = arrival.delta
        real_kd = self._real_kd(current)
        mask = self.mixing.mask  # norms and angles over parameters (BatchNorm statistics left out)
        candidates = {
            "current": current,
            "client-only": current + np.float32(lr) * delta,
            "afl-dw": current + np.float32(lr * (1 - beta)) * delta,
            "kd-only": current + np.float32(lr) * delta_kd,
            "eq3": current + np.float32(lr) * (np.float32(1 - beta) * delta + np.float32(beta) * delta_kd),
            "student": current + delta_kd,
            "eq3-real-kd": current + np.float32(lr) * (np.float32(1 - beta) * delta + np.float32(beta) * real_kd),
            "student-real-kd": current + real_kd,
        }
        scores = {name: evaluate(load_flat(self._probe_net, flat), xs, ys) for name, flat in candidates.items()}
        base_loss, base_acc = scores["current"]
        teachers = [net for _, net in self._buffer]
        teacher_scores = [evaluate(t, xs, ys) for t in teachers]
        soft = _softmaxes(teachers, x)
        weights = torch.from_numpy(teacher_class_weights([self._proportions(c) for c, _ in self._buffer])).float()
        plain = soft.mean(0)
        weighted = (soft * weights[:, None, :]).sum(0)
        pool_x, pool_y = self.pool.x[-512:], self.pool.y[-512:]
        pool_soft = _softmaxes(teachers, pool_x)
        pool_weighted = (pool_soft * weights[:, None, :]).sum(0)
        pool_weighted = pool_weighted / pool_weighted.sum(1, keepdim=True)
        counts = np.bincount(self.pool.y.numpy(), minlength=self.num_classes)
        shares = counts / counts.sum()
        student_pool = F.softmax(load_flat(self._probe_net, current).eval()(pool_x), dim=1).detach()
        return {
            "update": self.updates, "staleness": int(arrival.staleness), "beta": beta, "server-lr": lr,
            "norm-delta": float(np.linalg.norm(delta[mask])), "norm-kd": float(np.linalg.norm(delta_kd[mask])),
            "norm-real-kd": float(np.linalg.norm(real_kd[mask])),
            "cosine-kd-delta": _cosine(delta_kd[mask], delta[mask]),
            "cosine-kd-real-kd": _cosine(delta_kd[mask], real_kd[mask]),
            "accuracy": {name: acc for name, (_, acc) in scores.items()},
            "delta-loss": {name: round(loss - base_loss, 6) for name, (loss, _) in scores.items() if name != "current"},
            "delta-accuracy": {name: round(acc - base_acc, 6) for name, (_, acc) in scores.items() if name != "current"},
            "teachers": {"accuracy-mean": statistics.fmean(a for _, a in teacher_scores),
                         "accuracy-min": min(a for _, a in teacher_scores),
                         "accuracy-max": max(a for _, a in teacher_scores),
                         "ensemble-mean-accuracy": float((plain.argmax(1) == y).float().mean()),
                         "ensemble-class-weighted-accuracy": float((weighted.argmax(1) == y).float().mean())},
            "pool": {"size": len(self.pool), "largest-class-share": float(shares.max()),
                     "classes-present": int((counts > 0).sum()),
                     "label-entropy-bits": float(-(shares[shares > 0] * np.log2(shares[shares > 0])).sum()),
                     "teacher-confidence": float(pool_weighted.max(1).values.mean()),
                     "teacher-agrees-with-label": float((pool_weighted.argmax(1) == pool_y).float().mean()),
                     "student-confidence": float(student_pool.max(1).values.mean()),
                     "student-agrees-with-label": float((student_pool.argmax(1) == pool_y).float().mean())},
        }


def _means(records: list[dict]) -> dict:
    """Mean (and sd) of every probe figure, and how often each candidate lowered the held-out loss."""
    out: dict = {"probes": len(records)}
    for key in ("beta", "staleness", "norm-delta", "norm-kd", "norm-real-kd", "cosine-kd-delta",
                "cosine-kd-real-kd"):
        out[key] = statistics.fmean(r[key] for r in records)
    out["kd-to-delta-norm-geomean"] = 10 ** statistics.fmean(math.log10(r["norm-kd"] / r["norm-delta"]) for r in records)
    for group in ("delta-loss", "delta-accuracy"):
        out[group] = {name: {"mean": statistics.fmean(r[group][name] for r in records),
                             "sd": statistics.pstdev(r[group][name] for r in records)}
                      for name in records[0][group]}
    out["loss-lowered-share"] = {name: sum(r["delta-loss"][name] < 0 for r in records) / len(records)
                                 for name in records[0]["delta-loss"]}
    for group in ("teachers", "pool", "accuracy"):
        out[group] = {name: statistics.fmean(r[group][name] for r in records) for name in records[0][group]}
    return out


#: The candidates of a probe, as the table names them.
CANDIDATES = {"client-only": "x + eta_s Delta (client update alone)", "afl-dw": "x + eta_s (1-beta) Delta (AFL-DW)",
              "kd-only": "x + eta_s Delta_KD (KD alone)", "eq3": "x + eta_s [(1-beta) Delta + beta Delta_KD] (Eq. 3)",
              "student": "x + Delta_KD (the distilled student)",
              "eq3-real-kd": "Eq. 3 with KD on real images", "student-real-kd": "the student distilled on real images"}


def table() -> str:
    """Markdown: every kd-probe-*.json side by side (means over its probes)."""
    results = {path.stem.removeprefix("kd-probe-"): json.loads(path.read_text())
               for path in sorted(OUT.glob("kd-probe-*.json"))}
    names = list(results)
    lines = ["| per probed KD update (mean) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    means = {n: r["means"] for n, r in results.items()}
    row("probes (updates)", [f"{m['probes']} ({r['probes'][0]['update']}-{r['probes'][-1]['update']})"
                             for m, r in zip(means.values(), results.values())])
    row("beta", [f"{m['beta']:.2f}" for m in means.values()])
    row("staleness", [f"{m['staleness']:.1f}" for m in means.values()])
    row("norm Delta_KD / norm Delta (geomean, parameters)", [f"{m['kd-to-delta-norm-geomean']:.3f}" for m in means.values()])
    row("cosine(Delta_KD, Delta)", [f"{m['cosine-kd-delta']:.2f}" for m in means.values()])
    row("cosine(Delta_KD, Delta_KD on real images)", [f"{m.get('cosine-kd-real-kd', float('nan')):.2f}"
                                                      for m in means.values()])
    row("held-out accuracy of x", [f"{100 * m['accuracy']['current']:.1f}" for m in means.values()])
    for key, label in CANDIDATES.items():
        row(f"{label}: change in held-out loss (share of probes lowering it)",
            [f"{m['delta-loss'][key]['mean']:+.4f} ({m['loss-lowered-share'][key]:.0%})" for m in means.values()])
    for key, label in (("student", "the student"), ("student-real-kd", "the student, real-image KD")):
        row(f"{label}: change in held-out accuracy, points",
            [f"{100 * m['delta-accuracy'][key]['mean']:+.1f}" for m in means.values()])
    row("teachers' accuracy: mean (min-max)", [f"{100 * m['teachers']['accuracy-mean']:.1f} "
                                               f"({100 * m['teachers']['accuracy-min']:.1f}-"
                                               f"{100 * m['teachers']['accuracy-max']:.1f})" for m in means.values()])
    row("teachers' ensemble accuracy: plain / class-weighted",
        [f"{100 * m['teachers']['ensemble-mean-accuracy']:.1f} / "
         f"{100 * m['teachers']['ensemble-class-weighted-accuracy']:.1f}" for m in means.values()])
    row("probes where the class-weighted ensemble beats x",
        [f"{sum(p['teachers']['ensemble-class-weighted-accuracy'] > p['accuracy']['current'] for p in r['probes'])}"
         f"/{len(r['probes'])}" for r in results.values()])
    row("pool: classes present, largest class share", [f"{m['pool']['classes-present']:.0f}, "
                                                       f"{m['pool']['largest-class-share']:.2f}" for m in means.values()])
    row("pool: teachers' confidence / agreement with the asked label",
        [f"{m['pool']['teacher-confidence']:.2f} / {m['pool']['teacher-agrees-with-label']:.2f}" for m in means.values()])
    row("pool: the student's confidence / agreement", [f"{m['pool']['student-confidence']:.2f} / "
                                                        f"{m['pool']['student-agrees-with-label']:.2f}"
                                                        for m in means.values()])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="only write kd-probe.md from the kd-probe-*.json files")
    parser.add_argument("--name", help="names the output file kd-probe-<name>.json")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=int, default=5, help="probe every n-th KD update")
    parser.add_argument("-c", "--config", action="append", default=[], help="key=value over the setting")
    args = parser.parse_args(argv)
    if args.table:
        (OUT / "kd-probe.md").write_text(table())
        print(table())
        return 0
    if not args.name:
        parser.error("--name is required to run a probe")
    config = {**SETTING, "seed": args.seed, "output-dir": str(OUT / "probe-runs"), "run-name": f"{args.name}__s{args.seed}"}
    for item in args.config:
        key, _, value = item.partition("=")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:  # a plain string (a name, a comma-separated list)
            config[key] = value
    splits = load_dataset(config["dataset"])
    real = KDPool(REAL_KD_ROWS.stop - REAL_KD_ROWS.start)
    real.add(torch.from_numpy(splits.x_test[REAL_KD_ROWS]), torch.from_numpy(splits.y_test[REAL_KD_ROWS]))
    _PROBE.update(every=args.every, records=[], real_pool=real, x=torch.from_numpy(splits.x_test[EVAL_ROWS]),
                  y=torch.from_numpy(splits.y_test[EVAL_ROWS]))
    # the run's strategy name resolves to the probed class (same knobs, same math)
    registry.STRATEGY_CLASSES["fedrevive"] = f"{__name__}:ProbedFedRevive"
    run_in_process(config, SUPERNODES)
    summary = json.loads((Path(config["output-dir"]) / config["run-name"] / "summary.json").read_text())
    result = {"config": config, "supernodes": SUPERNODES, "eval-rows": [EVAL_ROWS.start, EVAL_ROWS.stop],
              "real-kd-rows": [REAL_KD_ROWS.start, REAL_KD_ROWS.stop], "run-summary": summary,
              "means": _means(_PROBE["records"]) if _PROBE["records"] else {}, "probes": _PROBE["records"]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"kd-probe-{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / "kd-probe.md").write_text(table())
    print(json.dumps(result["means"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
