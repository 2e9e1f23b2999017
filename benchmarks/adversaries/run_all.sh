#!/usr/bin/env bash
# The issue-56 drills: one attacker of eight on two apps (the quickstart CNN, SGD-momentum 0.05, 40 rounds; the
# BatchNorm CNN, 15 rounds), seeds 1-3, through benchmarks/dropin/run.py's in-process Grid and virtual clock.
# Each attack has its own folder (run.py keys a cell by setting, strategy and seed). Usage: bash run_all.sh SETTING
set -euo pipefail
cd "$(dirname "$0")/../.."
SETTING=${1:-sgdm-0.05}
ALL="fedbuff fedasync flower-fedavg flower-fedmedian flower-fedtrimmedavg"
ASYNC="fedbuff fedasync"
RUN=".venv/bin/python benchmarks/dropin/run.py --settings $SETTING --workers ${WORKERS:-2}"
OUT=benchmarks/adversaries
$RUN --strategies $ALL --out $OUT/clean
$RUN --strategies $ALL --attack noise --attackers 1 --out $OUT/noise-x1
$RUN --strategies $ALL --attack forged-count --attackers 1 --out $OUT/forged-count
$RUN --strategies $ALL --attack replace --attackers 1 --out $OUT/replace
$RUN --strategies $ASYNC --attack noise --attackers 1 --attacker-speed 3 --out $OUT/noise-x3
$RUN --strategies $ASYNC --attack noise --attackers 1 --attacker-speed 10 --out $OUT/noise-x10
$RUN --strategies $ALL --attack flip-scale --attackers 1 --out $OUT/flip-scale-x1
$RUN --strategies $ASYNC --attack flip-scale --attackers 1 --attacker-speed 3 --out $OUT/flip-scale-x3
$RUN --strategies $ASYNC --attack flip-scale --attackers 1 --attacker-speed 10 --out $OUT/flip-scale-x10
# the same drills with the server's trusted direction (trusted_train_fn: one epoch on the server set), asyncfl's only
T="$RUN --strategies $ASYNC --trusted"
$T --out $OUT/trusted-clean
$T --attack flip-scale --attackers 1 --out $OUT/trusted-flip-scale-x1
$T --attack forged-count --attackers 1 --out $OUT/trusted-forged-count
$T --attack flip-scale --attackers 1 --attacker-speed 3 --out $OUT/trusted-flip-scale-x3
$T --attack flip-scale --attackers 1 --attacker-speed 10 --out $OUT/trusted-flip-scale-x10
$T --attack replace --attackers 1 --out $OUT/trusted-replace
$T --attack noise --attackers 1 --out $OUT/trusted-noise-x1
$T --attack noise --attackers 1 --attacker-speed 3 --out $OUT/trusted-noise-x3
$T --attack noise --attackers 1 --attacker-speed 10 --out $OUT/trusted-noise-x10
# the ablation: an update against the trusted descent loses that component only (its remainder keeps the run's bound)
P="$RUN --strategies $ASYNC --trusted --projection-only"
$P --attack flip-scale --attackers 1 --out $OUT/projection-only-new/flip-scale-x1
$P --attack forged-count --attackers 1 --out $OUT/projection-only-new/forged-count
# a second app where nothing was tuned (the BatchNorm CNN, 15 rounds), with and without the trusted direction
B=".venv/bin/python benchmarks/dropin/run.py --settings bn-sgdm-0.05 --workers ${WORKERS:-2} --strategies $ASYNC"
$B --out $OUT/bn/clean
$B --trusted --out $OUT/bn/trusted-clean
$B --attack flip-scale --attackers 1 --out $OUT/bn/flip-scale-x1
$B --trusted --attack flip-scale --attackers 1 --out $OUT/bn/trusted-flip-scale-x1
$B --attack forged-count --attackers 1 --out $OUT/bn/forged-count
$B --trusted --attack forged-count --attackers 1 --out $OUT/bn/trusted-forged-count
