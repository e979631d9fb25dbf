"""A Python value laid out in one store object: its pickle (protocol 5) stream first, then
each out-of-band buffer at a 64-byte boundary. Shared by shoal.dask (a worker's large
values) and shoal.ray (`shoal.ray.put` of anything that is not an Arrow or numpy value).

The object's metadata says where each part lies. Reading it back is `pickle.loads` of
the stream with the buffers passed as views of the object: numpy arrays, Arrow buffers
and pandas blocks come back pointing into store memory, and only the stream (dtypes,
column names, small in-band values; a few kB) is parsed.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shoal import _internal
from shoal._store import write_object

if TYPE_CHECKING:
    from shoal._ids import ObjectID
    from shoal._store import ObjectStore

#: The metadata of an object holding a value laid out here starts with this (the name
#: dates from shoal.dask, its first user; objects already written carry it).
TAG = b"shoal/dask-pickle5;"
#: Buffers start at multiples of this (a cache line; what Arrow asks of its buffers).
ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Pickled:
    """A value pickled with its large buffers kept out of band (not copied yet)."""

    stream: bytes
    buffers: list[memoryview]

    @property
    def out_of_band(self) -> int:
        """Bytes of the buffers (what a rebuilt value reads in place)."""
        return sum(b.nbytes for b in self.buffers)

    def offsets(self) -> list[int]:
        """Where each buffer starts in the object."""
        offsets, at = [], _aligned(len(self.stream))
        for b in self.buffers:
            offsets.append(at)
            at = _aligned(at + b.nbytes)
        return offsets

    @property
    def size(self) -> int:
        """The object's size: the stream, then every buffer aligned."""
        at = _aligned(len(self.stream))
        for b in self.buffers:
            at = _aligned(at + b.nbytes)
        return at

    def metadata(self) -> bytes:
        parts = [[o, b.nbytes] for o, b in zip(self.offsets(), self.buffers, strict=True)]
        return TAG + json.dumps({"stream": len(self.stream), "buffers": parts}).encode()

    def write_into(self, buffer: Any) -> None:
        """Copies the stream and the buffers into a writable object of `size` bytes."""
        target = memoryview(buffer).cast("B")
        _internal.copy_into(target[: len(self.stream)], self.stream)
        for offset, b in zip(self.offsets(), self.buffers, strict=True):
            if b.nbytes:
                _internal.copy_into(target[offset : offset + b.nbytes], b)


def pickle_value(value: Any) -> Pickled:
    """Pickles `value` (protocol 5) keeping its buffers out of band, as flat byte views.
    Raises what pickling raises, and BufferError for a buffer that is not contiguous."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return Pickled(stream, [b.raw() for b in buffers])


@dataclass(frozen=True)
class Part:
    """A value whose large buffers lie inside another value's object (a column projection
    or a contiguous slice of a stored frame, which pandas' copy-on-write makes of views): its own
    pickle stream and, per out-of-band buffer, where it lies in that object (offset,
    length) or, for a small buffer of its own (a new column index), its bytes."""

    stream: bytes
    pieces: tuple[tuple[int, int] | bytes, ...]

    @property
    def inside(self) -> int:
        """Bytes of the value that lie in the object."""
        return sum(p[1] for p in self.pieces if isinstance(p, tuple))


def part_of(pickled: Pickled, buffer: Any, inline_limit: int) -> Part | None:
    """`pickled` as a part of object `buffer` (its large buffers all inside it, and at most
    `inline_limit` bytes of small buffers elsewhere, which the part carries), or None."""
    start = buffer.address
    end = start + len(buffer)
    pieces: list[tuple[int, int] | bytes] = []
    inline = 0
    for b in pickled.buffers:
        at = address(b)
        if b.nbytes and start <= at and at + b.nbytes <= end:
            pieces.append((at - start, b.nbytes))
            continue
        inline += b.nbytes
        if inline > inline_limit:
            return None
        pieces.append(bytes(b))
    return Part(pickled.stream, tuple(pieces))


def read_part(buffer: Any, part: Part) -> Any:
    """The value `part` describes, its large buffers views of object `buffer`."""
    whole = memoryview(buffer)
    buffers = [p if isinstance(p, bytes) else whole[p[0] : p[0] + p[1]] for p in part.pieces]
    return pickle.loads(part.stream, buffers=buffers)


def address(buffer: memoryview) -> int:
    """Where a flat byte view's first byte lies in this process."""
    return int(np.frombuffer(buffer, np.uint8).ctypes.data) if buffer.nbytes else 0


def is_layout(metadata: bytes) -> bool:
    return metadata.startswith(TAG)


def read(buffer: Any) -> Any:
    """The value laid out in object `buffer` (a sealed store buffer), its buffers views of
    the object: nothing large is copied."""
    layout = json.loads(bytes(buffer.metadata())[len(TAG) :])
    whole = memoryview(buffer)
    buffers = [whole[offset : offset + n] for offset, n in layout["buffers"]]
    return pickle.loads(whole[: layout["stream"]], buffers=buffers)


def store(
    client: ObjectStore,
    pickled: Pickled,
    oid: ObjectID | None = None,
    *,
    name: str | None = None,
    durability: str | None = None,
    timeout_ms: int = 0,
) -> ObjectID:
    """Writes `pickled` into a new object (id `oid`, default a fresh one; create → write →
    name → seal, releasing this process's reference) and returns its id. The create waits
    up to `timeout_ms` for memory on a full store. Raises what the store raises
    (StoreFull, ...); a failed write aborts the object."""
    return write_object(
        client,
        pickled.size,
        pickled.metadata(),
        pickled.write_into,
        oid,
        name=name,
        durability=durability,
        timeout_ms=timeout_ms,
    )
