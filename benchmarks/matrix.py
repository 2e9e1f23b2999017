"""Run a study (methods x scenarios x seeds) through real ``asyncfl run`` and tabulate it.

Every cell is one ``flwr run`` of the app on its own simulation SuperLink, so
the numbers come from the same code path as the quickstart. Runs are written to
``benchmarks/<study>/runs/<method>__<scenario>__s<seed>/`` and skipped when
their ``summary.json`` exists, so an interrupted study resumes where it stopped.
Order is seed-major: after the first pass every cell has one seed.

Usage::

    python benchmarks/matrix.py fedecho            # run (resumes) and write the table
    python benchmarks/matrix.py fedecho --table    # only rebuild the table from finished runs
    python benchmarks/matrix.py fedadt-fmnist --in-process --workers 2   # no SuperLink/Ray: the same ServerApp
                                                                          # and ClientApp code, one process per run

``--in-process`` runs the built-in ServerApp's ``main`` against an in-process Grid that calls
asyncfl's ClientApp directly (:class:`asyncfl.simulation.inprocess.InProcessGrid`): the same
strategy, engine, virtual clock, data and training code, without a SuperLink, Ray and a process
per message, so a study of many long runs fits on a CPU. Seeded runs are identical either way
up to the ClientApp's thread count.

Reported per cell (mean +- sd over seeds): ``final`` = mean accuracy of the
last three evaluations (single evaluations oscillate under large delays),
``best`` = best evaluation, and virtual time to a target accuracy.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncfl.config import foreign_settings  # noqa: E402 (the repository's package, from a script)
from asyncfl.server_app import checkpoint  # noqa: E402
from asyncfl.server_app.run_folder import toml_value  # noqa: E402


@dataclass(frozen=True)
class Study:
    """A grid of runs: every method under every scenario with every seed."""

    name: str
    supernodes: int
    common: dict
    methods: dict[str, dict]
    scenarios: dict[str, dict]
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    notes: str = ""
    extra: dict[str, dict] = field(default_factory=dict)  # ablation cells: name -> (method overrides + scenario)
    extra_seeds: tuple[int, ...] = (1,)  # ablations run with these seeds only (CPU budget)
    affected_class: int | None = None  # report accuracy on this class too (the GI paper's headline)
    final_window: int = 3  # "final" = mean of this many last evaluations
    relative_target: tuple[str, float] | None = None  # (method, f): time to f x that method's best (per scenario)
    paper_time_reference: str | None = None  # the GI paper's Tables 10-11: time relative to this method (= 100)
    stale_window_start: float | None = None  # affected-class accuracy is also averaged over the evaluations after it
    grid_families: tuple[str, ...] = ()  # a tuning grid: rows named "<family>-..." compete for their family's best
    diverged: tuple[str, ...] = ()  # grid rows that diverged (no final accuracy): run, never a family's best
    paired_against: tuple[str, ...] = ()  # affected class: every row's per-seed differences from these rows


def tuned(grid: str, family: str) -> dict:
    """A method's settings at the best point of the tuning study ``grid`` (highest final accuracy of ``family``'s
    rows), read from that study's stored runs when a study using it runs (:func:`resolve_tuned`)."""
    return {TUNED_KEY: f"{grid}/{family}"}


TUNED_KEY = "tuned-from"


# FedEcho's comparison (its Tables 2-3) at CPU scale: the paper's concurrency ratio (M_c = half the clients)
# and M = 5 with 20 clients instead of 50, two delay scenarios x two Dirichlet levels; LeNet-5 on mnist5k,
# 10 local Adam steps, U = 500 resized sklearn digits, 80 virtual time units (every long client of the
# large scenario reports at least once).
FEDECHO = Study(
    name="fedecho",
    supernodes=20,
    common={"model": "lenet5", "local-steps": 10, "concurrency": 10, "max-arrivals": 0,
            "max-time": 80.0, "evaluate-every-time": 4.0, "progress": False, "fedecho.distill-size": 500,
            "target-accuracy": "0.6,0.85",
            "fedecho.distill-lr": 1e-4,  # the run-config default when this study ran (now the paper's 3e-6)
            # the paper's server step (the run-config default when this study ran; now paced by the concurrency)
            "fedbuff.server-lr": 1.0, "ca2fl.server-lr": 1.0, "fedecho.server-lr": 1.0, "fedbuff.buffer-size": 5,
            "fadas.buffer-size": 5, "fedecho.buffer-size": 5, "ca2fl.buffer-size": 5,
            "fadas.beta1": 0.9},  # the paper's server momentum (the run-config default when this study ran; now 0.5)
    methods={
        "fedbuff": {"strategy": "fedbuff"},
        "ca2fl": {"strategy": "ca2fl"},
        "fadas": {"strategy": "fadas"},
        "fedecho": {"strategy": "fedecho"},
    },
    scenarios={
        "large-dir0.1": {"delay-model": "fedecho-large", "dirichlet-alpha": 0.1},
        "large-dir0.3": {"delay-model": "fedecho-large", "dirichlet-alpha": 0.3},
        "mild-dir0.1": {"delay-model": "fedecho-mild", "dirichlet-alpha": 0.1},
        "mild-dir0.3": {"delay-model": "fedecho-mild", "dirichlet-alpha": 0.3},
    },
    seeds=(1, 2, 3),
    targets=(0.6, 0.85),
    extra={
        # FedEcho Table 7: fixed alpha (0 = CE only, 1 = KL only, 0.5) vs dynamic, large delay, Dir 0.1.
        "fedecho-alpha0__large-dir0.1": {"strategy": "fedecho", "fedecho.alpha-min": 0.0, "fedecho.alpha-max": 0.0,
                                         "delay-model": "fedecho-large", "dirichlet-alpha": 0.1},
        "fedecho-alpha0.5__large-dir0.1": {"strategy": "fedecho", "fedecho.alpha-min": 0.5,
                                           "fedecho.alpha-max": 0.5, "delay-model": "fedecho-large",
                                           "dirichlet-alpha": 0.1},
        "fedecho-alpha1__large-dir0.1": {"strategy": "fedecho", "fedecho.alpha-min": 1.0, "fedecho.alpha-max": 1.0,
                                         "delay-model": "fedecho-large", "dirichlet-alpha": 0.1},
    },
)

# FedADT's comparison (its Tables I-II) on its setting at CPU scale: 20% concurrency and response time
# U(0, 5000) as in the paper, 200 clients instead of 500; LeNet-5, 10 local SGD steps at lr 0.01; 400 arrivals.
_FEDADT_DELAYS = {"delay-model": "custom", "delay.download.tiers": "0.0", "delay.train.distribution": "uniform",
                  "delay.train.tiers": "2500.0", "delay.train.spread": 2500.0, "delay.upload.distribution": "constant",
                  "delay.upload.tiers": "0.0"}
FEDADT = Study(
    name="fedadt",
    supernodes=200,
    common={"model": "lenet5", "local-steps": 10, "concurrency": 40, "optimizer": "sgd", "lr": 0.01,
            "max-arrivals": 400, "evaluate-every-time": 2000.0,
            "progress": False, "target-accuracy": "0.7", **_FEDADT_DELAYS,
            # the baselines' settings when this study ran (the run-config defaults then; they are paced by the
            # concurrency now, see asyncfl/strategies/pace.py)
            "fedbuff.server-lr": 1.0, "ca2fl.server-lr": 1.0, "fedfa.queue-size": 10, "fedasync.alpha": 0.6,
            "fedbuff.buffer-size": 5, "ca2fl.buffer-size": 5},
    methods={
        "fedavg": {"strategy": "fedavg"},
        "fedasync": {"strategy": "fedasync"},
        "fedbuff": {"strategy": "fedbuff"},
        "ca2fl": {"strategy": "ca2fl"},
        "fedfa": {"strategy": "fedfa"},
        "fedadt": {"strategy": "fedadt"},
    },
    scenarios={"paper": {}},
    seeds=(1, 2),
    targets=(0.6, 0.7),
    extra={
        # FedADT Table III: a fixed KD weight instead of the adaptive schedule.
        "fedadt-fixed0.4__paper": {"strategy": "fedadt", "fedadt.alpha-min": 0.4, "fedadt.alpha-max": 0.4},
    },
)

# The GI paper's methods (its Tables 9-11); "unweighted" is also GI's ablation: the same rounds without inversion.
_GI_METHODS = {
    "unweighted": {"strategy": "fedavg"},
    "weighted": {"strategy": "stale-weighted"},
    "1st-order": {"strategy": "dc-asgd"},
    "w-pred": {"strategy": "w-pred"},
    "asyn-tiers": {"strategy": "asyn-tiers"},
    "gi": {"strategy": "gi-compensation"},
}

