#!/usr/bin/env bash
# Create (idempotently) the venv that holds Apache Arrow Plasma for the
# comparison benchmarks: pyarrow 11.0.0 is the last release that ships the
# `plasma_store` binary and the `pyarrow.plasma` client.
# Prints the path of the venv's python on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-plasma"
py="$venv/bin/python"

if [ ! -x "$py" ]; then
    python3 -m venv "$venv"
fi
if ! "$py" -c 'import pyarrow, pyarrow.plasma, numpy; assert pyarrow.__version__ == "11.0.0"' 2>/dev/null; then
    "$py" -m pip install --quiet --disable-pip-version-check "pyarrow==11.0.0" "numpy<2" >&2
fi
if [ ! -x "$venv/bin/plasma_store" ]; then
    echo "setup_plasma.sh: plasma_store missing from $venv/bin" >&2
    exit 1
fi
echo "$py"
