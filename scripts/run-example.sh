#!/usr/bin/env bash
# Quick start, part one: set up, then run the main examples: an embedded local store, then an
# emulated three-node cluster on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
python examples/quickstart.py "$@"
python examples/cluster.py
