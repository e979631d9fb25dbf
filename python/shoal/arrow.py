"""Zero-copy creation of Arrow tables: columns laid out directly in store memory.

`TableBuilder` reserves one store object shaped exactly like the Arrow IPC stream of a
table with the given schema and row count, writes the stream's metadata (schema and
record batch headers, a few hundred bytes), and hands out numpy views of each column's
body buffer *inside the object*. Fill them in place and seal: `client.get(oid)` then
returns a `pyarrow.Table` whose buffers are those same bytes. The column data is written
once, by you, where it will be read; nothing is serialised or copied.

How the layout is found without writing the body: pyarrow's IPC writer is run over
dummy columns whose buffers are one anonymous, never-touched mapping (the kernel's
zero page: no memory is allocated), into a sink that records where each write would
land. Metadata writes are kept; body writes — recognised by their address inside the
dummy mapping — only advance the position. The recorded metadata is then copied into
the new object, and the body positions become the column views. The format is exactly
what pyarrow writes, so any Arrow reader opens the object.

Columns must be fixed-width and non-null: integers, floats (incl. float16), bool
(a bit-packed uint8 view), timestamps, durations, dates, times, decimals and
fixed-size binary (an (n, width) uint8 view). Variable-length columns (strings, lists)
need their sizes before the layout exists; build those with `client.put`.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from shoal import _codec
from shoal._ids import IdLike, ObjectID, as_bytes
from shoal.errors import InvalidArgument

if TYPE_CHECKING:
    from shoal._internal import Buffer
    from shoal._store import ObjectStore


def _column_view(buffer: Buffer, offset: int, field: pa.Field, num_rows: int) -> np.ndarray:
    """A writable numpy view of one column's body buffer in the object."""
    kind = field.type
    if pa.types.is_boolean(kind):
        return np.frombuffer(buffer, np.uint8, (num_rows + 7) // 8, offset)
    width = kind.byte_width
    if pa.types.is_timestamp(kind):
        dtype = np.dtype(f"datetime64[{kind.unit}]")
    elif pa.types.is_duration(kind):
        dtype = np.dtype(f"timedelta64[{kind.unit}]")
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        dtype = np.dtype(kind.to_pandas_dtype())
    elif pa.types.is_date(kind) or pa.types.is_time(kind):
        dtype = np.dtype(f"int{width * 8}")  # days / ms / s / us / ns since the epoch or midnight
    else:  # decimals, fixed-size binary: one row of bytes per value
        return np.frombuffer(buffer, np.uint8, num_rows * width, offset).reshape(num_rows, width)
    return np.frombuffer(buffer, dtype, num_rows, offset)


def _check_schema(schema: pa.Schema) -> None:
    for field in schema:
        kind = field.type
        fixed = pa.types.is_boolean(kind) or (
            not pa.types.is_dictionary(kind)
            and not pa.types.is_nested(kind)
            and isinstance(kind, pa.DataType)
            and _has_fixed_width(kind)
        )
        if not fixed:
            raise InvalidArgument(
                f"column {field.name!r} has type {kind}: TableBuilder lays out fixed-width "
                "columns only (use client.put for strings, lists and dictionaries)"
            )


def _has_fixed_width(kind: pa.DataType) -> bool:
    try:
        return kind.bit_width >= 8 and kind.num_buffers == 2
    except ValueError:
        return False


class _LayoutSink:
    """A write-only file for pyarrow that records metadata and skips the dummy body."""

    def __init__(self, dummy_start: int, dummy_end: int) -> None:
        self.position = 0
        self.metadata: list[tuple[int, bytes]] = []
        self.body: list[tuple[int, int]] = []
        self._dummy = (dummy_start, dummy_end)
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        size = view.nbytes
        address = pa.py_buffer(data).address if isinstance(data, pa.Buffer) else -1
        if self._dummy[0] <= address < self._dummy[1] or (isinstance(data, pa.Buffer) and size == 0):
            self.body.append((self.position, size))
        elif size:
            self.metadata.append((self.position, bytes(view)))
        self.position += size
        return size

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _layout(schema: pa.Schema, num_rows: int) -> _LayoutSink:
    widths = [
        (num_rows + 7) // 8 if pa.types.is_boolean(f.type) else num_rows * f.type.byte_width for f in schema
    ]
    zeros = mmap.mmap(-1, max([1, *widths]))  # anonymous and never written: the zero page
    dummy = pa.py_buffer(zeros)
    columns = [
        pa.Array.from_buffers(field.type, num_rows, [None, dummy.slice(0, width)])
        for field, width in zip(schema, widths, strict=True)
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    sink = _LayoutSink(dummy.address, dummy.address + dummy.size)
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema) as writer:
        writer.write_batch(batch)
    del batch, columns, dummy
    zeros.close()
    if num_rows == 0:  # empty bodies are not written at all: nothing to locate
        sink.body = [(sink.position, 0)] * len(schema)
    if len(sink.body) != len(schema):
        raise InvalidArgument(
            f"unexpected IPC layout: {len(sink.body)} body buffers for {len(schema)} columns"
        )
    return sink


class TableBuilder:
    """An Arrow table being built in store memory. Use `client.create_table(...)`.

        with client.create_table(schema, num_rows) as builder:
            builder["x"][:] = np.arange(num_rows)   # writes straight into the store
            builder["y"][:] = 0.5
        table = client.get(builder.id)               # the same memory, as a pyarrow.Table

    Leaving the `with` block seals the object (or aborts it if the block raised).
    """

    def __init__(
        self,
        client: ObjectStore,
        schema: pa.Schema,
        num_rows: int,
        oid: IdLike | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
            raise InvalidArgument(f"num_rows must be a non-negative int, got {num_rows!r}")
        _check_schema(schema)
        self.schema = schema
        self.num_rows = num_rows
        layout = _layout(schema, num_rows)
        self._client = client
        metadata = _codec.TAG_ARROW + b"table"
        self._buffer: Buffer | None
        if oid is None:
            self.id, self._buffer = client.create_fresh(layout.position, metadata, timeout_ms, node=node)
        else:
            self.id = ObjectID(as_bytes(oid))
            self._buffer = client.create(self.id, layout.position, metadata, timeout_ms, node=node)
        whole = memoryview(self._buffer)
        for position, data in layout.metadata:
            whole[position : position + len(data)] = data
        self._columns = {
            field.name: _column_view(self._buffer, position, field, num_rows)
            for field, (position, _) in zip(schema, layout.body, strict=True)
        }
        self._by_index = [self._columns[f.name] for f in schema]
        self._done = False

    @property
    def nbytes(self) -> int:
        """Size of the object (IPC stream: metadata and column bodies)."""
        return 0 if self._buffer is None else len(self._buffer)

    def column(self, key: str | int) -> np.ndarray:
        """The writable numpy view of a column (by name or position)."""
        if self._done:
            raise InvalidArgument("the table is sealed or aborted; its columns are read-only now")
        return self._by_index[key] if isinstance(key, int) else self._columns[key]

    __getitem__ = column

    def seal(self) -> ObjectID:
        """Seals the table; afterwards `client.get(id)` returns it. The builder's views go."""
        self._finish()
        # Without release: column views the caller kept still reference the object (the
        # creator reference goes with the last of them), so it cannot be evicted under them.
        self._client.seal(self.id)
        return self.id

    def abort(self) -> None:
        """Drops the unsealed table; its memory is free at once."""
        self._finish()
        self._client.abort(self.id)

    def _finish(self) -> None:
        if self._done:
            raise InvalidArgument(f"table {self.id.hex()} was already sealed or aborted")
        self._done = True
        # Views would outlive the creator's reference; drop ours (user copies keep theirs).
        self._columns.clear()
        self._by_index.clear()
        self._buffer = None

    def __enter__(self) -> TableBuilder:
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        if self._done:
            return
        if kind is None:
            self.seal()
        else:
            self.abort()

    def __repr__(self) -> str:
        state = "done" if self._done else "open"
        return f"shoal.TableBuilder(id={self.id.hex()}, rows={self.num_rows}, {state})"