# The gradient-inversion paper's fixed-data scenario (its Tables 9-11) at CPU scale: 100 clients on mnist5k,
# Dirichlet 0.1, 20 clients start per round (the paper: all), the 10 biggest holders of class 5 late by S
# rounds, LeNet-5, 5 local epochs of SGD lr 0.01 momentum 0.5 (batch 64), 150 rounds. GI runs 100 Adam
# iterations from scratch and 40 from a warm start (the paper: up to 40k on a GPU).
GI = Study(
    name="gi",
    supernodes=100,
    common={"model": "lenet5", "optimizer": "sgd", "lr": 0.01, "momentum": 0.5, "local-epochs": 5, "local-steps": 0,
            "batch-size": 64, "concurrency": 20, "round-deadline": 1.0, "delay-model": "intertwined",
            "intertwined.class": 5, "intertwined.clients": 10, "max-time": 150.0, "max-arrivals": 0,
            "evaluate-every-time": 1.0, "progress": False, "target-accuracy": "0.8", "gi.inversion-iterations": 100,
            "gi.warm-iterations": 40,
            "gi.switch-margin": 1.0},  # the paper's E1 > E2, the default when this study ran (now 0.9)
    methods=_GI_METHODS,
    scenarios={
        "s40-dir0.1": {"intertwined.staleness": 40, "dirichlet-alpha": 0.1},
        "s10-dir0.1": {"intertwined.staleness": 10, "dirichlet-alpha": 0.1},
        # the paper's variant-data scenario (Sec. 4.3, Fig. 13): every client's samples drift to sklearn digits
        # (SVHN's stand-in), 1% of them per round, all replaced by round 100; late clients as in s40
        "drift-s40-dir0.1": {"intertwined.staleness": 40, "dirichlet-alpha": 0.1, "drift.source": "digits",
                             "drift.rate": 0.01},
        # the paper's Table 10 (data heterogeneity) and Table 11 (staleness 100) columns
        "s40-dir1": {"intertwined.staleness": 40, "dirichlet-alpha": 1.0},
        "s40-dir0.01": {"intertwined.staleness": 40, "dirichlet-alpha": 0.01},
        "s100-dir0.1": {"intertwined.staleness": 100, "dirichlet-alpha": 0.1},
        # the paper's delayed clients train every round, each update landing S rounds later: ~2 stale updates in
        # every round of 20 (the paper: 10 of 100) instead of one per late client every S rounds
        "pipe-s40-dir0.1": {"intertwined.staleness": 40, "dirichlet-alpha": 0.1, "pipeline-late-clients": True},
        "pipe-s40-dir0.01": {"intertwined.staleness": 40, "dirichlet-alpha": 0.01, "pipeline-late-clients": True},
        # a drift that makes the task harder (digits made it easier): 1% of every client's samples per round turn
        # into their intensity-negated copies; pipelined late clients, as in the paper's delayed clients
        "pipe-drift-inv-s40-dir0.1": {"intertwined.staleness": 40, "dirichlet-alpha": 0.1,
                                      "pipeline-late-clients": True, "drift.source": "inverted", "drift.rate": 0.01},
    },
    seeds=(1, 2, 3),  # seeds 2-3 only for the headline pipelined S = 40 cells (CPU budget)
    targets=(0.3, 0.5),
    extra={  # the paper's "Unstale" reference: nobody late (one run serves every staleness level)
        "unstale__s40-dir0.1": {"strategy": "fedavg", "delay-model": "uniform-speed", "dirichlet-alpha": 0.1},
        "unstale__s40-dir1": {"strategy": "fedavg", "delay-model": "uniform-speed", "dirichlet-alpha": 1.0},
        "unstale__s40-dir0.01": {"strategy": "fedavg", "delay-model": "uniform-speed", "dirichlet-alpha": 0.01},
        "unstale__drift-s40-dir0.1": {"strategy": "fedavg", "delay-model": "uniform-speed", "dirichlet-alpha": 0.1,
                                      "drift.source": "digits", "drift.rate": 0.01},
        "unstale__pipe-drift-inv-s40-dir0.1": {"strategy": "fedavg", "delay-model": "uniform-speed",
                                               "dirichlet-alpha": 0.1, "drift.source": "inverted", "drift.rate": 0.01},
        # our switch-back rule (mean E1 vs mean E2 over the last 3 comparisons) against the paper's first E1 > E2
        "gi-mean__s40-dir0.1": {"strategy": "gi-compensation", "gi.switch-rule": "mean", "intertwined.staleness": 40,
                                "dirichlet-alpha": 0.1},
        "gi-mean__s10-dir0.1": {"strategy": "gi-compensation", "gi.switch-rule": "mean", "intertwined.staleness": 10,
                                "dirichlet-alpha": 0.1},
        # a better fit: every coordinate in the disparity and 3x the iterations (the estimation-error benchmark's
        # best column), to test whether fit quality is what holds GI back at S = 40
        "gi-fit__s40-dir0.1": {"strategy": "gi-compensation", "gi.keep-fraction": 1.0, "gi.inversion-iterations": 300,
                               "gi.warm-iterations": 120, "intertwined.staleness": 40, "dirichlet-alpha": 0.1},
    },
    affected_class=5,
    final_window=10,  # one evaluation per round: class-5 accuracy swings from round to round
    paper_time_reference="gi",
)

# The GI paper's Table 9 FMNIST column (class 5 late by 40 rounds; Unweighted 49.2, Weighted 30.1, 1st-Order
# 49.3, W-Pred 48.9, Asyn-Tiers 50.3, GI 55.4) with the reference code's local program: 100 clients on
# Fashion-MNIST Dirichlet 0.1, 10 start per round (the reference's frac 0.1), every local job 5 full-batch SGD
# steps without momentum (its local_ep 5 at local_bs 600), the 10 biggest holders of class 5 late by 40 rounds
# and pipelined (the reference's delayed clients train every time they are picked, from the model 40 rounds
# old), LeNet-5, 120 rounds. GI: 200 Adam iterations from scratch, 80 warm (2x the mnist5k study's, what 3
# seeds fit in a CPU session; the reference: 40,000 on a GPU), the reference's switch-back margin (E2 < 0.9 E1).
# The local lr is 0.1 (the reference's 0.01 over 800 rounds; 120 here; 0.05 learnt slower in a probe): one
# value for every method, not a method's knob.
GI_FMNIST = Study(
    name="gi-fmnist",
    supernodes=100,
    common={"dataset": "fashion-mnist", "dirichlet-alpha": 0.1, "model": "lenet5", "optimizer": "sgd", "lr": 0.1,
            "momentum": 0.0, "local-epochs": 0, "local-steps": 5, "batch-size": 60000, "concurrency": 10,
            "round-deadline": 1.0, "delay-model": "intertwined", "intertwined.class": 5, "intertwined.clients": 10,
            "intertwined.staleness": 40, "pipeline-late-clients": True, "max-time": 120.0,
            "max-arrivals": 0, "evaluate-every-time": 1.0, "progress": False, "target-accuracy": "0.3,0.5",
            "gi.inversion-iterations": 200, "gi.warm-iterations": 80, "gi.switch-margin": 0.9},
    methods=_GI_METHODS,
    scenarios={"pipe-s40-dir0.1": {}},
    # seeds 4-8 for GI, Unweighted, Asyn-Tiers and the mean-of-3 rule only (issue 43: the late class's seed sd
    # exceeds the effect, so paired differences over 8 seeds); the other ablations ran seed 1 (CPU budget)
    seeds=(1, 2, 3, 4, 5, 6, 7, 8),
    targets=(0.3, 0.5),
    extra={"unstale__pipe-s40-dir0.1": {"strategy": "fedavg", "delay-model": "uniform-speed",
                                        "pipeline-late-clients": False},
           # the switch-back rule on the mean of the last 3 comparisons (ours) instead of the first one: does
           # compensating to the end help? (seed 1: its first rule switched at version 86 on the third comparison
           # although the mean E1 69 was below the mean E2 80)
           "gi-mean__pipe-s40-dir0.1": {"strategy": "gi-compensation", "gi.switch-rule": "mean"}},
    extra_seeds=(1, 2, 3, 4, 5, 6, 7, 8),  # unstale ran seed 1 only (CPU budget)
    affected_class=5,
    final_window=10,
    paper_time_reference="gi",
    stale_window_start=40.0,
    paired_against=("unweighted", "asyn-tiers", "gi"),  # gi: the mean-of-3 switch rule against the paper's
)

# PushCen-ADFL's comparison (its Tables 1, 2, 5) at CPU scale: 50 peers on mnist5k with LeNet-5 (the paper:
# 100 peers on CIFAR-10), pushes to 10 random peers, buffer 10, k = 32, lambda = 0.1, 10% of the peers join
# late; every peer computes back to back with fedrevive-default durations over 20 virtual units; accuracy
# on each peer's own local test split at 60 points.
PUSHCEN = Study(
    name="pushcen",
    supernodes=50,
    common={"model": "lenet5", "optimizer": "sgd", "lr": 0.01, "momentum": 0.5, "local-steps": 10,
            "max-time": 20.0, "max-arrivals": 0, "progress": False,
            "pushcen.penalty": "sum"},  # the regulariser when this study ran (Eq. 2's sum; now each layer's mean)
    methods={
        "independent": {"strategy": "independent"},
        "async-dfedavg": {"strategy": "async-dfedavg"},
        "divshare": {"strategy": "divshare"},
        "swift": {"strategy": "swift"},
        "pushcen": {"strategy": "pushcen"},
    },
    scenarios={"dir0.1": {"dirichlet-alpha": 0.1}, "dir0.5": {"dirichlet-alpha": 0.5}},
    seeds=(1, 2),
    targets=(),
    extra={
        # PushCen Table 4: without the centroid regulariser, without sender deduplication.
        "pushcen-noreg__dir0.5": {"strategy": "pushcen", "pushcen.lambda": 0.0, "dirichlet-alpha": 0.5},
        "pushcen-nodedup__dir0.5": {"strategy": "pushcen", "gossip.dedup": False, "dirichlet-alpha": 0.5},
        # PushCen Table 6: the number of centroids (accuracy vs bytes).
        "pushcen-k8__dir0.5": {"strategy": "pushcen", "pushcen.k": 8, "dirichlet-alpha": 0.5},
        "pushcen-k128__dir0.5": {"strategy": "pushcen", "pushcen.k": 128, "dirichlet-alpha": 0.5},
        # SWIFT's own setting: a static graph (each peer always pushes to the same 10 peers).
        "swift-fixed__dir0.5": {"strategy": "swift", "gossip.topology": "fixed", "dirichlet-alpha": 0.5},
        "pushcen-fixed__dir0.5": {"strategy": "pushcen", "gossip.topology": "fixed", "dirichlet-alpha": 0.5},
    },
)

# The same at the paper's 100 peers (its CIFAR-10 runs): accuracy, bytes, relay cost and memory at twice the peers.
PUSHCEN100 = Study(
    name="pushcen100",
    supernodes=100,
    common=PUSHCEN.common,
    methods={m: PUSHCEN.methods[m] for m in ("async-dfedavg", "swift", "pushcen")},
    scenarios={"dir0.5": {"dirichlet-alpha": 0.5}},
    seeds=(1,),
    targets=(),
)

# FedRevive's Table 1 setting at CPU scale on mnist5k: 200 clients, 20 in flight (the paper: 1000 / 100),
# Dirichlet 0.5, the BN CNN, 25 Adam iterations of batch 32, fedrevive-default delays; server learning rates
# from its Table 4 (FEMNIST column: FedAvg 1.4, FedBuff 0.025 with buffer 1, AFL-DW = FedRevive 0.05,
# DD-FedRevive 0.10) with the paper's
# KD knobs (c = 8, T_gen = 10, K_KD = 10, warm-up 50/100). 300 arrivals (the paper: 1500) because one
# FedRevive arrival costs ~3.8 s of server compute here (benchmarks/fedrevive_overhead.py). 10% of the
# training split is held out by the server in every cell (only DD-FedRevive uses it) so all cells see the
# same client data.
FEDREVIVE = Study(
    name="fedrevive",
    supernodes=200,
    common={"model": "cnn", "model.batchnorm": True, "optimizer": "adam", "lr": 0.001, "local-steps": 25,
            "batch-size": 32, "concurrency": 20, "dirichlet-alpha": 0.5, "server-holdout": 0.1,
            "max-arrivals": 300, "evaluate-every-time": 1.0, "progress": False, "target-accuracy": "0.8,0.85,0.9"},
    methods={
        "fedbuff": {"strategy": "fedbuff", "fedbuff.buffer-size": 1, "fedbuff.server-lr": 0.025},
        "fedrevive": {"strategy": "fedrevive", "fedrevive.server-lr": 0.05},
        "afl-dw": {"strategy": "afl-dw", "afl-dw.server-lr": 0.05},
        "dd-fedrevive": {"strategy": "dd-fedrevive", "fedrevive.server-lr": 0.1},
        "fedavg": {"strategy": "fedavg", "fedavg.server-lr": 1.4},
    },
    scenarios={
        "default": {"delay-model": "fedrevive-default"},
        # its jobs are ~8x shorter (300 arrivals take ~3 units instead of ~25): evaluate 8x as often, so the
        # final window and the times to target cover as many arrivals as in the default scenario
        "shifted": {"delay-model": "fedrevive-shifted", "evaluate-every-time": 0.125},
    },
    seeds=(1, 2, 3),
    targets=(0.8, 0.85, 0.9),
    extra={
        # FedBuff is the paper's tuned FEMNIST one (Table 4: buffer 1, server lr 0.025); this is our default
        # buffer 5 with server lr 1.0.
        "fedbuff-b5__default": {"strategy": "fedbuff", "fedbuff.buffer-size": 5, "fedbuff.server-lr": 1.0,
                                "delay-model": "fedrevive-default"},
    },
    relative_target=("fedbuff", 0.85),
)

