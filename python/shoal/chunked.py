"""A named table made of chunks: one small manifest object lists the chunk objects in
order, and binding the table's name to a new manifest publishes a new version at once.

Each chunk is an Arrow table in an object of its own (any node's memory); the manifest
holds the schema, and for each chunk its id, rows, bytes and the node that wrote it, so a
reader plans its work (one task per chunk, rows and bytes known) without touching the
data. The name moves to the new manifest at its seal (docs/posix.md, "Versions"): a reader
resolves either the old table or the new one, whole. `Client.get_named` of the name
returns the table assembled over the chunks' memory, no copy. Written by
`shoal.ray.ShoalDatasink`; read by `shoal.ray.ShoalDatasource` and by `get_named`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shoal._ids import ObjectID
from shoal._store import write_object
from shoal.errors import InvalidArgument

if TYPE_CHECKING:
    from shoal._store import ObjectStore

#: The metadata of a manifest object.
TAG = b"shoal/chunked-table"


@dataclass(frozen=True)
class Chunk:
    """One chunk of a table: its object and what a planner needs to know of it."""

    id: ObjectID
    rows: int
    nbytes: int
    #: The node whose memory holds it (where a reader of it best runs).
    node: int


@dataclass(frozen=True)
class Manifest:
    schema: pa.Schema
    chunks: tuple[Chunk, ...]

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def encode(self) -> bytes:
        schema = base64.b64encode(self.schema.serialize().to_pybytes()).decode()
        chunks = [[c.id.hex(), c.rows, c.nbytes, c.node] for c in self.chunks]
        return json.dumps({"schema": schema, "chunks": chunks}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["schema"])))
        chunks = tuple(Chunk(ObjectID.from_hex(i), r, b, n) for i, r, b, n in body["chunks"])
        return cls(schema, chunks)


def is_manifest(metadata: bytes) -> bool:
    return metadata == TAG


def read(buffer: Any) -> Manifest:
    """The manifest in object `buffer` (InvalidArgument if it is not one)."""
    if not is_manifest(bytes(buffer.metadata())):
        raise InvalidArgument("the object is not a chunked table's manifest")
    return Manifest.decode(bytes(memoryview(buffer)))


def bind(client: ObjectStore, name: str, manifest: Manifest, *, durability: str | None = None) -> ObjectID:
    """Writes `manifest` into a new object named `name`: from its seal on, `name` is this
    version of the table. Returns the manifest's id."""
    data = manifest.encode()

    def fill(buffer: Any) -> None:
        memoryview(buffer)[:] = data

    return write_object(client, len(data), TAG, fill, name=name, durability=durability)


def assemble(
    client: ObjectStore, manifest: Manifest, columns: Sequence[str] | None = None, timeout_ms: int = 0
) -> pa.Table:
    """The table over its chunks' memory (no copy), only `columns` if given. Raises
    ObjectNotFound for a chunk gone (a newer version replaced this one meanwhile)."""
    tables = []
    for chunk in manifest.chunks:
        table = client.get(chunk.id, timeout_ms)
        tables.append(table if columns is None else table.select(list(columns)))
    schema = manifest.schema if columns is None else pa.schema([manifest.schema.field(c) for c in columns])
    return pa.Table.from_batches([b for t in tables for b in t.to_batches()], schema=schema)
