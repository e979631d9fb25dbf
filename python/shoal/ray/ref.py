"""`ShoalRef`, `put` and `get`: values in the store, references through Ray.

`put(value)` writes the value into this node's store once and returns a `ShoalRef`: the
object's id, size and node (and its name when it outlives the job), a few dozen bytes
pickled, which Ray inlines in task arguments and results so plasma never sees the data.
`get(ref)` in any process of the Ray cluster maps the object: on the same host the value's
buffers are the store's pages (no copy); on another host of a shoal cluster the client
reads the owner's memory mapped or pulls it over shoal's network path.

Arrow values (Table, RecordBatch, Array, ChunkedArray) are stored as Arrow IPC and numpy
arrays as their bytes (what `Client.put` writes, readable by any shoal client, the mount
and any Arrow reader); anything else as a pickle-5 stream with its out-of-band buffers
(shoal.layout: pandas frames, dicts of arrays come back over store memory too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shoal import _codec, layout
from shoal._ids import IdLike, ObjectID, as_bytes
from shoal.client import DURABILITY_LEVELS
from shoal.errors import HomeUnavailable, InvalidArgument, ObjectNotFound
from shoal.ray import janitor, store

_DIRECT = (pa.Table, pa.RecordBatch, pa.Array, pa.ChunkedArray, np.ndarray)
_FRESH_ID_TRIES = 32


@dataclass(frozen=True, slots=True)
class ShoalRef:
    """A value in a shoal store, as Ray passes it around: small and plain."""

    #: The object's 20-byte id.
    id: bytes
    #: Bytes of the object.
    size: int
    #: The shoal node whose memory holds it (None: not known, e.g. a ref made from a name).
    node: int | None
    #: Its name when it outlives the job (`put(..., durability=...)`), else None: a job's
    #: own objects are found by id.
    name: str | None = None

    @property
    def oid(self) -> ObjectID:
        return ObjectID(self.id)

    def __reduce__(self) -> tuple[Any, ...]:
        # A bare tuple: no field names in the pickle (what Ray ships per argument).
        return (ShoalRef, (self.id, self.size, self.node, self.name))

    def __repr__(self) -> str:
        named = f", name={self.name!r}" if self.name else ""
        return f"ShoalRef({self.id.hex()}, size={self.size}, node={self.node}{named})"


def put(value: Any, *, durability: str | None = None, name: str | None = None) -> ShoalRef:
    """Stores `value` in this Ray node's store and returns its reference.

    Without `durability` the object belongs to the job: named under it and deleted when
    the job ends. With `durability` ("memory", "local", "backing": when the seal returns,
    docs/tiers.md) it outlives the job and the driver: named `name` if given, else
    `ray/<session>/<job>/durable/<id>`; delete it with `delete`. `name` alone is refused:
    a name outside the job's directory would outlive the job."""
    _check(durability, name)
    scope = store.scope()
    client = store.client()
    janitor.watch(scope)
    durable = durability is not None
    pickled = None if isinstance(value, _DIRECT) else layout.pickle_value(value)
    # The id is chosen here so the generated name can carry it; in a cluster an id whose
    # home node is down is swapped for another (as Client.create_fresh does).
    for attempt in range(_FRESH_ID_TRIES):
        oid = ObjectID.from_random()
        target = name or scope.name(oid.hex(), durable=durable)
        try:
            if pickled is None:
                client.put(value, oid, durability=durability, name=target)
                size = len(client.get_buffer(oid, 0))
            else:
                layout.store(client, pickled, oid, name=target, durability=durability)
                size = pickled.size
            return ShoalRef(oid.binary(), size, client.node, target if durable else None)
        except HomeUnavailable:
            if attempt == _FRESH_ID_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _check(durability: str | None, name: str | None) -> None:
    if durability is not None and durability not in DURABILITY_LEVELS:
        raise InvalidArgument(f"durability must be one of {DURABILITY_LEVELS}, got {durability!r}")
    if name is not None and durability is None:
        raise InvalidArgument("name= is for objects that outlive the job: give durability= too")


def share(oid: IdLike, *, durability: str | None = None, name: str | None = None) -> ShoalRef:
    """The reference to an object this process sealed in its node's memory, e.g. a table
    built in place with `client.create_table` (the producer then copies nothing): named as
    `put` names its objects, so it goes with the job unless `durability` is given (then
    this waits until the object is durable at that level, for "local" and "backing")."""
    _check(durability, name)
    scope = store.scope()
    client = store.client()
    janitor.watch(scope)
    oid = ObjectID(as_bytes(oid))
    durable = durability is not None
    target = name or scope.name(oid.hex(), durable=durable)
    client.name(oid, target)
    if durability in ("local", "backing"):
        client.wait_durable(oid, durability)
    size = len(client.get_buffer(oid, 0))
    return ShoalRef(oid.binary(), size, client.node, target if durable else None)


def get(ref: ShoalRef | Iterable[ShoalRef], timeout: float = 0) -> Any:
    """The value of `ref` (or a list, for several refs) over store memory: Arrow buffers and
    numpy arrays are views of the object, read-only. Waits up to `timeout` seconds for an
    object not sealed yet; raises ObjectNotFound for one that is gone (deleted, or its job
    ended)."""
    if isinstance(ref, ShoalRef):
        return _value(ref, timeout)
    return [_value(r, timeout) for r in ref]


def _value(ref: ShoalRef, timeout: float) -> Any:
    client = store.client()
    try:
        buffer = client.get_buffer(ref.id, int(timeout * 1000))
    except ObjectNotFound:
        where = f" (name {ref.name!r})" if ref.name else ""
        raise ObjectNotFound(
            f"shoal object {ref.id.hex()}{where} is gone: deleted, evicted, or its job ended"
        ) from None
    metadata = bytes(buffer.metadata())
    if layout.is_layout(metadata):
        return layout.read(buffer)
    return _codec.decode(buffer, metadata)


def ref(name: str) -> ShoalRef:
    """The reference to the object named `name` (e.g. one a killed driver put with
    durability): any process reads it with `get`. Raises ObjectNotFound."""
    info = store.client().stat(name)
    return ShoalRef(info.id.binary(), info.size, None, name)


def delete(refs: ShoalRef | Iterable[ShoalRef]) -> None:
    """Deletes objects now (readers holding them keep them until they let go)."""
    client = store.client()
    for r in [refs] if isinstance(refs, ShoalRef) else list(refs):
        try:
            client.delete(r.id)
        except ObjectNotFound:
            pass
