#!/usr/bin/env bash
# Sets up what shoal needs on a fresh machine of this project's kind (Rust
# toolchain and CPython 3.11 present): a virtualenv in .venv with the build
# tools, and the shoal package built (release) into it. The quick start's
# first step: it builds the extension without its optional parts (an S3
# backing store, `shoal mount`, `shoal top`: docs/hacking.md, "Optional
# parts"); SHOAL_FEATURES=full builds every one (scripts/test.sh sets it), or
# name some: SHOAL_FEATURES=s3,fuse (unset: as the extension already in .venv
# has them). What only the checks need (pytest, ruff,
# the libraries the tests drive, model checker, cross compilers, an S3
# server) is installed by scripts/setup-test-tools.sh, which
# scripts/test.sh runs next; the quick start does not wait for it.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || { echo "setup: shoal needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }

# The extension's optional parts: SHOAL_FEATURES names them. Unset, those of the extension
# already in .venv (none on a fresh clone), so that the quick start after the test command
# does not build the extension again without them.
if [ -z "${SHOAL_FEATURES+set}" ] && [ -x .venv/bin/python ]; then
    SHOAL_FEATURES=$(.venv/bin/python -c "
import shoal
have = shoal.features() - {'cli'}
print('full' if have >= {'s3', 'fuse', 'top', 'etcd'} else ','.join(sorted(have)))" 2>/dev/null || true)
fi
features=()
if [ -n "${SHOAL_FEATURES:-}" ]; then
    features=(--features "$SHOAL_FEATURES")
fi

# Debian packages: with `shoal mount` (the fuse feature), fuse3 gives it fusermount3
# (mounting without root) and /etc/fuse.conf.
need_debs=()
case ",${SHOAL_FEATURES:-}," in
    *,full,* | *,fuse,*) command -v fusermount3 >/dev/null || need_debs+=(fuse3) ;;
esac
# With membership on etcd (the etcd feature), protoc and protobuf's well-known .proto files:
# the etcd client compiles etcd's API with them.
case ",${SHOAL_FEATURES:-}," in
    *,full,* | *,etcd,*)
        command -v protoc >/dev/null || need_debs+=(protobuf-compiler)
        [ -e /usr/include/google/protobuf/descriptor.proto ] || need_debs+=(libprotobuf-dev)
        ;;
esac
if [ ${#need_debs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${need_debs[*]} (apt)"
    $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends "${need_debs[@]}" >/dev/null; }
fi

# The extension is the release build (opt-level 3, thin LTO). SHOAL_PROFILE=checks builds it
# under the test build's profile instead (scripts/test.sh): its dependencies are then the
# tests' too, one build less; the benchmarks refuse that build (shoal.build_info()).
build=(--release)
if [ -n "${SHOAL_PROFILE:-}" ] && [ "$SHOAL_PROFILE" != release ]; then
    build=(--profile "$SHOAL_PROFILE")
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q --disable-pip-version-check "maturin>=1.5,<2"
# numpy and pyarrow download while the extension compiles (the build needs neither): the
# quick start waits for the longer of the two, not for both.
pip install -q --disable-pip-version-check "numpy>=1.24" "pyarrow>=14" &
deps=$!
echo "setup: building the extension (features: ${SHOAL_FEATURES:-none of the optional parts})"
# The filter drops maturin's progress lines; a failed build still fails the script (pipefail).
quiet() { grep -vE "^(📦|✏️|🛠|🔗|🐍|⚠️|🍹|📡)" || true; }
maturin develop "${build[@]}" -q --skip-install ${features[@]+"${features[@]}"} 2>&1 | quiet
wait "$deps"
# Installs it into .venv; the build above is current, so this compiles nothing.
maturin develop "${build[@]}" -q ${features[@]+"${features[@]}"} 2>&1 | quiet
python -c "
import shoal
info = shoal.build_info()
parts = ', '.join(sorted(shoal.features() - {'cli'})) or 'none'
print(f'setup: shoal {info[\"version\"]} (opt-level {info[\"opt_level\"]}) ready in .venv; optional parts: {parts}')"
