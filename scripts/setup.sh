#!/usr/bin/env bash
# Sets up everything shoal needs on a fresh machine of this project's kind
# (Rust toolchain and CPython 3.11 present): a virtualenv in .venv with the
# build and test tools, and the shoal package built (release) into it.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "setup: shoal needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# Debian packages: spin model-checks the coherency protocol (scripts/check-model.sh);
# cross gcc (linker and C library) and qemu user-mode emulation build and run the
# aarch64 and ppc64le cache maintenance (scripts/check-cross-arch.sh).
need_debs=()
command -v spin >/dev/null || need_debs+=(spin)
for cross in "aarch64-linux-gnu arm64" "powerpc64le-linux-gnu ppc64el"; do
    read -r gnu debarch <<<"$cross"
    command -v "$gnu-gcc" >/dev/null || need_debs+=("gcc-$gnu")
    [ -e "/usr/$gnu/lib/libc.so" ] || need_debs+=("libc6-dev-$debarch-cross")
done
if ! command -v qemu-aarch64-static >/dev/null || ! command -v qemu-ppc64le-static >/dev/null; then
    need_debs+=(qemu-user-static)
fi
if [ ${#need_debs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${need_debs[*]} (apt)"
    $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null; }
fi
# The Rust standard library for the cross targets, for the same rustc. If rustup
# cannot fetch it, setup goes on and scripts/check-cross-arch.sh skips that
# target, saying why.
for triple in aarch64-unknown-linux-gnu powerpc64le-unknown-linux-gnu; do
    libdir=$(rustc --print target-libdir --target "$triple" 2>/dev/null || true)
    if [ -z "$libdir" ] || ! compgen -G "$libdir/libstd-*.rlib" >/dev/null; then
        echo "setup: installing the Rust standard library for $triple (rustup)"
        rustup target add "$triple" >/dev/null 2>&1 \
            || echo "setup: could not add $triple with rustup; scripts/check-cross-arch.sh will skip it" >&2
    fi
done
# cargo-modules: each crate's module graph, for scripts/check-module-cycles.sh.
# Pinned: 0.28 needs rustc 1.98. The install builds rust-analyzer's crates
# (about 11 min of CPU; 41 min on two cores shared with other builds).
CARGO_MODULES_VERSION=0.27.0
if ! cargo modules --version 2>/dev/null | grep -qx "cargo-modules $CARGO_MODULES_VERSION"; then
    echo "setup: installing cargo-modules $CARGO_MODULES_VERSION (cargo install, slow)"
    cargo install --locked --quiet cargo-modules --version "$CARGO_MODULES_VERSION"
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
