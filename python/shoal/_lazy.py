"""Module attributes imported on first use (a package's `__getattr__`): what pulls in heavy
dependencies (numpy and pyarrow for `shoal`, ray.data for `shoal.ray`) waits until a
program asks for it."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(namespace: dict[str, Any], table: dict[str, str], name: str, owner: str) -> Any:
    """Attribute `name` of module `owner` from the module `table` names for it, kept in
    `namespace` (the module's globals) so the next lookup finds it directly."""
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
