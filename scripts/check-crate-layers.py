#!/usr/bin/env python3
"""Checks the crates' layering against the rule docs/hacking.md states.

Cargo refuses a dependency cycle but not an upward edge that closes none (say
shoal-cluster -> shoal-tiers): this check does. Two rules:

1. Each workspace crate's shoal dependencies ([dependencies], optional ones
   included; not dev-dependencies) are exactly the ones its line in the
   "What each crate may import" block of docs/hacking.md lists. A new edge
   needs the page changed with it, in the same commit.
2. The contract side never compiles the engine: the crates clients, the FUSE
   view and the Python binding build from (and the binding without its
   optional command line) do not reach shoal-store, shoal-capacity or
   shoal-daemon through any chain of normal, non-optional dependencies.

Reads `cargo metadata --no-deps` (no network, no build). Exit 1 on a breach.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = {"shoal-store", "shoal-capacity", "shoal-daemon"}
ENGINE_FREE = ["shoal-core", "shoal-client", "shoal-fuse", "shoal-cluster", "shoal-tiers", "shoal-py"]


def documented_rule() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "hacking.md").read_text()
    block = re.search(r"```text\n(shoal-py\s+->.*?)```", text, re.S)
    if block is None:
        sys.exit("check-crate-layers: docs/hacking.md has no ```text block of 'crate -> crates' lines")
    rule = {}
    for line in block.group(1).splitlines():
        crate, _, deps = line.partition("->")
        crate = crate.split("(")[-1].rstrip(") ").strip() if "(" in crate else crate.strip()
        deps = re.sub(r"\(.*?\)", "", deps)
        rule[crate] = {d.strip() for d in deps.split(",") if d.strip().startswith("shoal-")}
    return rule


def workspace() -> dict[str, list[dict]]:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {
        p["name"]: [d for d in p["dependencies"] if d["name"].startswith("shoal-") and d["kind"] is None]
        for p in json.loads(out)["packages"]
    }


def reaches(crates: dict[str, list[dict]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in crates.get(todo.pop(), []):
            if not dep["optional"] and dep["name"] not in seen:
                seen.add(dep["name"])
                todo.append(dep["name"])
    return seen


def main() -> int:
    rule, crates = documented_rule(), workspace()
    failures = []
    for crate, deps in sorted(crates.items()):
        have = {d["name"] for d in deps}
        if crate not in rule:
            failures.append(f"{crate}: not in docs/hacking.md's import rule")
        elif have != rule[crate]:
            extra, missing = sorted(have - rule[crate]), sorted(rule[crate] - have)
            failures.append(f"{crate}: depends on {extra or '-'} beyond the rule, lacks {missing or '-'}")
    for crate in ENGINE_FREE:
        engine = sorted(reaches(crates, crate) & ENGINE)
        if engine:
            failures.append(f"{crate}: compiles the engine ({', '.join(engine)})")
    for failure in failures:
        print(f"check-crate-layers: {failure}", file=sys.stderr)
    if not failures:
        print(
            f"check-crate-layers: {len(crates)} crates follow docs/hacking.md; "
            f"{', '.join(ENGINE_FREE)} compile no engine crate"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
