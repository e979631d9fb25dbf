#!/usr/bin/env bash
# Quick start, part two: set up, then run every check and test CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step is stamped with the seconds since the start, so a run's log says what took the time.
step() { printf '\n== [%d s] %s\n' "$SECONDS" "$*"; }
step "setup: .venv and the extension with every optional part, under the tests' profile (the quick start's setup, SHOAL_FEATURES=full SHOAL_PROFILE=checks)"
# The tests drive every optional part, and the extension's build and the tests' share every
# crate only with all of them on (scripts/check-feature-unity.py) and under one profile: the
# test build below then compiles only what the extension does not link (a release extension
# beside it cost 294 s more). The benchmarks refuse this build; scripts/setup.sh makes the
# release one again.
SHOAL_FEATURES=full SHOAL_PROFILE=checks ./scripts/setup.sh
step "setup: the tools only the checks need"
./scripts/setup-test-tools.sh
. .venv/bin/activate

step "format and lints"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)
(cd proto/codegen && cargo fmt --check)
# Under the `checks` profile, as the build above: its proc macros and build scripts are
# reused (under `--release` they were compiled again, ~40 s).
cargo clippy --workspace --all-targets --profile checks -q -- -D warnings
# The quick start's build (no optional part: shoal-py's default features), and the command
# line's tests without them (crates/shoal-cli/tests/integration/features.rs).
cargo clippy -p shoal-py --profile checks -q -- -D warnings
cargo clippy -p shoal-cli --no-default-features --all-targets --profile checks -q -- -D warnings
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
# `--workspace` resolves features as the build above did, so only shoal-client and what the
# test links of it are built again (under `-p shoal-client` every crate's features changed
# and the step rebuilt tokio upwards: 106 s against 5 s).
cargo test --profile checks -q --workspace --test simulated_fabric \
    --features shoal-client/broken-skip-flush,shoal-client/broken-skip-owner-invalidate

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
# Most tests wait on daemons, not on a core (a serial run used 43 % of one): four processes
# (pytest-xdist) took the run from 246 s to 98 s here. Tests marked `alone` bound how long a
# call may take or count CPU, and run after the others, by themselves (tests/python/conftest.py).
python -m pytest -q -n 4 -m "not alone" tests/python
python -m pytest -q -m alone tests/python

step "done"
