#!/usr/bin/env bash
# Install, then run the whole test suite (unit, fake-Grid engine tests and a few real flwr runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest -q --durations=15 "$@"
