#!/usr/bin/env bash
# Sets up everything shoal needs on a fresh machine of this project's kind
# (Rust toolchain and CPython 3.11 present): a virtualenv in .venv with the
# build and test tools, and the shoal package built (release) into it.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "setup: shoal needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# Debian packages: spin model-checks the coherency protocol (scripts/check-model.sh).
need_debs=()
command -v spin >/dev/null || need_debs+=(spin)
if [ ${#need_debs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${need_debs[*]} (apt)"
    $SUDO apt-get install -y -q "${need_debs[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need_debs[@]}" >/dev/null; }
fi
# s3s-fs: the S3-compatible server the tier tests start on loopback
# (crates/shoal-tiers/tests/s3.rs). Pinned: later releases need a newer rustc.
# Built from source: ~18 min measured on this 2-core machine under load (-j1).
if ! command -v s3s-fs >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]; then
    echo "setup: installing s3s-fs 0.14.1 (cargo install, several minutes the first time)"
    cargo install --locked --quiet s3s-fs@0.14.1 --features binary
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q --disable-pip-version-check "maturin>=1.5,<2" "numpy>=1.24" "pyarrow>=14" "pytest>=7" "ruff>=0.6" "duckdb>=1.1" "polars>=1.0"
maturin develop --release -q 2>&1 | grep -vE "^(📦|✏️|🛠|🔗|🐍|⚠️)" || true
python -c "import shoal; print('setup: shoal', shoal.__version__, 'ready in .venv')"
