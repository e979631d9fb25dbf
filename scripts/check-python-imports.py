#!/usr/bin/env python3
"""No import circle between the modules of the Python package (python/shoal).

Every import counts: at the top, inside functions (a lazy import still ties the two
modules together) and under `if TYPE_CHECKING:` (a type that names the importer is the
circle the feature modules used to have). `from shoal import x` is an edge to module
`shoal.x` when x is a module, else to the package (`shoal/__init__.py`).

    python3 scripts/check-python-imports.py [PACKAGE_DIR]   # default python/shoal
Exit status 1, with each circle printed, if there is one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every .py file of the package at `root`, and every .pyi
    stub without one (an extension module such as `_internal`: its stub stands for it)."""
    package = root.name
    found = {}
    sources = sorted(root.rglob("*.py"))
    stubs = [p for p in sorted(root.rglob("*.pyi")) if not p.with_suffix(".py").exists()]
    for path in sources + stubs:
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = []
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in known else base)
        else:
            continue
        for target in targets:
            # `import shoal.x.y` imports shoal.x.y and its parents; the nearest known one counts.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "python/shoal").resolve()
    known = modules(root)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    # The package imports its modules to re-export them; a module importing the package
    # back is a circle through __init__ and is reported like any other.
    found = circles(graph)
    for component in found:
        print("check-python-imports: import circle: " + " <-> ".join(component))
        for name in component:
            inside = sorted(graph[name] & set(component))
            print(f"  {name} imports {', '.join(inside)}")
    if not found:
        edges = sum(len(e) for e in graph.values())
        print(f"check-python-imports: ok: {len(known)} modules, {edges} imports, no circle")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
