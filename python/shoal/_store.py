"""The calls shoal's feature modules make on a client.

`arrow`, `hugetable` and `_sync` build tables, HugeTables, barriers and flags from a few
client calls. They take any object with these methods rather than `shoal.client.Client`:
the client imports them and they never import it, so the package has no import circle
(`scripts/check-python-imports.py`, run by CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from shoal._ids import IdLike, ObjectID
from shoal._internal import Buffer


class ObjectStore(Protocol):
    """What a table builder, a HugeTable or a barrier needs from a client."""

    @property
    def node(self) -> int:
        """This client's node in its cluster (0 when not clustered)."""
        ...

    def create(
        self,
        oid: IdLike,
        size: int,
        metadata: bytes | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> Buffer: ...

    def create_fresh(
        self,
        size: int,
        metadata: bytes | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> tuple[ObjectID, Buffer]: ...

    def seal(
        self, oids: IdLike | Iterable[IdLike], release: bool = False, *, durability: str | None = None
    ) -> None: ...

    def abort(self, oid: IdLike) -> None: ...

    def name(self, oid: IdLike, name: str) -> None: ...

    def put(
        self,
        value: Any,
        oid: IdLike | None = None,
        *,
        timeout_ms: int = 0,
        node: int | None = None,
        durability: str | None = None,
        name: str | None = None,
    ) -> ObjectID: ...

    def get(self, oid: IdLike | Sequence[IdLike], timeout_ms: int = -1) -> Any: ...

    def get_buffers(self, oids: Sequence[IdLike], timeout_ms: int = -1) -> list[Buffer | None]: ...

    def delete(self, oids: IdLike | Iterable[IdLike]) -> None: ...


def write_object(
    client: ObjectStore,
    size: int,
    metadata: bytes,
    fill: Callable[[Buffer], None],
    oid: ObjectID | None = None,
    *,
    name: str | None = None,
    durability: str | None = None,
    timeout_ms: int = 0,
) -> ObjectID:
    """A new object of `size` bytes (id `oid`, default a fresh one) that `fill` writes,
    named `name` and sealed, this process's reference released: create → fill → name →
    seal. The create waits up to `timeout_ms` for memory on a full store. Raises what the
    store raises (StoreFull, ...); a failed fill aborts the object."""
    if oid is None:
        oid, buffer = client.create_fresh(size, metadata, timeout_ms)
    else:
        buffer = client.create(oid, size, metadata, timeout_ms)
    try:
        fill(buffer)
        if name is not None:
            client.name(oid, name)
    except BaseException:
        client.abort(oid)
        raise
    client.seal(oid, release=True, durability=durability)
    del buffer
    return oid