# FedADT's headline on its own data (its Tables I-II, FMNIST, Dirichlet 0.5: FedADT reaches 75 % in 11,324 virtual
# seconds, FedBuff in 15,942, FedAsync in 35,831; final 83.09 vs 82.98 and 81.70) at CPU scale: 100 clients
# instead of 500 with the paper's 20 % concurrency (20 in flight) and response time U(0, 5000), its recipe (SGD
# lr 0.01, batch 32; one local epoch; LeNet-5 for its CNN), 0.5 % of the training data as the server set (300
# examples), 1,600 arrivals (first run to 800, then extended by resuming each run from its last checkpoint).
# The ablation is FedADT's own mixing without the KD correction (FedAsync with alpha 1: beta = (1 + tau)^-1/2);
# FedAsync runs as Xie et al. recommend (alpha 0.6, polynomial) and with a constant alpha (the paper does not say).
FEDADT_FMNIST = Study(
    name="fedadt-fmnist",
    supernodes=100,
    common={"dataset": "fashion-mnist", "model": "lenet5", "optimizer": "sgd", "lr": 0.01, "momentum": 0.0,
            "local-epochs": 1, "local-steps": 0, "batch-size": 32, "concurrency": 20, "max-arrivals": 1600,
            "evaluate-every-time": 5000.0, "progress": False, "target-accuracy": "0.7,0.75", **_FEDADT_DELAYS,
            # the baselines' defaults when this study ran (FedBuff's step paced for any client, FedAsync's alpha)
            "fedbuff.pace": "stable", "fedasync.alpha": 0.6},
    methods={
        "fedadt": {"strategy": "fedadt"},
        "mixing-only": {"strategy": "fedasync", "fedasync.alpha": 1.0},
        "fedasync": {"strategy": "fedasync"},
        "fedasync-constant": {"strategy": "fedasync", "fedasync.staleness": "constant"},
        "fedbuff": {"strategy": "fedbuff", "fedbuff.buffer-size": 10},
        "fedavg": {"strategy": "fedavg"},
    },
    scenarios={"dir0.5": {"dirichlet-alpha": 0.5}},
    seeds=(1, 2, 3),
    targets=(0.7, 0.75),
    extra={  # FedADT Table III: a fixed KD weight instead of the adaptive 0.2 -> 0.6 ramp
        "fedadt-fixed0.2__dir0.5": {"strategy": "fedadt", "fedadt.alpha-min": 0.2, "fedadt.alpha-max": 0.2,
                                    "dirichlet-alpha": 0.5},
        "fedadt-fixed0.6__dir0.5": {"strategy": "fedadt", "fedadt.alpha-min": 0.6, "fedadt.alpha-max": 0.6,
                                    "dirichlet-alpha": 0.5},
        # the correction without its teacher: KD weight 0 leaves plain supervised steps on the 300 labeled server
        # images, which separates distillation from the extra labeled data FedADT has and the baselines do not
        "fedadt-ce-only__dir0.5": {"strategy": "fedadt", "fedadt.alpha-min": 0.0, "fedadt.alpha-max": 0.0,
                                   "dirichlet-alpha": 0.5},
    },
    extra_seeds=(1, 2, 3),
)

# FedADT at its paper's staleness (issue 43): 500 clients with 100 in flight (the paper's 20 % concurrency; mean
# staleness ~100 once every slot has turned over) and U(0, 5000) response times, Fashion-MNIST Dirichlet 0.5, and
# the paper's local program as its framework runs it: FLGo's default of 5 local epochs (the paper states lr 0.01,
# batch 32 and no epoch count) on each client's ~120 images = ~20 SGD steps per update. The model is our "cnn"
# (2 conv + FC 128), which learns at lr 0.01 as FLGo's CNN does (both ~0.75 after 400 centralised steps,
# measured) at half its cost; LeNet-5 sits on its initial plateau for ~300 such steps. 1,000 updates = T_g, where
# the paper's Table III reads its KD weights (the paper reaches 75 % at ~450 updates). The question: does the
# teacher term pay once it has weight (KL x T^2) at this staleness, against the same pass without a teacher
# (CE only) and FedADT's mixing without any correction?
FEDADT_FMNIST_PAPER = Study(
    name="fedadt-fmnist-paper",
    supernodes=500,
    common={**FEDADT_FMNIST.common, "model": "cnn", "local-epochs": 5, "concurrency": 100, "max-arrivals": 1000,
            "evaluate-every-time": 2500.0, "dirichlet-alpha": 0.5},
    methods={
        "fedadt": {"strategy": "fedadt"},
        "fedadt-t2": {"strategy": "fedadt", "fedadt.kl-scale": "t-squared"},
        "fedadt-ce-only": {"strategy": "fedadt", "fedadt.alpha-min": 0.0, "fedadt.alpha-max": 0.0},
        # FedADT's beta = (1 + tau)^-1/2 without the correction
        "mixing-only": {"strategy": "fedasync", "fedasync.alpha": 1.0, "fedasync.staleness": "polynomial",
                        "fedasync.staleness-decay": 0.5},
        # the paper's baselines (its Tables I-II): FedBuff with a buffer of 10, FedAsync as Xie et al. recommend
        "fedbuff": {"strategy": "fedbuff", "fedbuff.buffer-size": 10},
        "fedasync": {"strategy": "fedasync"},
    },
    scenarios={"dir0.5": {}},
    seeds=(11, 12, 13),
    targets=(0.7, 0.75),
    extra={  # Table III: a fixed KD weight instead of the adaptive 0.2 -> 0.6 ramp, with the teacher's weight as
        # KL x T^2 (the as-printed KL's share of the pull is ~2.5 %, so fixed weights could not differ without it)
        "fedadt-t2-fixed0.2__dir0.5": {"strategy": "fedadt", "fedadt.kl-scale": "t-squared",
                                       "fedadt.alpha-min": 0.2, "fedadt.alpha-max": 0.2},
        "fedadt-t2-fixed0.6__dir0.5": {"strategy": "fedadt", "fedadt.kl-scale": "t-squared",
                                       "fedadt.alpha-min": 0.6, "fedadt.alpha-max": 0.6},
    },
    extra_seeds=(11, 12, 13),
)

# FedRevive against its own ablation on Fashion-MNIST (issue 29): its Table 1 setting (as FEDREVIVE above: 200
# clients, 20 in flight, Dirichlet 0.5, 25 Adam steps of batch 32 at 1e-3, fedrevive-default delays, the paper's
# FEMNIST server step 0.05 for both, KD knobs as the paper's) on Fashion-MNIST, 400 arrivals, with the CNN built
# as the reference code builds its networks: statistics trackers where BatchNorm would go (recorded for the
# synthesis, activations not normalised; the BN CNN's aggregated running variances went negative hundreds of
# times per run). "tau30"
# puts beta(tau) where the paper's reference runs it: tau_max = 1.5 x the jobs in flight, so the typical
# staleness (about the concurrency) gets beta(20) = 0.75 on the 1-cosine family (the reference: 100 in flight,
# tau_max 150); the extra row is AFL-DW with our former tau_max 150 (beta averages ~0.05 at 20 in flight). What one
# KD update does: benchmarks/fedrevive_kd_probe.py (seed 1's FedRevive run is the probe's run).
FEDREVIVE_FMNIST = Study(
    name="fedrevive-fmnist",
    supernodes=200,
    common={"dataset": "fashion-mnist", "model": "cnn", "model.batchnorm": False, "model.track-statistics": True,
            "optimizer": "adam", "lr": 0.001, "local-steps": 25, "batch-size": 32, "concurrency": 20,
            "dirichlet-alpha": 0.5,
            "delay-model": "fedrevive-default", "max-arrivals": 400, "evaluate-every-time": 1.0, "progress": False,
            "target-accuracy": "0.8,0.85", "fedrevive.server-lr": 0.05, "afl-dw.server-lr": 0.05},
    methods={
        "fedrevive": {"strategy": "fedrevive"},
        "afl-dw": {"strategy": "afl-dw"},
    },
    scenarios={"tau30": {"fedrevive.max-staleness": 30.0, "afl-dw.max-staleness": 30.0}},
    seeds=(1, 2, 3),
    targets=(0.8, 0.85),
    extra={  # the former tau_max 150 (beta ~0.05 at 20 in flight) for the ablation: what the larger beta costs
        "afl-dw-tau150__tau30": {"strategy": "afl-dw", "afl-dw.max-staleness": 150.0},
    },
    extra_seeds=(1, 2, 3),
)

# FedEcho's comparison (its Tables 2 and 8) on Fashion-MNIST (issue 29), the paper's recipe at CPU scale: 20 clients
# (the paper: 50), M_c = 10 in flight and M = 5 as in the paper's ratio, Dirichlet 0.1 / 0.3, Table 1 delays,
# local SGD with weight decay 1e-4 and batch 50 (the paper: two epochs; here 20 steps, 1,000 examples), LeNet-5,
# 80 virtual time units (~300 arrivals). U is a different dataset, as the paper's CIFAR-100 for CIFAR-10
# clients: 2,000 MNIST images (mnist5k), no labels. "Both global and local learning rates are tuned for each
# method via grid search": the same 4 x 4 grid for every method (local lr 0.01 / 0.03 / 0.1 / 0.3 x server lr
# 0.25 / 0.5 / 1 / 2; FADAS's AMSGrad step 1e-4 / 1e-3 / 1e-2 / 1e-1; a first 3 x 3 grid put the best baselines
# on its edge) on a seed that the comparison does not use (FEDECHO_FMNIST_TUNE), the best final accuracy per
# method carried into FEDECHO_FMNIST.
_FEDECHO_FMNIST_COMMON = {
    "dataset": "fashion-mnist", "model": "lenet5", "optimizer": "sgd", "momentum": 0.0, "weight-decay": 1e-4,
    "batch-size": 50, "local-steps": 20, "concurrency": 10, "max-arrivals": 0, "max-time": 80.0,
    "evaluate-every-time": 4.0, "progress": False, "target-accuracy": "0.7,0.75",
    "fedecho.distill-set": "mnist5k", "fedecho.distill-size": 2000,
    "fedecho.distill-lr": 1e-4,  # the run-config default when this study ran (now the paper's 3e-6)
    "fedbuff.buffer-size": 5, "ca2fl.buffer-size": 5, "fadas.buffer-size": 5, "fedecho.buffer-size": 5,
    "fadas.beta1": 0.9}  # the paper's server momentum (the run-config default when this study ran; now 0.5)
_FEDECHO_GRID_LOCAL = (0.01, 0.03, 0.1, 0.3)
_FEDECHO_GRID_SERVER = {"fedbuff": (0.25, 0.5, 1.0, 2.0), "ca2fl": (0.25, 0.5, 1.0, 2.0),
                        "fadas": (1e-4, 1e-3, 1e-2, 1e-1), "fedecho": (0.25, 0.5, 1.0, 2.0)}
