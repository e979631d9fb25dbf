#!/usr/bin/env bash
# Times one of the README's two commands as a fresh machine runs it: a clone of
# this checkout's HEAD (committed work only) in a scratch directory, its own
# empty CARGO_HOME (registry downloads and `cargo install`s from scratch; the
# toolchain itself is linked in, as a fresh machine has it) and no pip cache.
# Issue 45 item 6 measures the quick start (≤ 5 min) and the test command
# (≤ 40 min fresh) this way; say the load (`uptime`) beside the number.
#
# Usage: scripts/time-fresh-checkout.sh run-example|test [SCRATCH_DIR]
#   prints "rc=N seconds=S" last; the command's output goes to SCRATCH_DIR/log.
set -u
command=${1:?usage: $0 run-example|test [SCRATCH_DIR]}
case "$command" in
    run-example | test) ;;
    *) echo "time-fresh-checkout: unknown command $command (run-example or test)" >&2; exit 2 ;;
esac
src=$(cd "$(dirname "$0")/.." && pwd)
scratch=${2:-/tmp/shoal-fresh-$command}
rm -rf "$scratch"
mkdir -p "$scratch/cargo/bin"
git clone -q "$src" "$scratch/tree"
# The toolchain's binaries only (no cargo-installed tools): what rustup gives a fresh machine.
for tool in cargo rustc rustup rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver; do
    ln -s "$(command -v "$tool")" "$scratch/cargo/bin/$tool"
done
cd "$scratch/tree"
export CARGO_HOME="$scratch/cargo" PIP_NO_CACHE_DIR=1
PATH="$scratch/cargo/bin:$(echo "$PATH" | tr ':' '\n' | grep -v "${HOME}/.cargo/bin" | paste -sd:)"
export PATH
echo "time-fresh-checkout: ./scripts/$command.sh in $scratch/tree (load: $(cut -d' ' -f1-3 /proc/loadavg))"
start=$(date +%s)
"./scripts/$command.sh" > "$scratch/log" 2>&1
rc=$?
echo "time-fresh-checkout: load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "rc=$rc seconds=$(( $(date +%s) - start ))"
