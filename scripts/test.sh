#!/usr/bin/env bash
# Quick start, part two: set up, then run every check and test CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step is stamped with the seconds since the start, so a run's log says what took the time.
step() { printf '\n== [%d s] %s\n' "$SECONDS" "$*"; }
step "setup: .venv and the extension with every optional part (the quick start's setup, SHOAL_FEATURES=full)"
# The tests drive every optional part, and the extension's build and the tests' share every
# crate only with all of them on (scripts/check-feature-unity.py).
SHOAL_FEATURES=full ./scripts/setup.sh
step "setup: the tools only the checks need"
./scripts/setup-test-tools.sh
. .venv/bin/activate

step "format and lints"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)
(cd proto/codegen && cargo fmt --check)
cargo clippy --workspace --all-targets --release -q -- -D warnings
# The quick start's build (no optional part: shoal-py's default features), and the command
# line's tests without them (crates/shoal-cli/tests/integration/features.rs).
cargo clippy -p shoal-py --release -q -- -D warnings
cargo clippy -p shoal-cli --no-default-features --all-targets --release -q -- -D warnings
ruff check python tests bench examples
ruff format --check python tests bench examples

step "crate layers as docs/hacking.md states them; no import cycle between the modules of a crate or of the Python package"
python3 scripts/check-crate-layers.py
# The extension's build and the test build ask for the same features of every shared crate.
python3 scripts/check-feature-unity.py
# No known cycle is left; `--skip CRATE` would exempt a crate (loudly) while one is removed.
python3 scripts/check-module-cycles.py
# The same at the level of files (`crate::`/`super::` paths), where the team's tool is beside the checkout.
if [ -f ../shared/tools/rust_cycles.py ]; then python3 ../shared/tools/rust_cycles.py .; fi
# And between the modules of the Python package (lazy and type-only imports count).
python3 scripts/check-python-imports.py

step "Rust unit and integration tests: build"
# --timings leaves target/cargo-timings/cargo-timing.html: what the build spent its time on.
# The `checks` profile (Cargo.toml) is release without LTO at opt-level 1: half the build
# time of `--release` (docs/decisions.md). `--tests` (libraries, binaries and integration
# tests) leaves out the examples: measuring tools the bench scripts build (clippy
# --all-targets above checks them).
cargo test --profile checks -q --no-run --timings --tests
step "Rust unit and integration tests: run"
cargo test --profile checks -q --tests
cargo test --profile checks -q --doc

step "simulated non-coherent fabric: a client built without its flush, and without the owner node's invalidate, must be caught"
# One build with both faults: each fault has checks in the test that depend on it alone.
cargo test --profile checks -q -p shoal-client --features broken-skip-flush,broken-skip-owner-invalidate \
    --test simulated_fabric

step "frame decoder fuzz smoke (stable; the libFuzzer target is fuzz/)"
(cd fuzz && cargo test --release -q)

step "the peer RPC's checked-in code is what peer.proto gives"
# Its own workspace and target directory: no build of shoal compiles protox.
(cd proto/codegen && cargo test -q)

step "coherency protocol model (spin)"
./scripts/check-model.sh

step "aarch64 and ppc64le cache maintenance under qemu-user; a misspelled and a privileged instruction must be caught"
./scripts/check-cross-arch.sh

step "Python tests"
python -m pytest -q tests/python

step "done"