FEDECHO_FMNIST_TUNE = Study(
    name="fedecho-fmnist-tune",
    supernodes=20,
    common=_FEDECHO_FMNIST_COMMON,
    methods={f"{method}-l{local:g}-g{server:g}": {"strategy": method, "lr": local, f"{method}.server-lr": server}
             for method, servers in _FEDECHO_GRID_SERVER.items() for local in _FEDECHO_GRID_LOCAL
             for server in servers},
    scenarios={"large-dir0.1": {"delay-model": "fedecho-large", "dirichlet-alpha": 0.1}},
    seeds=(4,),
    targets=(0.7, 0.75),
    grid_families=tuple(_FEDECHO_GRID_SERVER),
)

# The comparison itself: every method at its grid point from FEDECHO_FMNIST_TUNE (seed 4, large delay, Dirichlet
# 0.1: the highest final accuracy), seeds 1-3, the paper's hardest and mildest cells. The ablation removes only
# the distillation (FedEcho's tuned step with 0 distillation steps: its buffered step alone); extra rows: U = the
# resized sklearn digits instead of MNIST, and FedEcho and FedBuff at the paper's server step 1 (its Table 8).
_FEDECHO_TUNED = {family: tuned("fedecho-fmnist-tune", family) for family in ("fedbuff", "ca2fl", "fadas", "fedecho")}
_LARGE_01 = {"delay-model": "fedecho-large", "dirichlet-alpha": 0.1}
FEDECHO_FMNIST = Study(
    name="fedecho-fmnist",
    supernodes=20,
    common=_FEDECHO_FMNIST_COMMON,
    methods={**_FEDECHO_TUNED, "fedecho-no-kd": {**_FEDECHO_TUNED["fedecho"], "fedecho.distill-steps": 0}},
    scenarios={"large-dir0.1": _LARGE_01, "mild-dir0.3": {"delay-model": "fedecho-mild", "dirichlet-alpha": 0.3}},
    seeds=(1, 2, 3),
    targets=(0.7, 0.75),
    extra={
        "fedecho-digits__large-dir0.1": {**_FEDECHO_TUNED["fedecho"], "fedecho.distill-set": "digits", **_LARGE_01},
        "fedecho-g1__large-dir0.1": {**_FEDECHO_TUNED["fedecho"], "fedecho.server-lr": 1.0, **_LARGE_01},
        "fedbuff-g1__large-dir0.1": {**_FEDECHO_TUNED["fedbuff"], "fedbuff.server-lr": 1.0, **_LARGE_01},
        # the paper's staleness: all 20 clients in flight with M = 5 (mean staleness ~4 versions; the paper's 25 / 5:
        # ~5) instead of 10 (1.7): does the distillation pay where updates are staler?
        "fedecho-k20__large-dir0.1": {**_FEDECHO_TUNED["fedecho"], "concurrency": 20, **_LARGE_01},
        "fedecho-no-kd-k20__large-dir0.1": {**_FEDECHO_TUNED["fedecho"], "fedecho.distill-steps": 0,
                                            "concurrency": 20, **_LARGE_01},
    },
    extra_seeds=(1, 2, 3),
)

# FedEcho at its paper's staleness (issue 43): 50 clients with 25 in flight and M = 5 (the paper's Sec. 5; mean
# staleness ~5 versions), Dirichlet 0.1, its large delays (Table 1), two local epochs of batch 50 with SGD and weight
# decay 1e-4 (its recipe: ~48 steps on each client's ~1,200 images), LeNet-5, 500 server versions (2,500 updates).
# The rates are the paper's Table 8 (CIFAR-10): FedEcho local 0.03 / global 1.0, FedBuff 0.01 / 1.0; the crossed
# controls give each the other's local rate, so the distillation is compared with its own ablation (FedEcho without
# distillation) at equal local rate. U = 2,000 images of the task's own held-out rows (5 % of the training split,
# taken out of every method's clients alike) so that each aggregation also measures what the distillation relies
# on: whether the stored-logit ensemble classifies U better than the global model (summary teacher-*); the row
# with U = MNIST is the paper's other-dataset choice. The grid Q x eta_d asks whether more or larger distillation
# steps than ours make the teacher count (the paper does not state Q).
_FEDECHO_PAPER_COMMON = {
    "dataset": "fashion-mnist", "model": "lenet5", "optimizer": "sgd", "momentum": 0.0, "weight-decay": 1e-4,
    "batch-size": 50, "local-epochs": 2, "local-steps": 0, "concurrency": 25, "max-arrivals": 2500,
    "evaluate-every-time": 20.0, "progress": False, "target-accuracy": "0.7,0.75", "server-holdout": 0.05,
    "fedecho.distill-set": "holdout", "fedecho.distill-size": 2000, "fedecho.buffer-size": 5,
    "fedecho.server-lr": 1.0, "fedbuff.buffer-size": 5, "fedbuff.server-lr": 1.0, **_LARGE_01}
_FEDECHO_PAPER_ECHO = {"strategy": "fedecho", "lr": 0.03}
FEDECHO_FMNIST_PAPER = Study(
    name="fedecho-fmnist-paper",
    supernodes=50,
    common=_FEDECHO_PAPER_COMMON,
    methods={
        "fedecho": _FEDECHO_PAPER_ECHO,
        "fedecho-no-kd": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-steps": 0},
        "fedbuff": {"strategy": "fedbuff", "lr": 0.01},
        "fedbuff-lr0.03": {"strategy": "fedbuff", "lr": 0.03},
        "fedecho-no-kd-lr0.01": {"strategy": "fedecho", "lr": 0.01, "fedecho.distill-steps": 0},
        "fedecho-lr0.01": {"strategy": "fedecho", "lr": 0.01},
        # the paper's other baselines at its Table 8 rates (local / server): CA2FL 0.01 / 1.0, FADAS 0.1 / 1e-4
        "ca2fl": {"strategy": "ca2fl", "lr": 0.01, "ca2fl.buffer-size": 5, "ca2fl.server-lr": 1.0},
        "fadas": {"strategy": "fadas", "lr": 0.1, "fadas.buffer-size": 5, "fadas.server-lr": 1e-4,
                  "fadas.beta1": 0.9},
    },
    scenarios={"large-dir0.1": {}},
    seeds=(1, 2, 3),
    targets=(0.7, 0.75),
    extra={
        "fedecho-q60__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-steps": 60},
        "fedecho-eta1e-4__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-lr": 1e-4},
        "fedecho-q60-eta1e-4__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-steps": 60,
                                              "fedecho.distill-lr": 1e-4},
        # the same with asyncfl's default update-norm bound (3 x the recent median, clipped): without it Q = 60 at
        # 1e-4 fell to chance on every seed, for good on seed 3, where a client whose local training diverged
        # (logits 1.6e9) was aggregated as is (the model's norm 85 -> 70,190; benchmarks/fedecho_logit_replay.py)
        "fedecho-q60-eta1e-4-bound3__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-steps": 60,
                                                     "fedecho.distill-lr": 1e-4, "update-norm-bound": 3.0},
        # U from another dataset (the paper's Tables 2-3) at the distillation step that moves the model (1e-4): at
        # the paper's 3e-6 the distillation's effect is inside the floor of paired runs, so no U could show a difference
        "fedecho-eta1e-4-u-mnist__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-lr": 1e-4,
                                                  "fedecho.distill-set": "mnist5k"},
        # eta_d following half the buffered step (fedecho.distill-move), from the paper's 3e-6
        "fedecho-move0.5__large-dir0.1": {**_FEDECHO_PAPER_ECHO, "fedecho.distill-move": 0.5},
    },
    extra_seeds=(1, 2, 3),
)

# FedEcho at its paper's own settings (issue 57): the staleness, data split and local recipe of FEDECHO_FMNIST_PAPER,
# with the three departures of its FedEcho rows removed: U = 2,000 images of another dataset (MNIST, the paper's
# choice of a different set; no held-out rows, so every client keeps its whole split), the printed eta_d = 3e-6, and
# every method's local and global rates tuned by a grid on a seed the comparison does not use ("both global and
# local learning rates are tuned for each method via grid search"; the grid is not printed). Each grid holds the
# paper's Table 8 point: local 0.01 / 0.03 / 0.1 x global 0.5 / 1 for FedBuff, CA2FL and FedEcho; FADAS (AMSGrad
# server step, momentum 0.9) local 0.03 / 0.1 / 0.3 x global 1e-4 / 1e-3 / 1e-2. The update-norm bound is off: the
# paper's methods aggregate every update as it comes.
_FEDECHO_SETTINGS_COMMON = {**_FEDECHO_PAPER_COMMON, "server-holdout": 0.0, "fedecho.distill-set": "mnist5k",
                            "fedecho.distill-lr": 3e-6, "update-norm-bound": 0.0, "ca2fl.buffer-size": 5,
                            "fadas.buffer-size": 5, "fadas.beta1": 0.9}
# (FedEcho's points run before FADAS's: the comparison's main method first when the grid spans sessions)
_FEDECHO_SETTINGS_GRID = {"fedbuff": ((0.01, 0.03, 0.1), (0.5, 1.0)), "ca2fl": ((0.01, 0.03, 0.1), (0.5, 1.0)),
                          "fedecho": ((0.01, 0.03, 0.1), (0.5, 1.0)), "fadas": ((0.03, 0.1, 0.3), (1e-4, 1e-3, 1e-2))}
# A best point on an edge of its grid grows the grid past that edge (2026-11-28: FedBuff's local 0.1 / global 0.5,
# the highest local and the lowest global rate of its grid; then 0.3 / 0.25, again on the lowest global step, so
# global 0.125 too). Local rates past 0.3 are not grown: 0.3 sent non-finite updates at global 0.25 and diverged at 0.5.
# CA2FL's best, local 0.1 / global 0.5, sits on the same two edges: its grid grows as FedBuff's did; then 0.1 / 0.25,
# again on the lowest global step (local 0.3 diverged at 0.5 and fell to chance at 0.25), so global 0.125 at 0.1 too.
# FedEcho's best of its first five points, local 0.1 / global 0.5 (86.1, with 0.1 / 1 still running), sits on the same
# two edges: its grid grows as the others' did (written down before those runs); then 0.1 / 0.25 (86.6), again on the
# lowest global step, so global 0.125 at 0.1 too (at 0.3 only if 0.3 / 0.25 becomes the best: it is still running).
_FEDECHO_SETTINGS_GROWN = {"fedbuff": [(0.3, 0.5), (0.1, 0.25), (0.3, 0.25), (0.1, 0.125), (0.3, 0.125)],
                           "ca2fl": [(0.3, 0.5), (0.1, 0.25), (0.3, 0.25), (0.1, 0.125)],
                           "fedecho": [(0.3, 0.5), (0.1, 0.25), (0.3, 0.25), (0.1, 0.125)]}
