#!/usr/bin/env bash
# Checks that no crate of the workspace has an import cycle between its modules:
# for every lib and bin target, module A depends on module B when an item of A
# (its imports, a struct's field types, a function's parameter and return
# types, an impl's items) names an item defined in B; a cycle of such
# dependencies between two or more modules fails the check, and is printed.
#
# The graph is cargo-modules' (rust-analyzer's view of the crate, so `use`
# paths, re-exports and glob imports are resolved exactly), lifted to modules:
# `cargo modules dependencies --no-fns --no-types --no-traits` moves each
# item's "uses" edges onto the module that owns it. What counts (each checked
# on a scratch crate):
#   - a uses b::B and b uses a::A: a cycle, even if A and B never refer to
#     each other;
#   - a child's `use super::X` (or `crate::X`) is an edge child -> parent: a
#     cycle when the parent names an item of the child too, by a field or
#     signature type or a re-export (`pub use child::Y` in a mod.rs whose
#     trait the child implements is one);
#   - users of a re-exported item depend on the module defining it, not on
#     the one re-exporting it;
#   - `mod tests { use super::* }` is not looked at: tests are compiled out
#     (no --cfg-test); with them, a test module only ever depends on others,
#     so it cannot close a cycle either;
#   - "owns" edges (a parent declares its children) are the tree, not
#     dependencies: dropped;
#   - names used only inside function bodies are not seen (cargo-modules
#     reads imports, fields and signatures; an import at the top of a file
#     counts even if only a body uses it);
#   - items of one module referring to each other (a constructor returning
#     Self, two types pointing at each other) are no module cycle.
# Not `cargo modules dependencies --acyclic`: in cargo-modules 0.27 that checks
# the item graph, where a type owns its methods, so every `fn new() -> Self` is
# reported as a cycle (S -> S::new -> S).
#
# Usage: scripts/check-module-cycles.sh [--skip CRATE]...
#   --skip CRATE  leaves CRATE out (said loudly): for a known cycle, until it is removed.
set -euo pipefail
cd "$(dirname "$0")/.."

skip=()
while [ $# -gt 0 ]; do
    case "$1" in
        --skip) skip+=("$2"); shift 2 ;;
        *) echo "check-module-cycles: unknown argument $1" >&2; exit 2 ;;
    esac
done

command -v cargo-modules >/dev/null \
    || { echo "check-module-cycles: needs cargo-modules (installed by scripts/setup-test-tools.sh)" >&2; exit 1; }
export RUST_BACKTRACE=0

# "package kind target" per lib and bin target of the workspace's crates.
targets=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        kinds = set(target["kind"])
        if kinds & {"lib", "rlib", "cdylib", "staticlib", "proc-macro"}:
            print(package["name"], "lib", target["name"])
        elif "bin" in kinds:
            print(package["name"], "bin", target["name"])
')

failed=0
while read -r package kind target; do
    if [[ " ${skip[*]-} " == *" $package "* ]]; then
        echo "check-module-cycles: SKIPPED $package (--skip: a known cycle, not checked)"
        continue
    fi
    select=(--lib)
    [ "$kind" = bin ] && select=(--bin "$target")
    graph=$(cargo modules dependencies -p "$package" "${select[@]}" \
        --no-externs --no-sysroot --no-fns --no-types --no-traits --no-owns --layout dot)
    # `"a::b" -> "a::c" [label="uses", ...]` lines, as "a::b a::c" pairs for tsort,
    # which reports every loop it has to break (a pair of one name is no loop).
    edges=$(sed -n 's/^ *"\([^"]*\)" -> "\([^"]*\)" \[label="uses".*/\1 \2/p' <<<"$graph")
    if loops=$(tsort <<<"$edges" 2>&1 >/dev/null); then
        echo "check-module-cycles: $package ($kind $target): no cycle"
    else
        failed=1
        echo "check-module-cycles: $package ($kind $target): import cycle between modules:" >&2
        sed 's/^tsort: -: input contains a loop:$/  a loop:/; s/^tsort: /    /' <<<"$loops" >&2
        echo "  its module dependencies:" >&2
        sed 's/ / -> /; s/^/    /' <<<"$edges" >&2
    fi
done <<<"$targets"
exit $failed
