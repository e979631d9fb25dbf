#!/usr/bin/env bash
# Sets up what shoal needs on a fresh machine of this project's kind (Rust
# toolchain and CPython 3.11 present): a virtualenv in .venv with the build
# and test Python packages, and the shoal package built (release) into it.
# The tools only the checks need (model checker, cross compilers, the module
# graph, an S3 server) are installed by scripts/setup-test-tools.sh, which
# scripts/test.sh runs first; the quick start does not wait for them.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "setup: shoal needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# Debian packages: fuse3 gives `shoal mount` fusermount3 (mounting without root) and
# /etc/fuse.conf; fio and rsync are unmodified programs the mount's tests run.
need_debs=()
command -v fusermount3 >/dev/null || need_debs+=(fuse3)
command -v fio >/dev/null || need_debs+=(fio)
command -v rsync >/dev/null || need_debs+=(rsync)
if [ ${#need_debs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${need_debs[*]} (apt)"
    $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null; }
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q --disable-pip-version-check "maturin>=1.5,<2" "numpy>=1.24" "pyarrow>=14" "pytest>=7" "ruff>=0.6" "duckdb>=1.1" "polars>=1.0" "h5py>=3.10" "netCDF4>=1.6"
maturin develop --release -q 2>&1 | grep -vE "^(📦|✏️|🛠|🔗|🐍|⚠️)" || true
python -c "import shoal; print('setup: shoal', shoal.__version__, 'ready in .venv')"