FEDECHO_FMNIST_SETTINGS_TUNE = Study(
    name="fedecho-fmnist-settings-tune",
    supernodes=50,
    common=_FEDECHO_SETTINGS_COMMON,
    methods={f"{method}-l{local:g}-g{server:g}": {"strategy": method, "lr": local, f"{method}.server-lr": server}
             for method, (locals_, servers) in _FEDECHO_SETTINGS_GRID.items()
             for local, server in [(l, g) for l in locals_ for g in servers] + _FEDECHO_SETTINGS_GROWN.get(method, [])},
    scenarios={"large-dir0.1": {}},
    seeds=(4,),
    targets=(0.7, 0.75),
    grid_families=tuple(_FEDECHO_SETTINGS_GRID),
    # every update non-finite from ~1,300 updates on (README): the model at chance, the run stopped (ClientAppsFailing)
    # (fedbuff-l0.3-g0.5 stopped itself, ClientAppsFailing after 1,347 non-finite updates; ca2fl-l0.3-g0.5 was
    # stopped by hand at 302 accepted and 2,700 non-finite updates, its loss not finite by 183 updates: stored runs)
    # (fedecho-l0.3-g0.25: loss 7.6e19 by the first evaluation, 189 updates; it stopped itself, ClientAppsFailing
    # after 1,118 non-finite updates)
    diverged=("fedbuff-l0.3-g0.5", "ca2fl-l0.3-g0.5", "fedecho-l0.3-g0.25"),
)

# The comparison (issue 57): every method at its best point of the grid above, seeds 1-3 (the grid used seed 4),
# FedEcho beside its ablation at equal client work (its tuned rates, no distillation) and our labelled variant (the
# distillation step following half the buffered step, distill-move 0.5); FedEcho's Table 7 in the extra rows: the
# entropy weighting (alpha between its bounds, the default) against a fixed alpha of 0 (CE only), 0.5 and 1 (KL only).
_SETTINGS_TUNED = {family: tuned("fedecho-fmnist-settings-tune", family) for family in _FEDECHO_SETTINGS_GRID}
FEDECHO_FMNIST_SETTINGS = Study(
    name="fedecho-fmnist-settings",
    supernodes=50,
    common=_FEDECHO_SETTINGS_COMMON,
    methods={**_SETTINGS_TUNED, "fedecho-no-kd": {**_SETTINGS_TUNED["fedecho"], "fedecho.distill-steps": 0},
             "fedecho-move0.5": {**_SETTINGS_TUNED["fedecho"], "fedecho.distill-move": 0.5}},
    scenarios={"large-dir0.1": {}},
    seeds=(1, 2, 3),
    targets=(0.7, 0.75),
    extra={**{f"fedecho-alpha{alpha:g}__large-dir0.1": {**_SETTINGS_TUNED["fedecho"], "fedecho.alpha-min": alpha,
                                                        "fedecho.alpha-max": alpha} for alpha in (0.0, 0.5, 1.0)},
           # FedBuff's grid best (local 0.3 / global 0.25, 86.8 on seed 4) took 11 non-finite client updates there,
           # and local 0.3 diverged at global 0.5 and fell to chance at 0.125; its best point at a local rate whose
           # clients never sent one (0.1 / 0.25, 86.4) runs beside it on the same seeds, so that FedEcho's margin
           # does not rest on a baseline tuned to the edge of divergence (written down 2026-11-28, before any
           # comparison run)
           "fedbuff-l0.1-g0.25__large-dir0.1": FEDECHO_FMNIST_SETTINGS_TUNE.methods["fedbuff-l0.1-g0.25"]},
    extra_seeds=(1, 2, 3),
)

# The same study on a lent CUDA machine (issue 43; benchmarks/on_device.sh): the clients
# train on the GPU (the ClientApp picks CUDA where there is one), so these runs pair with each other, not with the CPU
# runs above (same seed, other arithmetic). Seeds 11-12; no checkpoints (the machine is lent for minutes); no MNIST arm
# (its data is not carried there).
FEDECHO_FMNIST_PAPER_CUDA = dataclasses.replace(
    FEDECHO_FMNIST_PAPER, name="fedecho-fmnist-paper-cuda", common={**_FEDECHO_PAPER_COMMON, "checkpoint-every": 0},
    seeds=(11, 12), extra={k: v for k, v in FEDECHO_FMNIST_PAPER.extra.items() if "u-mnist" not in k},
    extra_seeds=(11,))

# FedRevive where the global model lags its clients (issue 43): the reference's regime of staleness, 100 jobs in
# flight (200 clients; the reference: 1,000 clients, 100 in flight, tau_max 150, typical beta 0.74), otherwise
# FEDREVIVE_FMNIST's setting, 600 updates. Arms: FedRevive and its ablation AFL-DW (same beta, same step); the
# reference server's undamped warm-up before synthesis starts (fedrevive.warmup = "raw"); KD from update 10
# (synthesis from 0), where the one-seed probe of FEDREVIVE_FMNIST saw KD help while the global model lagged.
_FEDREVIVE_LAG = {"concurrency": 100, "max-arrivals": 600, "fedrevive.max-staleness": 150.0,
                  "afl-dw.max-staleness": 150.0}
FEDREVIVE_FMNIST_LAG = Study(
    name="fedrevive-fmnist-lag",
    supernodes=200,
    common={**FEDREVIVE_FMNIST.common, **_FEDREVIVE_LAG},
    methods={
        "fedrevive": {"strategy": "fedrevive"},
        "afl-dw": {"strategy": "afl-dw"},
        "fedrevive-raw-warmup": {"strategy": "fedrevive", "fedrevive.warmup": "raw"},
        "fedrevive-kd-from-10": {"strategy": "fedrevive", "fedrevive.synthesis-start": 0, "fedrevive.kd-start": 10},
        # the paper's FedBuff for FEMNIST (its Table 4: buffer 1, server lr 0.025), for Table 1's time to target
        "fedbuff": {"strategy": "fedbuff", "fedbuff.buffer-size": 1, "fedbuff.server-lr": 0.025},
    },
    scenarios={"k100": {}},
    seeds=(1, 2, 3),
    targets=(0.8, 0.85),
    relative_target=("fedbuff", 0.85),
)

# The same study on a lent CUDA machine (issue 43; benchmarks/on_device.sh): the clients train on the GPU and
# FedRevive's server work (probes, synthesis, distillation: ~4 s per arrival on one of this project's CPU cores) runs
# there too (fedrevive.server-device). Seeds 1-3 as above, but GPU arithmetic: these runs pair with each other. A second
# lease ran seeds 4-6 of FedRevive and AFL-DW only (ONLY="fedrevive__,afl-dw__").
FEDREVIVE_FMNIST_LAG_CUDA = dataclasses.replace(
    FEDREVIVE_FMNIST_LAG, name="fedrevive-fmnist-lag-cuda", seeds=(1, 2, 3, 4, 5, 6),
    common={**FEDREVIVE_FMNIST_LAG.common, "fedrevive.server-device": "cuda", "checkpoint-every": 0},
    # FedBuff (no server work to move to a GPU) ran on the CPU study above
    methods={k: v for k, v in FEDREVIVE_FMNIST_LAG.methods.items() if k != "fedbuff"}, relative_target=None)

# PushCen on Fashion-MNIST (issue 29): first a setting where collaboration matters (the paper: Independent 43.9 vs
# 57.7 for the gossip methods on CIFAR-10 with 500 examples per peer). 50 peers, Dirichlet 0.5, each peer keeps at
# most 100 or 300 examples (max-samples-per-client; a fifth of them its local test split), LeNet-5, 10 local Adam
# steps at 1e-3 (the reference code's optimizer), 40 virtual units (~26 compute events per peer; the reference
# ~46), the regulariser per layer as the reference code takes it.
PUSHCEN_FMNIST = Study(
    name="pushcen-fmnist",
    supernodes=50,
    common={"dataset": "fashion-mnist", "model": "lenet5", "optimizer": "adam", "lr": 0.001, "local-steps": 10,
            "batch-size": 32, "dirichlet-alpha": 0.5, "max-time": 40.0, "max-arrivals": 0,
            "progress": False},
    methods={
        "independent": {"strategy": "independent"},
        "async-dfedavg": {"strategy": "async-dfedavg"},
        "divshare": {"strategy": "divshare"},
        "pushcen": {"strategy": "pushcen"},
    },
    scenarios={"cap100": {"max-samples-per-client": 100}, "cap300": {"max-samples-per-client": 300},
               # Dirichlet 0.5 leaves each peer few classes, which it learns alone (cap100: 78.8 % vs 79-82 %
               # for the gossip methods); flatter label mixes with fewer examples make learning alone harder
               "dir1-cap50": {"dirichlet-alpha": 1.0, "max-samples-per-client": 50},
               "dir5-cap50": {"dirichlet-alpha": 5.0, "max-samples-per-client": 50}},
    seeds=(1,),
    targets=(),
)

# The comparison where collaboration matters (probe above: Dirichlet 1, 50 examples per peer, Async-DFedAvg 76.0 vs
# Independent 68.8 at 40 units), over twice the horizon (80 units, ~50 compute events per peer; the reference ~46),
# 3 seeds, with PushCen's own ablation (no centroid regulariser, lambda 0) and the regulariser as Eq. 2 writes it.
PUSHCEN_FMNIST_COMPARE = Study(
    name="pushcen-fmnist-compare",
    supernodes=50,
    common={**PUSHCEN_FMNIST.common, "dirichlet-alpha": 1.0, "max-samples-per-client": 50, "max-time": 80.0},
    methods={**PUSHCEN_FMNIST.methods, "pushcen-noreg": {"strategy": "pushcen", "pushcen.lambda": 0.0},
             # DivShare at the PushCen paper's bytes (issue 43): each fragment to 2 neighbours, a push = 2 models
             "divshare-j2": {"strategy": "divshare", "divshare.copies": 2}},
    scenarios={"dir1-cap50": {}},
    seeds=(1, 2, 3),
    targets=(),
    extra={"pushcen-sum__dir1-cap50": {"strategy": "pushcen", "pushcen.penalty": "sum"}},
    extra_seeds=(1,),
)

# PushCen at its paper's regime (issue 57): 100 peers (the paper's CIFAR-10 count) on Fashion-MNIST, where
# collaboration matters (pushcen-fmnist-compare's Dirichlet 1 and 50 training examples per peer), each peer tested on
# 100 examples of its own partition held out before the training cap (gossip.local-test-size: one image is 1 point,
# not 10); every method of the paper's Table 1 (DivShare at its Table 2 bytes, J = 2), Table 4's ablations (no
# regulariser, no buffer = no sender deduplication) and Table 5's delayed peers (10 %, the "delayed best" column).
PUSHCEN_FMNIST_PAPER = Study(
    name="pushcen-fmnist-paper",
    supernodes=100,
    common={**PUSHCEN_FMNIST_COMPARE.common, "gossip.local-test-size": 100},
    methods={"independent": {"strategy": "independent"}, "async-dfedavg": {"strategy": "async-dfedavg"},
             "swift": {"strategy": "swift"}, "divshare-j2": {"strategy": "divshare", "divshare.copies": 2},
             "pushcen": {"strategy": "pushcen"}, "pushcen-noreg": {"strategy": "pushcen", "pushcen.lambda": 0.0},
             "pushcen-no-buffer": {"strategy": "pushcen", "gossip.dedup": False}},
    scenarios={"dir1-cap50": {}},
    seeds=(1, 2, 3),
    targets=(),
)

