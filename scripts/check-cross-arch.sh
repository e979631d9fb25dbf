#!/usr/bin/env bash
# Builds and runs the aarch64 and powerpc64le cache maintenance (shoal-core's
# coherence::aarch64, `dc civac` + `dsb sy`, and coherence::powerpc64, `dcbf`
# + `sync`) on this x86_64 host: shoal-core's unit tests are cross-compiled
# for each target with the project's rustc and the coherence tests run under
# qemu user-mode emulation, which executes the real instructions (and raises
# SIGILL for ones user code may not issue). shoal-core is also linted with
# clippy for each target, since the host's clippy never compiles those modules.
#
# Then it shows the check would catch a broken instruction: in a scratch copy
# of the sources it mutates the maintenance instruction of each target
#   - into a misspelled mnemonic: the cross build must fail on it;
#   - into its privileged sibling (`dc ivac`, `dcbi`), which assembles fine:
#     the tests under qemu must fail with SIGILL.
# A mutant that is not caught fails this script.
#
# Installs nothing: scripts/setup-test-tools.sh adds the rustup targets and the Debian
# packages (cross gcc as linker and C library, qemu-user-static). A target
# whose pieces are missing is skipped with the reason; nothing passes unseen.
# Exits non-zero if a check ran and failed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

say() { printf 'check-cross-arch: %s\n' "$*"; }

# One row per target: rust triple, GNU triple (cross gcc prefix and the
# sysroot under /usr), qemu name, source file, the instruction as written
# there, a misspelling of it, and its privileged sibling.
TARGETS=(
    "aarch64-unknown-linux-gnu|aarch64-linux-gnu|aarch64|aarch64.rs|dc civac, {0}|dc cviac, {0}|dc ivac, {0}"
    "powerpc64le-unknown-linux-gnu|powerpc64le-linux-gnu|ppc64le|powerpc64.rs|dcbf 0, {0}|dcfb 0, {0}|dcbi 0, {0}"
)

# missing RUST_TRIPLE GNU_TRIPLE QEMU: prints what is missing, if anything.
missing() {
    local triple=$1 gnu=$2 qemu=$3 libdir
    libdir=$(rustc --print target-libdir --target "$triple" 2>/dev/null || true)
    if [ -z "$libdir" ] || ! compgen -G "$libdir/libstd-*.rlib" >/dev/null; then
        echo "no Rust standard library for $triple (rustup target add $triple)"
    elif ! command -v "$gnu-gcc" >/dev/null; then
        echo "no $gnu-gcc (Debian: gcc-$gnu)"
    elif [ ! -e "/usr/$gnu/lib/libc.so" ]; then
        echo "no $gnu C library in /usr/$gnu (Debian: the libc6-dev cross package)"
    elif ! command -v "qemu-$qemu-static" >/dev/null && ! command -v "qemu-$qemu" >/dev/null; then
        echo "no qemu-$qemu (Debian: qemu-user-static)"
    fi
}

# cargo_for RUST_TRIPLE GNU_TRIPLE QEMU SUBCOMMAND [ARGS...]: cargo
# SUBCOMMAND on shoal-core's library (the `checks` profile, as the project
# tests: release without LTO, Cargo.toml) for the target, with its linker and
# qemu as the test runner.
cargo_for() {
    local triple=$1 gnu=$2 qemu=$3 subcommand=$4
    shift 4
    local var qemu_bin
    var=$(echo "$triple" | tr 'a-z-' 'A-Z_')
    qemu_bin=$(command -v "qemu-$qemu-static" || command -v "qemu-$qemu")
    env "CARGO_TARGET_${var}_LINKER=$gnu-gcc" \
        "CARGO_TARGET_${var}_RUNNER=$qemu_bin -L /usr/$gnu" \
        nice -n 10 cargo "$subcommand" --profile checks -p shoal-core --lib --target "$triple" "$@"
}

# mutant NAME FILE FROM TO: a scratch copy of the workspace sources with FROM
# replaced by TO in coherence/FILE; prints its directory. Mutants build into a
# target directory of their own: cargo names a path package's artifacts by
# its path inside the workspace, so a mutant built into the real one would
# overwrite the real test binary, which a later run could take as up to date
# (this happened).
mutant() {
    local name=$1 file=$2 from=$3 to=$4 dir src
    dir="$SCRATCH/$name"
    mkdir -p "$dir"
    # docs/: shoal-core's doc_check test includes docs/protocol.md.
    cp -r Cargo.toml Cargo.lock crates docs "$dir/"
    src="$dir/crates/shoal-core/src/coherence/$file"
    if [ "$(grep -cF -- "$from" "$src")" != 1 ]; then
        say "FAILED $name: \"$from\" is not in coherence/$file exactly once; update TARGETS" >&2
        return 1
    fi
    FROM=$from TO=$to perl -pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/' "$src"
    grep -qF -- "$to" "$src" || { say "FAILED $name: mutation not applied" >&2; return 1; }
    echo "$dir"
}

