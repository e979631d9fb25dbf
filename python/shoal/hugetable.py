"""HugeTables: one Arrow table whose chunks live in several nodes' memory.

Each process of a job contributes its part under the table's name and a chunk index
(`put_chunk`), written in its own node's memory or, with `node=`, in another's. Any
process on any node then assembles the same `pyarrow.Table` (`get_table`): chunk i is
a view of the memory of the node that holds it, in chunk order, with no copy, so
pyarrow.compute, DuckDB and Polars run on it in place.

Chunk ids are derived from (name, index) — SHA-1 gives exactly the 20 bytes of an id —
so no catalogue has to be kept consistent: the cluster-wide id uniqueness makes a second
`put_chunk` of the same chunk fail with ObjectExists, and `delete_table` frees each chunk
on the node that holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shoal._ids import ObjectID, derived_id
from shoal.errors import InvalidArgument, Timeout

if TYPE_CHECKING:
    from shoal._store import ObjectStore


def chunk_id(name: str, index: int) -> ObjectID:
    """The id of chunk `index` of table `name` (the same on every node and process)."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise InvalidArgument(f"chunk index must be a non-negative int, got {index!r}")
    return derived_id("shoal/hugetable", name, index)


def _as_table(value: Any) -> pa.Table:
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    raise TypeError(f"a HugeTable chunk is a pyarrow Table or RecordBatch, got {type(value).__name__}")


def put_chunk(client: ObjectStore, name: str, index: int, value: Any, *, node: int | None = None) -> ObjectID:
    """Stores chunk `index` of table `name` (on `node`, default this client's node)."""
    return client.put(_as_table(value), chunk_id(name, index), node=node)


def get_table(client: ObjectStore, name: str, parts: int, timeout_ms: int = -1) -> pa.Table:
    """Assembles chunks 0..parts-1 of `name` into one Table over their nodes' memory.

    Waits up to `timeout_ms` (-1: forever) for missing chunks; then raises Timeout naming
    them. Every chunk must have the first chunk's schema (InvalidArgument otherwise)."""
    if parts < 1:
        raise InvalidArgument(f"a table has at least one chunk, got parts={parts}")
    ids = [chunk_id(name, i) for i in range(parts)]
    chunks = client.get(ids, timeout_ms=timeout_ms)
    missing = [i for i, chunk in enumerate(chunks) if chunk is None]
    if missing:
        raise Timeout(
            f"table {name!r}: {parts - len(missing)} of {parts} chunks present after {timeout_ms} ms; "
            f"missing chunks {missing}"
        )
    schema = chunks[0].schema
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, pa.Table):
            raise InvalidArgument(f"chunk {i} of table {name!r} is not a table")
        if not chunk.schema.equals(schema):
            raise InvalidArgument(
                f"chunk {i} of table {name!r} has schema {chunk.schema} but chunk 0 has {schema}"
            )
    # from_batches keeps every batch's buffers as they are: views of each node's memory.
    return pa.Table.from_batches([b for chunk in chunks for b in chunk.to_batches()], schema=schema)


def delete_table(client: ObjectStore, name: str, parts: int) -> None:
    """Deletes every chunk on the node that holds it (chunks still in use go when released)."""
    client.delete([chunk_id(name, i) for i in range(parts)])
