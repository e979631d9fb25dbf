#!/usr/bin/env python3
"""Checks that the Python extension's build and the test build compile each shared crate once.

Cargo unifies a crate's features per build: when `cargo test` turns on a feature of a
dependency (through a dev-dependency) that `maturin develop` (shoal-py alone) does not,
that crate and every crate above it compile twice, once per feature set. For tokio or
num-traits that is most of the workspace (measured: 39 % of the extension's compile time).
This compares, for every crate both builds compile for the target (build scripts and
proc-macros are host builds, resolved apart), the features each build turns on, and fails
on a difference. Fix one by turning the feature on in a normal dependency (with a comment
saying why) or by not needing it in tests.

The extension's build here is scripts/test.sh's: every optional part on (SHOAL_FEATURES=full,
`--features full`). The quick start builds it without them (shoal-py's default features);
that build must compile none of the optional parts' own crates (OPTIONAL_CRATES), or the
quick start waits for them again (docs/hacking.md, "Optional parts").

Reads `cargo tree` (no build). Exit 1 on a difference, or on an optional crate in the quick
start's build.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What scripts/test.sh asks of the extension (SHOAL_FEATURES=full in scripts/setup.sh).
TEST_FEATURES = "full"
# The optional parts' crates (features `s3`, `fuse`, `top`, `etcd`), kept out of the quick
# start's build. (rustls is not one: peer traffic between hosts is TLS in every build.)
OPTIONAL_CRATES = {
    "object_store",
    "reqwest",
    "fuser",
    "shoal-fuse",
    "ratatui",
    "crossterm",
    "etcd-client",
    "shoal-membership",
}


def features(*args: str) -> dict[str, set[str]]:
    out = subprocess.run(
        ["cargo", "tree", "--prefix", "none", "-f", "{p} [{f}]", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        match = re.match(r"(\S+ v\S+)(?: \(.*?\))?(?: \(\*\))? \[(.*)\]$", line.strip())
        if match:
            found.setdefault(match.group(1), set()).update(f for f in match.group(2).split(",") if f)
    return found


def main() -> int:
    extension = features("-p", "shoal-py", "--features", TEST_FEATURES, "-e", "normal")
    tests = features("-e", "normal,dev")
    differ = {
        crate: (sorted(tests[crate] - have), sorted(have - tests[crate]))
        for crate, have in extension.items()
        if crate in tests and tests[crate] != have
    }
    for crate, (more, fewer) in sorted(differ.items()):
        print(
            f"check-feature-unity: {crate}: the test build adds {more or '-'}, the extension's adds "
            f"{fewer or '-'}; it and every crate above it would compile twice",
            file=sys.stderr,
        )
    quick_start = features("-p", "shoal-py", "-e", "normal,build", "--target", "all")
    optional = sorted(c for c in quick_start if c.split(" ")[0] in OPTIONAL_CRATES)
    for crate in optional:
        print(
            f"check-feature-unity: the quick start's build (shoal-py's default features) compiles "
            f"{crate}, a crate of an optional part",
            file=sys.stderr,
        )
    if not differ and not optional:
        crates = len(extension)
        print(
            f"check-feature-unity: the {crates} crates the extension compiles (--features {TEST_FEATURES}) "
            f"build once for tests too; the quick start's build ({len(quick_start)} crates) has none of "
            f"{', '.join(sorted(OPTIONAL_CRATES))}"
        )
    return 1 if differ or optional else 0


if __name__ == "__main__":
    sys.exit(main())