STUDIES = {"fedecho": FEDECHO, "fedadt": FEDADT, "fedadt-fmnist": FEDADT_FMNIST, "gi": GI, "gi-fmnist": GI_FMNIST,
           "pushcen": PUSHCEN, "pushcen100": PUSHCEN100, "fedrevive": FEDREVIVE, "fedrevive-fmnist": FEDREVIVE_FMNIST,
           "fedecho-fmnist-tune": FEDECHO_FMNIST_TUNE, "fedecho-fmnist": FEDECHO_FMNIST,
           "pushcen-fmnist": PUSHCEN_FMNIST, "pushcen-fmnist-compare": PUSHCEN_FMNIST_COMPARE,
           "pushcen-fmnist-paper": PUSHCEN_FMNIST_PAPER,
           # issue 43: each method at its paper's staleness
           "fedadt-fmnist-paper": FEDADT_FMNIST_PAPER, "fedecho-fmnist-paper": FEDECHO_FMNIST_PAPER,
           "fedecho-fmnist-paper-cuda": FEDECHO_FMNIST_PAPER_CUDA,
           # issue 57: FedEcho at its paper's own settings
           "fedecho-fmnist-settings-tune": FEDECHO_FMNIST_SETTINGS_TUNE, "fedecho-fmnist-settings": FEDECHO_FMNIST_SETTINGS,
           "fedrevive-fmnist-lag": FEDREVIVE_FMNIST_LAG, "fedrevive-fmnist-lag-cuda": FEDREVIVE_FMNIST_LAG_CUDA}


def gossip_table(study: Study) -> str:
    """Markdown for decentralized studies: peers' accuracy, delayed peers, bytes per push (from summary.json)."""
    runs_dir = ROOT / "benchmarks" / study.name / "runs"
    lines = ["Per cell: online peers' local-test accuracy % at the last evaluation (the mean over peers; mean ± sd "
             "over seeds, seeds run); the SD over peers (mean over seeds); delayed peers' best accuracy % (mean); "
             "bytes per push to the out-neighbours (MiB) and relative to PushCen in the same scenario; relay ms per "
             "push; peak MB of messages buffered at the relay and the relay process's peak RSS (MB); wall seconds "
             "per run.", "",
             "| method | scenario | accuracy (seeds) | SD over peers | delayed best | MiB/push | vs PushCen | relay ms/push "
             "| buffered MB | relay RSS MB | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    names = [(m, s) for s in study.scenarios for m in study.methods] + [tuple(n.split("__")) for n in study.extra]
    runs: dict[tuple[str, str], list[dict]] = {}
    for method, scenario in names:
        runs[(method, scenario)] = [json.loads((folder / "summary.json").read_text())
                                    for folder in finished_runs(runs_dir, f"{method}__{scenario}")]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    for method, scenario in names:
        done = [r for r in runs[(method, scenario)] if r["final-mean-accuracy"] is not None]
        if not done:
            lines.append(f"| {method} | {scenario} | not run | | | | | | | | |")
            continue
        accuracies = [100 * r["final-mean-accuracy"] for r in done]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        peer_sd = mean([100 * r["final-sd-accuracy"] for r in done])
        delayed = [100 * r["delayed-best-accuracy-mean"] for r in done if r["delayed-best-accuracy-mean"] is not None]
        push_bytes = mean([r["push-bytes-mean"] for r in done])
        reference = mean([r["push-bytes-mean"] for r in runs.get(("pushcen", scenario), [])])
        relative = f"{push_bytes / reference:.2f}" if reference == reference and reference and push_bytes else "-"
        relay = [r["relay-ms-per-push"] for r in done if r["pushes"] and r.get("relay-ms-per-push")]
        lines.append(f"| {method} | {scenario} | {mean(accuracies):.1f} ± {spread:.1f} ({len(done)}) | {peer_sd:.1f} | "
                     f"{f'{mean(delayed):.1f}' if delayed else '-'} | {push_bytes / 2**20:.3f} | {relative} | "
                     f"{f'{mean(relay):.2f}' if relay else '-'} | {mean([r['peak-buffered-mb'] for r in done]):.1f} | "
                     f"{mean([r.get('server-peak-rss-mb', float('nan')) for r in done]):.0f} | "
                     f"{mean([r['wall-seconds'] for r in done]):.0f} |")
    return "\n".join(lines) + "\n"


#: Every study measures the papers' methods as published: without asyncfl's update-norm bound (a default since
#: issue 42; every run stored before it ran without it).
STUDY_DEFAULTS = {"update-norm-bound": 0.0}


def cells(study: Study) -> list[tuple[str, dict, int]]:
    """``(cell name, run-config overrides, seed)``, seed-major, ablations last within each seed."""
    out = []
    common = {**STUDY_DEFAULTS, **study.common}
    for seed in study.seeds:
        for scenario, scenario_cfg in study.scenarios.items():
            for method, method_cfg in study.methods.items():
                out.append((f"{method}__{scenario}", {**common, **scenario_cfg, **method_cfg}, seed))
        if seed in study.extra_seeds:
            for name, overrides in study.extra.items():
                out.append((name, {**common, **overrides}, seed))
    return out


def finished(folder: Path) -> bool:
    """A run folder whose run completed: summary.json is rewritten after every evaluation, so it is not enough;
    the run's log sits next to the folder until the run exits cleanly (kept for a failed or interrupted run)."""
    return (folder / "summary.json").exists() and not folder.with_name(folder.name + ".log").exists()


def finished_runs(runs_dir: Path, cell: str) -> list[Path]:
    """The completed run folders of one cell (one per seed), in seed order."""
    return sorted(p for p in runs_dir.glob(f"{cell}__s*") if p.is_dir() and finished(p))


def run_in_process(config: dict, supernodes: int) -> None:
    """The built-in app's ServerApp ``main`` on an in-process Grid of ``supernodes`` nodes running asyncfl's
    ClientApp, with the app's run-config defaults and ``config`` (see the module docstring)."""
    from flwr.app import Context, RecordDict

    from asyncfl.client_app.app import app as client_app
    from asyncfl.server_app.app import main as server_main
    from asyncfl.simulation.inprocess import InProcessGrid

    from asyncfl.options import current_keys
    from asyncfl.run_config_args import app_defaults

    run_config = app_defaults(ROOT)
    run_config.update(current_keys(config, where="stored run-config"))  # a run stored before a key was renamed
    grid = InProcessGrid(client_app, supernodes, run_config)
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))


