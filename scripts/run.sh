#!/usr/bin/env bash
# Install, then run the default simulation (FedBuff on mnist5k, 50 clients) through flwr run.
# Extra arguments go to `asyncfl run`, e.g.: bash scripts/run.sh -c "strategy='fedasync'"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/asyncfl run "$@"
