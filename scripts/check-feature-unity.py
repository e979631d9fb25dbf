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

Reads `cargo tree` (no build). Exit 1 on a difference.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    extension = features("-p", "shoal-py", "-e", "normal")
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
    if not differ:
        crates = len(extension)
        print(f"check-feature-unity: the {crates} crates the extension compiles build once for tests too")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
