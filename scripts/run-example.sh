#!/usr/bin/env bash
# Quick start, part one: set up, then run the main example on an embedded local store.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
python examples/quickstart.py "$@"