MUTANT_TARGET_DIR="$CARGO_TARGET_DIR/cross-mutants"
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/shoal-cross.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT

status=0
ran=0
for row in "${TARGETS[@]}"; do
    IFS='|' read -r triple gnu qemu file insn typo privileged <<<"$row"
    why=$(missing "$triple" "$gnu" "$qemu")
    if [ -n "$why" ]; then
        say "SKIPPED $triple: $why; scripts/setup-test-tools.sh installs it"
        continue
    fi
    ran=$((ran + 1))
    log="$SCRATCH/$triple.log"

    # The real sources: build, then run the coherence tests under qemu.
    start=$(date +%s)
    if cargo_for "$triple" "$gnu" "$qemu" test -- coherence:: >"$log" 2>&1; then
        summary=$(grep -E '^test result:' "$log" | tail -n1)
        say "$triple: $(grep -cE '^test coherence::(aarch64|powerpc64)::' "$log") arch tests; ${summary#test result: } ($(($(date +%s) - start))s)"
    else
        cat "$log" >&2
        say "FAILED $triple: the coherence tests do not pass under qemu-$qemu" >&2
        status=1
        continue
    fi

    # The arch modules are not compiled on the host, so its clippy never
    # sees them: lint them here, as strictly.
    start=$(date +%s)
    if nice -n 10 cargo clippy -q --profile checks -p shoal-core --all-targets --target "$triple" \
        -- -D warnings >"$log" 2>&1; then
        say "$triple: clippy clean ($(($(date +%s) - start))s)"
    else
        cat "$log" >&2
        say "FAILED $triple: clippy" >&2
        status=1
    fi

    # A misspelled instruction: the build must fail, on that instruction.
    # The test build, not `cargo build --lib`: an optimised rlib need not
    # generate code for functions only its users instantiate, and then its asm
    # is never assembled (a `cargo build` of a typo passes here).
    start=$(date +%s)
    dir=$(mutant "$triple-typo" "$file" "$insn" "$typo") || { status=1; continue; }
    if (cd "$dir" && CARGO_TARGET_DIR=$MUTANT_TARGET_DIR cargo_for "$triple" "$gnu" "$qemu" test --no-run) >"$log" 2>&1; then
        say "FAILED $triple: \"$typo\" built; the cross build does not assemble coherence/$file" >&2
        status=1
    elif grep -qF -- "${typo%%,*}" "$log" && grep -q '^error' "$log"; then
        say "$triple: \"$typo\" rejected by the build as expected ($(($(date +%s) - start))s)"
    else
        cat "$log" >&2
        say "FAILED $triple: the build of \"$typo\" failed, but not on that instruction" >&2
        status=1
    fi

    # A privileged instruction: builds, and the tests must die of SIGILL.
    start=$(date +%s)
    dir=$(mutant "$triple-privileged" "$file" "$insn" "$privileged") || { status=1; continue; }
    if ! (cd "$dir" && CARGO_TARGET_DIR=$MUTANT_TARGET_DIR cargo_for "$triple" "$gnu" "$qemu" test --no-run) >"$log" 2>&1; then
        cat "$log" >&2
        say "FAILED $triple: \"$privileged\" should build (it is a valid instruction)" >&2
        status=1
    elif (cd "$dir" && CARGO_TARGET_DIR=$MUTANT_TARGET_DIR cargo_for "$triple" "$gnu" "$qemu" test -- coherence::) >"$log" 2>&1; then
        say "FAILED $triple: tests passed with \"$privileged\"; qemu does not run the instruction" >&2
        status=1
    elif grep -q 'SIGILL' "$log"; then
        say "$triple: \"$privileged\" caught by the tests under qemu (SIGILL) as expected ($(($(date +%s) - start))s)"
    else
        cat "$log" >&2
        say "FAILED $triple: tests with \"$privileged\" failed, but not with SIGILL" >&2
        status=1
    fi
done

if [ "$ran" = 0 ]; then
    say "SKIPPED: no target could be checked (see above)"
elif [ "$status" = 0 ]; then
    say "ok: $ran of ${#TARGETS[@]} targets checked$([ "$ran" = "${#TARGETS[@]}" ] || echo "; the others SKIPPED, see above")"
else
    say "FAILED" >&2
fi
exit "$status"
