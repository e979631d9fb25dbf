#!/usr/bin/env bash
# Create (idempotently) the venv that holds Ray for the network benchmark
# (bench/network.py): Ray's object store moving an object between two
# raylets on this host is the peer of shoal's network-mode pull. Ray lives in
# its own venv so that its pins (numpy, protobuf, grpcio) never touch the
# project's .venv.
# Prints the path of the venv's python on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-ray"
py="$venv/bin/python"
version="2.60.0"

if [ ! -x "$py" ]; then
    python3 -m venv "$venv"
fi
if ! "$py" -c "import ray, numpy; assert ray.__version__ == '$version'" 2>/dev/null; then
    "$py" -m pip install --quiet --disable-pip-version-check "ray==$version" numpy >&2
fi
echo "$py"
