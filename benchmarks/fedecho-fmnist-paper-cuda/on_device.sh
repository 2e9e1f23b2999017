#!/usr/bin/env bash
# fedecho-fmnist-paper-cuda on a lent CUDA machine, from the repository root: every cell at once (one process each),
# stopped after $1 seconds (default 480); the runs, finished or not, tarred into $OUT without models or checkpoints.
# That machine has python3 with torch but no Flower and no network: flwr and what it needs not already there travel
# as wheels in .whl, Fashion-MNIST's four files in .fmnist (both ignored by git, named in the call's carry).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
mkdir -p /usr/share/datasets/fashion-mnist && cp .fmnist/* /usr/share/datasets/fashion-mnist/
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; lscpu | grep "Model name"; } > "$OUT/machine.txt"
python3 -c "import torch, flwr, flwr_datasets.partitioner, asyncfl.simulation.inprocess, asyncfl.strategies.fedecho; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1
timeout "${1:-480}" python3 benchmarks/matrix.py fedecho-fmnist-paper-cuda --in-process --workers "${2:-15}" > "$OUT/matrix.log" 2>&1
sleep 1
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude=checkpoints -C benchmarks/fedecho-fmnist-paper-cuda runs
ls -la benchmarks/fedecho-fmnist-paper-cuda/runs