def run_cell(study: Study, name: str, overrides: dict, seed: int, runs_dir: Path, in_process: bool = False) -> None:
    """One real ``asyncfl run`` (or, ``in_process``, the same apps in one process); skipped when it finished,
    extended from its last checkpoint when the horizon grew, resumed from its newest one when interrupted."""
    run_name = f"{name}__s{seed}"
    config = {**overrides, "seed": seed, "output-dir": str(runs_dir), "run-name": run_name}
    # a study's common settings name several methods' knobs; each run takes only its own strategy's (the app
    # refuses another strategy's setting, which it would ignore)
    for key in foreign_settings(config, str(config.get("strategy", "fedbuff"))):
        del config[key]
    if finished(runs_dir / run_name):
        if not overrides.get("max-arrivals"):  # a horizon in time (every gossip study): nothing to extend
            return
        done = json.loads((runs_dir / run_name / "summary.json").read_text())["arrivals"]
        if done >= overrides["max-arrivals"]:
            return
        # a longer horizon than the run had: go on from the checkpoint it wrote when it stopped (the same run as
        # one made with the longer horizon from the start, on the virtual clock)
        config["resume-from"] = str(runs_dir / run_name)
    elif checkpoint.listed(runs_dir / run_name / checkpoint.FOLDER):
        # an interrupted run (killed, or stopped by an error since fixed) goes on from its newest checkpoint:
        # on the virtual clock the same bytes as one uninterrupted run
        config["resume-from"] = str(runs_dir / run_name)
    text = " ".join(f"{key if '.' not in key else json.dumps(key)}={toml_value(v)}" for key, v in config.items())
    command = [str(ROOT / ".venv/bin/asyncfl"), "run", "--num-supernodes", str(study.supernodes), "-c", text]
    if in_process:
        command = [sys.executable, str(Path(__file__).resolve()), "--run-one", json.dumps(config),
                   "--supernodes", str(study.supernodes)]
    started = time.monotonic()
    log = runs_dir / f"{run_name}.log"
    with open(log, "w") as handle:
        code = subprocess.call(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    complete = (runs_dir / run_name / "summary.json").exists()
    print(f"{run_name}: exit {code} in {time.monotonic() - started:.0f}s"
          + ("" if complete else f", no summary.json (log kept: {log})"), flush=True)
    if code == 0 and complete:
        log.unlink()


def _metrics(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv", newline="") as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _mean_sd(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def cell_results(runs_dir: Path, name: str, targets: tuple[float, ...], affected_class: int | None = None,
                 window: int = 3) -> dict:
    """Per-seed figures of one cell from its finished runs.

    With ``affected_class`` the time-to-target figures are for that class's accuracy.
    """
    finals, bests, walls, server_ms, class_finals, class_bests = [], [], [], [], [], []
    times: dict[float, list[float]] = {t: [] for t in targets}
    folders = finished_runs(runs_dir, name)
    for folder in folders:
        rows = _metrics(folder)
        summary = json.loads((folder / "summary.json").read_text())
        finals.append(statistics.fmean(r["accuracy"] for r in rows[-window:]))
        bests.append(max(r["accuracy"] for r in rows))
        key = "accuracy" if affected_class is None else f"acc_class_{affected_class}"
        if affected_class is not None:
            class_finals.append(statistics.fmean(r[key] for r in rows[-window:]))
            class_bests.append(max(r[key] for r in rows))
        for target in targets:
            hit = next((r["time"] for r in rows if r[key] >= target), None)
            if hit is not None:
                times[target].append(hit)
        walls.append(summary.get("wall-seconds", float("nan")))
        server_ms.append(summary.get("server-ms-per-arrival", float("nan")))
    return {"seeds": len(folders), "finals": finals, "bests": bests, "times": times, "walls": walls,
            "server_ms": server_ms, "class_finals": class_finals, "class_bests": class_bests}


def _times(result: dict) -> str:
    parts = []
    for target, hits in result["times"].items():
        mean = f"{statistics.fmean(hits):.0f}" if hits else "-"
        parts.append(f"{mean} ({len(hits)}/{result['seeds']})")
    return " · ".join(parts)


def relative_target_table(study: Study, runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """The FedRevive paper's Table 1 metric: virtual time to ``f`` x the reference method's best accuracy.

    The reference best is the mean over its seeds, per scenario; each run's time is its
    first evaluation at or above that level; ``vs ref`` = 1 - time / reference time
    (positive = faster than the reference).
    """
    reference, fraction = study.relative_target
    lines = ["", f"Virtual time to {fraction:.0%} of {reference}'s best accuracy (mean over the seeds that reached "
             "it; reached/ran) and how much sooner than " + reference + ":", "",
             "| method | " + " | ".join(study.scenarios) + " |", "|" + "---|" * (len(study.scenarios) + 1)]
    levels, reference_times = {}, {}
    for scenario in study.scenarios:
        bests = cell_results(runs_dir, f"{reference}__{scenario}", ())["bests"]
        if bests:
            levels[scenario] = fraction * statistics.fmean(bests)
            hits = cell_results(runs_dir, f"{reference}__{scenario}", (levels[scenario],))["times"][levels[scenario]]
            reference_times[scenario] = statistics.fmean(hits) if hits else None
    for label, cell_names in names:
        row = [label]
        for scenario, cell in zip(study.scenarios, cell_names):
            if cell is None or scenario not in levels:
                row.append("")
                continue
            r = cell_results(runs_dir, cell, (levels[scenario],))
            hits = r["times"][levels[scenario]]
            if not r["seeds"]:
                row.append("not run")
            elif not hits:
                row.append(f"not reached (0/{r['seeds']})")
            else:
                mean = statistics.fmean(hits)
                ref = reference_times.get(scenario)
                versus = f", {1 - mean / ref:+.0%}" if ref else ""
                row.append(f"{mean:.1f} ({len(hits)}/{r['seeds']}{versus})")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Levels: " + ", ".join(f"{s} {100 * v:.1f}%" for s, v in levels.items()))
    return lines


def smoothed_class_accuracy(folder: Path, affected_class: int, window: int) -> list[tuple[float, float]]:
    """``(time, mean class accuracy over the last window evaluations)`` once a full window is in."""
    rows = _metrics(folder)
    values = [r[f"acc_class_{affected_class}"] for r in rows]
    return [(rows[i]["time"], statistics.fmean(values[i + 1 - window:i + 1])) for i in range(window - 1, len(rows))]


def _seed_of(folder: Path) -> str:
    """``'s2'`` for a run folder named ``method__scenario__s2``."""
    return folder.name.rsplit("__", 1)[1]


def paper_time_column(folders: dict[str, list[Path]], affected_class: int, window: int,
                      reference: str) -> dict[str, str]:
    """One column of :func:`paper_time_table`: ``label -> "accuracy / relative time"`` (means over seeds).

    Per seed, the level is 90 % of the lowest final among that seed's runs in the column,
    and a method's time is its round at the level over the reference's round in the same seed.
    """
    finals: dict[str, list[float]] = {label: [] for label in folders}
    ratios: dict[str, list[float]] = {label: [] for label in folders}
    seeds = sorted({_seed_of(f) for runs in folders.values() for f in runs})
    for seed in seeds:
        curves = {label: smoothed_class_accuracy(f, affected_class, window)
                  for label, runs in folders.items() for f in runs if _seed_of(f) == seed}
        for label, curve in curves.items():
            finals[label].append(curve[-1][1])
        level = 0.9 * min(curve[-1][1] for curve in curves.values())
        if reference not in curves or level <= 0:  # no reference run, or a method ends at 0: no common level
            continue
        reached = {label: next(t for t, v in curve if v >= level) for label, curve in curves.items()}
        for label in curves:
            ratios[label].append(reached[label] / reached[reference])
    return {label: f"{100 * statistics.fmean(finals[label]):.1f} / "
                   + (f"{100 * statistics.fmean(ratios[label]):.0f}" if ratios[label] else "–")
            for label in folders}


def paper_time_table(study: Study, runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """The GI paper's Tables 10-11 format: affected-class accuracy and relative time (reference = 100).

    The paper's time is "the relative training time required to reach convergence"
    without a stated criterion; ours: the first round at which the affected class's
    accuracy, averaged over the last ``final_window`` rounds, reaches 90 % of the
    lowest final accuracy in that column and seed (so every method gets there), divided by
    the reference method's round in that seed.  Both numbers are means over the seeds that ran.
    """
    k, w, reference = study.affected_class, study.final_window, study.paper_time_reference
    lines = ["", f"Tables 10-11 format: class-{k} accuracy % (last {w}) / time relative to {reference} (= 100): "
             f"rounds until the {w}-round mean of class-{k} accuracy reaches 90 % of the column's lowest final "
             "(per seed); means over the seeds that ran.", "",
             "| method | " + " | ".join(study.scenarios) + " |", "|" + "---|" * (len(study.scenarios) + 1)]
    cells: dict[tuple[str, int], str] = {}
    for i, _ in enumerate(study.scenarios):
        folders = {label: finished_runs(runs_dir, cell_names[i]) for label, cell_names in names if cell_names[i]}
        column = paper_time_column({label: runs for label, runs in folders.items() if runs}, k, w, reference)
        cells.update({(label, i): text for label, text in column.items()})
    for label, _ in names:
        row = [cells.get((label, i), "") for i in range(len(study.scenarios))]
        if any(row):
            lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def table_rows(study: Study) -> list[tuple[str, list[str | None]]]:
    """``(row label, cell name per scenario or None)``: the methods, then one row per ablation method."""
    names = [(m, [f"{m}__{s}" for s in study.scenarios]) for m in study.methods]
    extra_rows: dict[str, list[str | None]] = {}  # one row per ablation method, its cells in their scenario columns
    for n in study.extra:
        method = n.split("__")[0]
        row_cells = extra_rows.setdefault(method, [None] * len(study.scenarios))
        for i, scenario in enumerate(study.scenarios):
            if n.endswith("__" + scenario):
                row_cells[i] = n
    return names + list(extra_rows.items())


def table(study: Study) -> str:
    """Markdown: one row per method (and ablation), final and best accuracy per scenario, times to targets."""
    runs_dir = ROOT / "benchmarks" / study.name / "runs"
    targets = " and ".join(f"{t:.0%}" for t in study.targets)
    lines = [f"Per cell: final accuracy % (mean of the last 3 evaluations) / best % / virtual time to {targets} "
             "(mean over the seeds that reached it; reached/ran). Accuracies mean ± sd over seeds.", ""]
    if study.affected_class is not None:
        k = study.affected_class
        w = study.final_window
        lines = [f"Per cell: class-{k} accuracy % (mean of the last {w} evaluations) / best class-{k} % / overall "
                 f"accuracy % (last {w}) / rounds until class {k} reached {targets} (reached/ran). Mean ± sd over "
                 "seeds.", ""]
    header = "| method | " + " | ".join(study.scenarios) + " |"
    lines += [header, "|" + "---|" * (len(study.scenarios) + 1)]
    names = table_rows(study)
    for label, cell_names in names:
        row = [f"{label} (diverged: never a best point)" if label in study.diverged else label]
        for cell in cell_names:
            if cell is None:
                row.append("")
                continue
            r = cell_results(runs_dir, cell, study.targets, study.affected_class, study.final_window)
            unfinished = len(list(runs_dir.glob(f"{cell}__s*.log")))  # a failed (or running) run keeps its log
            if not r["seeds"]:
                row.append(f"no result ({unfinished} failed or running; log kept)" if unfinished else "not run")
                continue
            if study.affected_class is not None:
                row.append(f"{_mean_sd(r['class_finals'])} / {_mean_sd(r['class_bests'])} / "
                           f"{_mean_sd(r['finals'])} / {_times(r)}")
            else:
                row.append(f"{_mean_sd(r['finals'])} / {_mean_sd(r['bests'])} / {_times(r)}")
        lines.append("| " + " | ".join(row) + " |")
    if study.relative_target is not None:
        lines += relative_target_table(study, runs_dir, names)
    if study.paper_time_reference is not None:
        lines += paper_time_table(study, runs_dir, names)
    if study.stale_window_start is not None:
        lines += stale_window_lines(study, runs_dir, names)
    lines += paired_lines(study, runs_dir, names)
    lines += mechanism_lines(runs_dir, names)
    lines += gi_lines(runs_dir, names)
    lines += grid_best_lines(study, runs_dir)
    lines += ["", "Server ms per arrival and wall seconds per run (mean over all its runs):", ""]
    for label, cell_names in names:
        results = [cell_results(runs_dir, c, study.targets) for c in cell_names if c]
        ms = [v for r in results for v in r["server_ms"]]
        walls = [v for r in results for v in r["walls"]]
        if ms:
            lines.append(f"- {label}: {statistics.fmean(ms):.1f} ms/arrival, {statistics.fmean(walls):.0f} s/run")
    return "\n".join(lines) + "\n"


def stale_window_lines(study: Study, runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """The affected class while it is stale: per row and scenario, its accuracy averaged over every evaluation
    after ``stale_window_start`` (mean ± sd over seeds, and each seed's value), not only over the last rounds."""
    k, start = study.affected_class, study.stale_window_start
    lines = ["", f"Class-{k} accuracy % averaged over every evaluation after t = {start:g} (the stale window), "
             "mean ± sd over seeds [per seed]:", "",
             "| method | " + " | ".join(study.scenarios) + " |", "|" + "---|" * (len(study.scenarios) + 1)]
    for label, cell_names in names:
        row = []
        for cell in cell_names:
            means = []
            for folder in finished_runs(runs_dir, cell) if cell else []:
                values = [r[f"acc_class_{k}"] for r in _metrics(folder) if r["time"] > start]
                if values:
                    means.append(statistics.fmean(values))
            row.append(f"{_mean_sd(means)} [{', '.join(f'{100 * m:.1f}' for m in means)}]" if means else "")
        if any(row):
            lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def _interval(diffs: list[float]) -> str:
    """``mean ± half-width`` of a 95 % t interval over paired differences (points); the mean alone for one."""
    if len(diffs) < 2:
        return f"{statistics.fmean(diffs):+.1f}"
    from scipy.stats import t  # noqa: PLC0415 (only the tables need it)

    half = t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return f"{statistics.fmean(diffs):+.1f} ± {half:.1f}"


def paired_lines(study: Study, runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """The affected class, paired by seed (same data, same late clients): each row minus each of
    ``paired_against`` over the seeds both ran, on the last ``final_window`` evaluations and over the stale
    window, as mean ± a 95 % t interval with the per-seed differences."""
    if study.affected_class is None or not study.paired_against:
        return []
    k, start, w = study.affected_class, study.stale_window_start, study.final_window

    def figures(cell: str) -> dict[int, tuple[float, float | None]]:
        out = {}
        for folder in finished_runs(runs_dir, cell):
            rows = _metrics(folder)
            last = statistics.fmean(r[f"acc_class_{k}"] for r in rows[-w:])
            window = [r[f"acc_class_{k}"] for r in rows if start is not None and r["time"] > start]
            out[int(folder.name.rsplit("__s", 1)[1])] = (last, statistics.fmean(window) if window else None)
        return out

    by_label = dict(names)
    lines = ["", f"Class-{k} accuracy, paired by seed: row minus reference, points, mean ± 95 % t interval "
             f"(per seed), on the last {w} evaluations"
             + (f" and over the stale window (t > {start:g})" if start is not None else "") + ":", "",
             "| method | reference | scenario | seeds | last evaluations | stale window |", "|---|---|---|---|---|---|"]
    pairs = [(label, reference, scenario, cell, by_label[reference][i])
             for reference in study.paired_against if reference in by_label
             for i, scenario in enumerate(study.scenarios)
             for label, cell_names in names if label != reference and cell_names[i] and by_label[reference][i]
             # two references: the pair once (the later one minus the earlier)
             and not (label in study.paired_against
                      and study.paired_against.index(label) < study.paired_against.index(reference))
             for cell in [cell_names[i]]]
    for label, reference, scenario, cell, reference_cell in pairs:
        base, mine = figures(reference_cell), figures(cell)
        seeds = sorted(set(mine) & set(base))
        if not seeds:
            continue
        last = [100 * (mine[s][0] - base[s][0]) for s in seeds]
        cols = [f"{_interval(last)} ({' / '.join(f'{d:+.1f}' for d in last)})"]
        if start is not None:
            window = [100 * (mine[s][1] - base[s][1]) for s in seeds]
            cols.append(f"{_interval(window)} ({' / '.join(f'{d:+.1f}' for d in window)})")
        lines.append(f"| {label} | {reference} | {scenario} | {','.join(map(str, seeds))} | " + " | ".join(cols)
                     + " |")
    return lines


def gi_lines(runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """Gradient-inversion runs' own figures (summary.json), per run: inversions, how many updates went raw and
    why, the fit (final / initial disparity), the switching comparisons and the version it switched back at."""
    lines = []
    for label, cell_names in names:
        for cell in cell_names:
            for folder in finished_runs(runs_dir, cell) if cell else []:
                s = json.loads((folder / "summary.json").read_text())
                if "gi-inversions" not in s:
                    continue
                switched = s.get("gi-switch-version")
                errors = (f"; mean E1 {s['gi-e1-mean']:.4g} vs E2 {s['gi-e2-mean']:.4g}"
                          if s.get("gi-e1-mean") is not None else "")
                lines.append(
                    f"- {folder.name}: {s['gi-inversions']} inversions ({s['gi-warm-starts']} warm, "
                    f"{s['gi-seconds-per-inversion']:.1f} s each), raw: {s['gi-not-unique']} not unique, "
                    f"{s['gi-after-switch']} after the switch; disparity at "
                    f"{s['gi-disparity-ratio-mean']} of its start; {s['gi-error-comparisons']} comparisons{errors}; "
                    + (f"switched back at version {switched}" if switched is not None else "never switched back"))
    return ["", "Gradient-inversion figures per run (summary.json):", "", *lines] if lines else []


def grid_scores(study: Study, runs_dir: Path) -> dict[str, dict[str, float]]:
    """A tuning grid's rows by family: ``{family: {method: mean final accuracy over its cells' runs}}`` (rows listed
    as diverged left out: never a family's best)."""
    out: dict[str, dict[str, float]] = {}
    for family in study.grid_families:
        scores = {}
        for method in study.methods:
            if method.startswith(family + "-") and method not in study.diverged:
                finals = [v for scenario in study.scenarios
                          for v in cell_results(runs_dir, f"{method}__{scenario}", ())["finals"]]
                if finals:
                    scores[method] = statistics.fmean(finals)
        if scores:
            out[family] = scores
    return out


def grid_best_lines(study: Study, runs_dir: Path) -> list[str]:
    """A tuning grid's choice: per family, the row with the highest mean final accuracy over its cells' runs."""
    lines = []
    for family, scores in grid_scores(study, runs_dir).items():
        best = max(scores, key=scores.get)
        runner_up = sorted(scores.values())[-2] if len(scores) > 1 else float("nan")
        lines.append(f"- {family}: {best} ({100 * scores[best]:.1f} %; next best {100 * runner_up:.1f} %; "
                     f"{len(scores)} grid points run)")
    return ["", "Best grid point per method (highest final accuracy):", "", *lines] if lines else []


def _unrun_rows(grid: Study, family: str, scores: dict[str, float]) -> list[str]:
    """``family``'s rows of ``grid`` with no finished run (those listed as diverged count as run)."""
    return [m for m in grid.methods if m.startswith(family + "-") and m not in scores and m not in grid.diverged]


def resolve_tuned(study: Study) -> Study:
    """``study`` with every :func:`tuned` placeholder replaced by its grid's best point, from the grid's stored runs.

    Raises
    ------
    SystemExit
        When the grid has not finished every row of that family yet (run the grid first): a comparison never
        starts from a best point that a row still to run could change. A row the grid lists as diverged counts
        as run.
    """
    scores_of: dict[str, dict[str, dict[str, float]]] = {}  # grid -> family -> row -> mean final accuracy

    def settings(config: dict) -> dict:
        if TUNED_KEY not in config:
            return config
        grid_name, family = config[TUNED_KEY].split("/")
        grid = STUDIES[grid_name]
        if grid_name not in scores_of:
            scores_of[grid_name] = grid_scores(grid, ROOT / "benchmarks" / grid.name / "runs")
        scores = scores_of[grid_name].get(family, {})
        unrun = _unrun_rows(grid, family, scores)
        if unrun or not scores:
            raise SystemExit(f"{study.name} takes {family}'s settings from the grid {grid_name}, which has not finished "
                             f"{len(unrun)} of {family}'s rows ({', '.join(unrun[:3])}{', ...' if len(unrun) > 3 else ''}): "
                             f"run `matrix.py {grid_name}` first")
        rest = {k: v for k, v in config.items() if k != TUNED_KEY}
        return {**grid.methods[max(scores, key=scores.get)], **rest}

    return dataclasses.replace(study, methods={m: settings(c) for m, c in study.methods.items()},
                               extra={n: settings(c) for n, c in study.extra.items()})


#: summary.json figures of a method's own mechanism, listed per row where the runs report them.
MECHANISM_FIGURES = ("beta-mean", "beta-share-above-0.5", "kd-share-geomean", "kd-norm-ratio-geomean",
                     "clamped-bn-variances", "staleness-mean",
                     # FedADT's correction: what the teacher and the stale model score on the server set, and the
                     # teacher term's share of the pull on the student's logits
                     "kd-teacher-accuracy", "kd-student-accuracy", "kd-kl-share",
                     # FedEcho's teacher: the stored-logit ensemble against the model it distils into, on U
                     "teacher-agreement", "teacher-accuracy-on-u", "global-accuracy-on-u", "teacher-better-share",
                     "raw-warmup-updates")


def mechanism_lines(runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[str]:
    """Per row, the mean over its runs of each :data:`MECHANISM_FIGURES` entry the runs report."""
    lines = []
    for label, cell_names in names:
        summaries = [json.loads((folder / "summary.json").read_text())
                     for cell in cell_names if cell for folder in finished_runs(runs_dir, cell)]
        figures = [f"{key} {statistics.fmean(s[key] for s in summaries):.4g}" for key in MECHANISM_FIGURES
                   if summaries and all(s.get(key) is not None for s in summaries)]
        if figures:
            lines.append(f"- {label}: " + ", ".join(figures))
    return ["", "Mechanism figures (summary.json, mean over the row's runs):", "", *lines] if lines else []


def mean_curve(folders: list[Path], column: str = "accuracy", smooth: int = 1) -> tuple[list[float], list[float], list[float]]:
    """``(times, mean, sd)`` of ``column`` over runs evaluated at the same times (the common prefix of their
    rows); ``smooth > 1`` first averages each run over its last ``smooth`` evaluations."""
    curves = [_metrics(folder) for folder in folders]
    length = min(len(rows) for rows in curves)
    times = [curves[0][i]["time"] for i in range(length)]
    values = [[row[column] for row in rows[:length]] for rows in curves]
    if smooth > 1:
        values = [[statistics.fmean(v[max(0, i + 1 - smooth):i + 1]) for i in range(length)] for v in values]
    columns = [[v[i] for v in values] for i in range(length)]
    return (times, [statistics.fmean(c) for c in columns],
            [statistics.stdev(c) if len(c) > 1 else 0.0 for c in columns])


def curve_plots(study: Study, runs_dir: Path, names: list[tuple[str, list[str | None]]]) -> list[Path]:
    """Per scenario, ``curves-<scenario>.png`` next to the table: each row's mean accuracy over its seeds
    against virtual time, with a mean +- sd band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # an affected class (the GI paper's headline) gets its own figure, each run smoothed over final_window rounds
    figures = [("accuracy", 1, "", "test accuracy")]
    if study.affected_class is not None:
        k, w = study.affected_class, study.final_window
        figures.append((f"acc_class_{k}", w, f"-class{k}", f"class-{k} accuracy"))
    written = []
    for i, scenario in enumerate(study.scenarios):
        rows = [(label, finished_runs(runs_dir, cells[i])) for label, cells in names if cells[i]]
        rows = [(label, folders) for label, folders in rows if folders]
        if not rows:
            continue
        for column, smooth, suffix, what in figures:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for label, folders in rows:
                times, mean, sd = mean_curve(folders, column, smooth)
                line, = ax.plot(times, [100 * m for m in mean], label=f"{label} ({len(folders)} seeds)")
                ax.fill_between(times, [100 * (m - d) for m, d in zip(mean, sd)],
                                [100 * (m + d) for m, d in zip(mean, sd)], color=line.get_color(), alpha=0.15)
            title = f"{study.name}: {scenario}" + (f" (each run: {smooth}-evaluation moving mean)" if smooth > 1 else "")
            ax.set(xlabel="virtual time", ylabel=f"{what} % (mean ± sd over seeds)", title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = runs_dir.parent / f"curves-{scenario}{suffix}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
    return written


def run_selected(run_name: str, only: str) -> bool:
    """Whether ``--only`` selects the run ``run_name`` (empty: every run)."""
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    if not patterns:
        return True
    return any(run_name == p[1:] if p.startswith("=") else p in run_name for p in patterns)


def main(argv: list[str] | None = None) -> int:
    if argv is None and "--run-one" in sys.argv:  # one in-process run, in a process of its own
        one = argparse.ArgumentParser()
        one.add_argument("--run-one", required=True)
        one.add_argument("--supernodes", type=int, required=True)
        args = one.parse_args()
        run_in_process(json.loads(args.run_one), args.supernodes)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--table", action="store_true", help="only rebuild the table from finished runs")
    parser.add_argument(
        "--only",
        default="",
        help="run only these runs: comma-separated; '=NAME' matches a run name (method__scenario__sSEED) exactly, other text any run name containing it",
    )
    parser.add_argument("--in-process", action="store_true",
                        help="run each cell's ServerApp and ClientApps in one process (no SuperLink, no Ray)")
    parser.add_argument("--workers", type=int, default=1, help="cells run side by side (default 1)")
    parser.add_argument("--plot", action="store_true",
                        help="also draw curves-<scenario>.png: each row's accuracy vs virtual time, mean +- sd band")
    args = parser.parse_args(argv)
    study = resolve_tuned(STUDIES[args.study])
    runs_dir = ROOT / "benchmarks" / study.name / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    if not args.table:
        from concurrent.futures import ThreadPoolExecutor

        todo = [c for c in cells(study) if run_selected(f"{c[0]}__s{c[2]}", args.only)]
        with ThreadPoolExecutor(max(1, args.workers)) as pool:  # each cell is a process of its own
            list(pool.map(lambda c: run_cell(study, c[0], c[1], c[2], runs_dir, args.in_process), todo))
    text = gossip_table(study) if study.name.startswith("pushcen") else table(study)
    (ROOT / "benchmarks" / study.name / "table.md").write_text(text)
    if args.plot and not study.name.startswith("pushcen"):
        for path in curve_plots(study, runs_dir, table_rows(study)):
            print(f"plot: {path.relative_to(ROOT)}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
