"""`ShoalDatasource`: Ray Data reading tables in the store, one read task per chunk.

    ds = ray.data.read_datasource(shoal.ray.ShoalDatasource("tables/events"))
    ds = ray.data.read_datasource(shoal.ray.ShoalDatasource(hugetable="events", parts=8))

A source is a named table, of one of two kinds:
- a chunked table (shoal.chunked; what `ShoalDatasink` writes): one read task per chunk,
  rows and bytes from its manifest;
- an Arrow table put under a name (`client.put(table, name=...)`): one read task per
  record batch;
or a HugeTable (`client.put_chunk`): one read task per chunk, rows and bytes read from
each chunk's IPC header by the planning process (a mapped read: the header's pages only).

A read task maps its chunk and yields it as a table over store memory; projection
pushdown (`ds.select_columns`, or `columns=`) is a zero-copy column select there. Ray Data
then keeps the block as Ray keeps any task result: in plasma.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from shoal import _codec, chunked, hugetable
from shoal._ids import ObjectID
from shoal.errors import InvalidArgument, ObjectNotFound
from shoal.ray import store

if TYPE_CHECKING:
    from ray.data.context import DataContext


@dataclass(frozen=True)
class _Part:
    """What one read task reads: an object, and which record batch of it (None: all)."""

    id: ObjectID
    batch: int | None
    rows: int
    nbytes: int
    node: int | None


def _as_table(value: pa.Table | pa.RecordBatch | pa.Array | pa.ChunkedArray) -> pa.Table:
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    return pa.table({"values": value})  # an Array or ChunkedArray: its one column (as put)


def _read(part: _Part, columns: list[str] | None) -> Iterator[pa.Table]:
    """A read task's body (in a Ray worker): the part as a table over store memory."""
    try:
        value = store.client().get(part.id, 0)
    except ObjectNotFound:
        raise ObjectNotFound(
            f"shoal object {part.id.hex()} is gone: the table was rewritten or deleted while it was read"
        ) from None
    table = _as_table(value)
    if part.batch is not None:
        table = pa.Table.from_batches([table.to_batches()[part.batch]], schema=table.schema)
    yield table if columns is None else table.select(columns)


class ShoalDatasource(Datasource):
    """A named table or HugeTable of the store, read by Ray Data (module docstring)."""

    def __init__(
        self,
        name: str | None = None,
        *,
        hugetable: str | None = None,
        parts: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if (name is None) == (hugetable is None):
            raise InvalidArgument("give a table's name, or hugetable= and parts=")
        if hugetable is not None and (parts is None or parts < 1):
            raise InvalidArgument("a HugeTable source needs parts= (its number of chunks)")
        self._projection_map = None if columns is None else {c: c for c in columns}
        self._schema, self._parts = self._plan(name, hugetable, parts)
        self._label = name or f"hugetable {hugetable}"

    @staticmethod
    def _plan(name: str | None, huge: str | None, parts: int | None) -> tuple[pa.Schema, list[_Part]]:
        client = store.client()
        if huge is not None:
            assert parts is not None
            tables = client.get([hugetable.chunk_id(huge, i) for i in range(parts)], 0)
            missing = [i for i, t in enumerate(tables) if t is None]
            if missing:
                raise ObjectNotFound(f"HugeTable {huge!r}: chunks {missing} of {parts} not found")
            planned = [
                _Part(hugetable.chunk_id(huge, i), None, t.num_rows, t.nbytes, None)
                for i, t in enumerate(tables)
            ]
            return tables[0].schema, planned
        assert name is not None
        buffer = client.get_named_buffer(name)
        if chunked.is_manifest(bytes(buffer.metadata())):
            manifest = chunked.read(buffer)
            return manifest.schema, [_Part(c.id, None, c.rows, c.nbytes, c.node) for c in manifest.chunks]
        metadata = bytes(buffer.metadata())
        if not metadata.startswith(_codec.TAG_ARROW):
            raise InvalidArgument(f"{name!r} is neither an Arrow table put with a name nor a chunked table")
        table = _as_table(_codec.decode(buffer, metadata))
        oid = ObjectID(buffer.id)
        batches = table.to_batches()
        return table.schema, [_Part(oid, i, b.num_rows, b.nbytes, None) for i, b in enumerate(batches)]

    # -- Ray Data's Datasource ------------------------------------------------------------------

    def get_name(self) -> str:
        return "Shoal"

    def supports_projection_pushdown(self) -> bool:
        return True

    @property
    def schema(self) -> pa.Schema:
        """The schema of what the source yields (after its projection)."""
        columns = self._get_data_columns()
        if columns is None:
            return self._schema
        return pa.schema([self._schema.field(c) for c in columns])

    def _fraction(self) -> float:
        """The share of each part's bytes the projection reads."""
        columns = self._get_data_columns()
        if columns is None or not self._parts:
            return 1.0
        return len(columns) / max(1, len(self._schema))

    def estimate_inmemory_data_size(self) -> int:
        return int(sum(p.nbytes for p in self._parts) * self._fraction())

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: DataContext | None = None,
    ) -> list[ReadTask]:
        columns = self._get_data_columns()
        fraction = self._fraction()
        schema = self.schema
        tasks = []
        for part in self._parts:
            metadata = BlockMetadata(
                num_rows=part.rows,
                size_bytes=int(part.nbytes * fraction),
                input_files=None,
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    lambda part=part: _read(part, columns),
                    metadata,
                    schema=schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks

    def __repr__(self) -> str:
        return f"ShoalDatasource({self._label!r}, {len(self._parts)} parts)"


def read(
    name: str | None = None,
    *,
    hugetable: str | None = None,
    parts: int | None = None,
    columns: Sequence[str] | None = None,
    **options: Any,
) -> Any:
    """`ray.data.read_datasource` of a table of the store (`ShoalDatasource`'s arguments), one
    block per chunk: a chunk is in memory already, and Ray Data would otherwise split each
    read into pieces to reach its 200 blocks, which keeps the read from fusing with the next
    step and sends every piece through plasma (6.5x slower in bench/ray/). `options` go to
    `read_datasource` (an `override_num_blocks` given there wins)."""
    source = ShoalDatasource(name, hugetable=hugetable, parts=parts, columns=columns)
    options.setdefault("override_num_blocks", max(1, len(source._parts)))
    return ray.data.read_datasource(source, **options)
