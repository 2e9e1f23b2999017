#!/usr/bin/env bash
# A matrix study on a lent CUDA machine, from the repository root: bash benchmarks/on_device.sh STUDY [SECONDS] [WORKERS]
# [PYTEST-ARGS...]. Every cell at once (WORKERS processes, default 15), stopped after SECONDS (default 480); the runs,
# finished or not, tarred into $OUT without models or checkpoints; PYTEST-ARGS, when given, run first (the tests that
# need a GPU) with their output in $OUT/tests.log; ONLY in the environment is matrix.py's --only.
# That machine has python3 with torch but no Flower and no network: flwr and what it needs not already there travel
# as wheels in .whl, Fashion-MNIST's four IDX files in .fmnist (both ignored by git, named in the call's carry).
set -u
study="$1" seconds="${2:-480}" workers="${3:-15}"
shift $(( $# < 3 ? $# : 3 ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
mkdir -p /usr/share/datasets/fashion-mnist && cp .fmnist/* /usr/share/datasets/fashion-mnist/
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; lscpu | grep "Model name"; } > "$OUT/machine.txt"
python3 -c "import torch, flwr, flwr_datasets.partitioner, asyncfl.simulation.inprocess, asyncfl.strategies; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
if [ $# -gt 0 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
fi
timeout "$seconds" python3 benchmarks/matrix.py "$study" --in-process --workers "$workers" ${ONLY:+--only "$ONLY"} \
  > "$OUT/matrix.log" 2>&1
sleep 1
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude=checkpoints -C "benchmarks/$study" runs
ls -la "benchmarks/$study/runs"
