"""The shoal client: Plasma's operations, Arrow-native values, no copies."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal import _codec, _internal, _sync, chunked, errors, hugetable
from shoal._ids import IdLike, ObjectID, as_bytes
from shoal.arrow import TableBuilder
from shoal.errors import HomeUnavailable, InvalidArgument, NodeUnavailable, ObjectNotFound

Buffer = _internal.Buffer


@dataclass(frozen=True)
class ObjectInfo:
    """One row of `Client.list()`."""

    id: ObjectID
    data_size: int
    metadata_size: int
    sealed: bool
    ref_count: int
    #: The bytes are in memory (False: only on a tier below, restored by a get).
    resident: bool = True
    #: Tiers holding a durable copy: "burst", "backing".
    tiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class NameInfo:
    """One row of `Client.ls()`: a named object, as a file of the POSIX view."""

    name: str
    id: ObjectID
    #: Bytes of data (the file's size).
    size: int
    metadata_size: int
    #: When the name was bound to this object (its seal), seconds since the epoch.
    mtime: float


def _name_info(row: tuple[str, bytes, int, int, int]) -> NameInfo:
    name, oid, size, meta, mtime_ms = row
    return NameInfo(name, ObjectID(oid), size, meta, mtime_ms / 1000)


#: An Arrow IPC *file* (not stream) starts with these bytes.
_ARROW_FILE_MAGIC = b"ARROW1"


def get_batch(raw: Any, ids: list[bytes], timeout_ms: int) -> list[Any]:
    """A batch get: `None` for each object still missing at the timeout. (A daemon answers a
    get of one id that an unreachable node kept from being found with NodeUnavailable, which
    a single-object `get` raises; in a batch that id is missing like any other.)"""
    try:
        return raw.get(ids, timeout_ms)
    except NodeUnavailable:
        if len(ids) == 1:
            return [None]
        raise


# Fresh ids tried by a create that chooses its own id before giving up: with one node of n
# unreachable each try fails with probability 1/n, so 32 tries fail together with 3^-32 at n=3.
_FRESH_ID_TRIES = 32

#: Durability levels: when a seal is acknowledged (docs/tiers.md).
DURABILITY_LEVELS = ("memory", "local", "backing")


def _tier_names(bits: int) -> tuple[str, ...]:
    return tuple(name for bit, name in ((1, "burst"), (2, "backing")) if bits & bit)


def _delete_failed(oid: IdLike, kind: str | None) -> None:
    """Raises the error of a delete that failed (`kind` not None)."""
    if kind is not None:
        raise getattr(errors, kind)(f"cannot delete object {oid.hex()}: {kind}")


def _raise_first(ids: Sequence[IdLike], kinds: list[str | None], what: str) -> None:
    """Raises the first per-id error of a batch (every id was tried)."""
    for oid, kind in zip(ids, kinds, strict=True):
        if kind is not None:
            raise getattr(errors, kind)(f"{what} of object {as_bytes(oid).hex()}: {kind}")


# isinstance against these tuples, made once: a union written in the call (`list | tuple`)
# builds a new object every time, ~0.3 µs of a single-object call.
_ONE_ID = (ObjectID, bytes)
_SEQUENCE = (list, tuple)


def _ids(ids: IdLike | Iterable[IdLike]) -> Sequence[IdLike]:
    """A sequence of ids; the extension reads each ObjectID's bytes itself (and raises
    TypeError for anything that is not an id), so a batch costs no Python-level loop."""
    if isinstance(ids, _ONE_ID):
        return [ids]
    if isinstance(ids, _SEQUENCE):
        return ids
    try:
        return list(ids)
    except TypeError:
        raise TypeError(f"expected an ObjectID or 20 bytes, or an iterable of them, got {ids!r}") from None


def _checked_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    """Every dimension a non-negative integer, checked before anything is created."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    try:
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"shape must be integers, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"negative dimension in shape {dims}")
    return dims


class Client:
    """A connection to one shoal daemon. Thread-safe.

    Buffers returned by `get_buffers` and `create` are views of store memory;
    the object stays referenced (never evicted or freed) until every view of
    it is garbage.
    """

    def __init__(self, socket: str, *, fast_path: bool = True) -> None:
        """Connects to the daemon at `socket`. `fast_path=False` sends every get and release
        through the socket (as before the fast path: slower, e.g. to compare, or to see every
        reference in the daemon's books as it is taken); `SHOAL_FAST_READS=0` does the same."""
        self._raw = _internal.Client(socket, fast_path)

    # -- low level: Plasma's life cycle ---------------------------------------------------------

    def create(
        self,
        oid: IdLike,
        size: int,
        metadata: bytes | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> Buffer:
        """Creates an object of `size` bytes; returns its writable buffer. Seal when written.

        On a full store, waits up to `timeout_ms` for memory to be released. In a cluster,
        `node` places the object in that node's memory (remote allocation: only that node's
        allocator runs). Where that memory is mapped here this process writes the bytes in
        place; on a node reached over the network it writes a staging buffer in its own
        node's memory, and the seal pushes the bytes to `node` (NodeUnavailable if it cannot).
        """
        return self._raw.create(as_bytes(oid), size, metadata, timeout_ms, node)

    def create_fresh(
        self,
        size: int,
        metadata: bytes | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> tuple[ObjectID, Buffer]:
        """Creates an object under a new random id; returns the id and its writable buffer.

        In a cluster an id's home node keeps its directory entry; an id whose home cannot
        be reached (`HomeUnavailable`) is swapped for another, so the create never depends
        on a node that will hold nothing of the object. `put` without an id uses this."""
        for attempt in range(_FRESH_ID_TRIES):
            oid = ObjectID.from_random()
            try:
                return oid, self._raw.create(oid.binary(), size, metadata, timeout_ms, node)
            except HomeUnavailable:
                if attempt == _FRESH_ID_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def seal(
        self, oids: IdLike | Iterable[IdLike], release: bool = False, *, durability: str | None = None
    ) -> None:
        """Seals objects created by this client; they are immutable and visible from now on.

        `durability` ("memory", "local", "backing"; default: the node's) says when the seal
        returns: once the objects are in memory, fsync'ed on the burst buffer, or in the
        backing store."""
        self._raw.seal(_ids(oids), release, durability)

    def wait_durable(
        self, oids: IdLike | Iterable[IdLike], level: str = "local", timeout: float | None = None
    ) -> None:
        """Waits until every object has a durable copy at `level` ("local": on the burst
        buffer or below; "backing": in the backing store), for objects sealed at a lower one.
        Raises Timeout after `timeout` seconds, or the error that keeps an object from
        getting there (StoreFull, ObjectNotFound, ...)."""
        ids = _ids(oids)
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        _raise_first(ids, self._raw.wait_durable(ids, level, timeout_ms), f"durability {level}")

    def stage_in(self, oids: IdLike | Iterable[IdLike]) -> None:
        """Brings objects into memory from the tiers below (a get that follows is a lookup)."""
        ids = _ids(oids)
        _raise_first(ids, self._raw.stage_in(ids), "stage-in")

    def stage_out(self, oids: IdLike | Iterable[IdLike]) -> None:
        """Writes objects down to the lowest tier and frees their memory (unless referenced:
        ObjectInUse). They stay gettable: a get restores them."""
        ids = _ids(oids)
        _raise_first(ids, self._raw.stage_out(ids), "stage-out")

    def tiers(self) -> dict[str, Any]:
        """The node's tiers below memory ({"burst": {...}, "backing": {...}}), their use and
        the drain's progress (queue_depth, drain_rate, spilled_bytes, restores, ...)."""
        return self._raw.tiers()

    def controller(self, trace_since: float | None = None) -> dict[str, Any]:
        """The elastic capacity controller's state (`shoal serve --elastic`): its target and
        the store's capacity, the node's memory (node_used of node_total, ratio against
        threshold r_0), the last step, steps taken, bytes given back to the kernel and its CPU.
        `enabled` is False for a static store. With `trace_since` (seconds of the daemon's
        life; 0 for all it keeps), also "trace": a pyarrow.Table of the capacity over time
        (time_s, target, capacity, store_used, node_used, node_total, ratio)."""
        state = self._raw.controller(trace_since)
        rows = state.pop("trace")
        if trace_since is not None:
            import pyarrow as pa

            sizes = ("target", "capacity", "store_used", "node_used", "node_total")
            fields = [("time_s", pa.float64()), *((n, pa.uint64()) for n in sizes), ("ratio", pa.float64())]
            state["trace"] = pa.table(
                {name: pa.array([row[i] for row in rows], type=t) for i, (name, t) in enumerate(fields)}
            )
        return state

    def abort(self, oid: IdLike) -> None:
        """Drops an object this client created and has not sealed."""
        self._raw.abort(as_bytes(oid))

    def get_buffers(self, oids: Sequence[IdLike], timeout_ms: int = -1) -> list[Buffer | None]:
        """Gets objects in one request, waiting up to `timeout_ms` (-1: forever) for unsealed
        ones; `None` where an object is still missing. Buffers are read-only store memory;
        `buffer.metadata()` is the object's metadata."""
        return get_batch(self._raw, _ids(oids), timeout_ms)

    def get_buffer(self, oid: IdLike, timeout_ms: int = -1) -> Buffer:
        """One object's buffer; raises ObjectNotFound if it is not sealed within the timeout."""
        buffer = self._raw.get([as_bytes(oid)], timeout_ms)[0]
        if buffer is None:
            raise ObjectNotFound(f"object {as_bytes(oid).hex()} not found within {timeout_ms} ms")
        return buffer

    def delete(self, oids: IdLike | Iterable[IdLike]) -> None:
        """Deletes sealed objects (a referenced one is freed when released).

        Raises the first error (e.g. ObjectNotFound) after deleting every other id."""
        if isinstance(oids, _ONE_ID):
            # One id, the common call: no list or loop around the round trip.
            (kind,) = self._raw.delete(oids)
            _delete_failed(oids, kind)
            return
        ids = _ids(oids)
        for oid, kind in zip(ids, self._raw.delete(ids), strict=True):
            _delete_failed(oid, kind)

    def contains(self, oid: IdLike) -> bool:
        return self._raw.contains(as_bytes(oid))

    def list(self) -> list[ObjectInfo]:
        return [
            ObjectInfo(ObjectID(i), d, m, s, r, resident, _tier_names(bits))
            for (i, d, m, s, r, resident, bits) in self._raw.list()
        ]

    def stats(self) -> dict[str, Any]:
        """capacity, used, objects, sealed, referenced, evictable, clients, evictions, ..."""
        return self._raw.stats()

    def evict(self, nbytes: int) -> int:
        """Evicts unreferenced objects (cooled ones first, then the policy's order, LRU by
        default) until `nbytes` are freed; returns bytes freed."""
        return self._raw.evict(nbytes)

    def cool(self, oids: IdLike | Iterable[IdLike]) -> None:
        """Says this process is done reading objects for now (a scan went past them): once
        unreferenced, each leaves memory before any object the eviction policy orders, the
        most recently cooled first, until it is read again. A hint, as madvise(MADV_COLD):
        nothing is evicted because of it alone; on a store with tiers an evicted object
        comes back by id. Raises ObjectNotFound for the first id not sealed in this node's
        memory (the others are cooled)."""
        ids = _ids(oids)
        _raise_first(ids, self._raw.cool(ids), "cooling")

    # -- batches --------------------------------------------------------------------------------

    def put_batch(
        self,
        oids: Sequence[IdLike],
        buffers: Sequence[Any],
        metadata: Sequence[bytes] | None = None,
        timeout_ms: int = 0,
        *,
        durability: str | None = None,
    ) -> None:
        """Stores many byte buffers in two round trips (create all, copy, seal all)."""
        views = [b if isinstance(b, bytes) else memoryview(b).cast("B") for b in buffers]
        meta = None if metadata is None else list(metadata)
        self._raw.put_batch(_ids(oids), views, meta, timeout_ms, durability)

    # -- values ---------------------------------------------------------------------------------

    def put(
        self,
        value: Any,
        oid: IdLike | None = None,
        *,
        timeout_ms: int = 0,
        node: int | None = None,
        durability: str | None = None,
        name: str | None = None,
    ) -> ObjectID:
        """Stores a value: a pyarrow Table / RecordBatch / Array / ChunkedArray (Arrow IPC),
        a numpy array, bytes-like data, or any picklable object. Returns its id. In a cluster,
        `node` stores it in that node's memory (see `create`; over the network: one local
        write and one transfer). `durability` as for `seal`.

        With `name` (path-like: ``"runs/1/table.arrow"``) the object is also reachable by
        `get_named` and appears as a file under `shoal mount`; a name already in use moves
        to the new object at its seal and the old object is deleted."""
        size, metadata, write = _codec.encode(value)
        if oid is None:
            oid, buffer = self.create_fresh(size, metadata, timeout_ms, node=node)
        else:
            oid = ObjectID(as_bytes(oid))
            buffer = self._raw.create(oid.binary(), size, metadata, timeout_ms, node)
        try:
            write(buffer)
            if name is not None:
                self.name(oid, name)
        except BaseException:
            self._raw.abort(oid.binary())
            raise
        self._raw.seal([oid.binary()], True, durability)
        return oid

    def name(self, oid: IdLike, name: str) -> None:
        """Names object `oid` (path-like, see `put`; docs/posix.md). An object still being
        written gets the name at its seal; the object the name leaves is deleted."""
        self._raw.name(as_bytes(oid), name)

    def get(self, oid: IdLike | Sequence[IdLike], timeout_ms: int = -1) -> Any:
        """Reads back values stored with `put`, as views of store memory (no copy).

        A single id returns one value and raises ObjectNotFound on timeout; a list returns
        a list with None for objects still missing."""
        if isinstance(oid, ObjectID | bytes):
            buffer = self.get_buffer(oid, timeout_ms)
            return _codec.decode(buffer, bytes(buffer.metadata()))
        buffers = self.get_buffers(oid, timeout_ms)
        return [None if b is None else _codec.decode(b, bytes(b.metadata())) for b in buffers]

    def get_named(self, name: str, timeout_ms: int = 0) -> Any:
        """The value stored under `name`, as a view of store memory (no copy).

        Values `put` with a name come back as they were put. A file written through
        `shoal mount` has no codec metadata: an Arrow IPC file comes back as a pyarrow.Table
        over store memory, anything else as a pyarrow.Buffer. A chunked table (shoal.chunked,
        e.g. written by Ray Data's `shoal.ray.ShoalDatasink`) comes back as one
        pyarrow.Table over its chunks' memory. Raises ObjectNotFound."""
        buffer = self.get_named_buffer(name, timeout_ms)
        metadata = bytes(buffer.metadata())
        if chunked.is_manifest(metadata):
            return chunked.assemble(self, chunked.read(buffer))
        if not metadata and bytes(memoryview(buffer)[: len(_ARROW_FILE_MAGIC)]) == _ARROW_FILE_MAGIC:
            import pyarrow as pa

            return pa.ipc.open_file(pa.py_buffer(buffer)).read_all()
        return _codec.decode(buffer, metadata)

    def get_named_buffer(self, name: str, timeout_ms: int = 0) -> Buffer:
        """The raw buffer of the object stored under `name`; raises ObjectNotFound."""
        # A rewrite may replace the object between the lookup and the get: look again.
        for _ in range(8):
            oid = self._raw.resolve(name)[1]
            buffer = self._raw.get([oid], timeout_ms)[0]
            if buffer is not None:
                return buffer
        raise ObjectNotFound(f"name {name!r} kept moving to new objects")

    def stat(self, name: str) -> NameInfo:
        """The object bound to `name` (raises ObjectNotFound)."""
        return _name_info(self._raw.resolve(name))

    def ls(self, prefix: str = "") -> list[NameInfo]:
        """Every name under directory `prefix` ("" for all, recursively), sorted."""
        return [_name_info(row) for row in self._raw.list_names(prefix.strip("/"))]

    def rename(self, source: str, target: str) -> None:
        """Moves a name, or every name under directory `source`, to `target`."""
        self._raw.rename(source, target)

    def set_mtime(self, name: str, mtime: float) -> None:
        """Sets the modification time `name` shows (seconds since the epoch), as
        `os.utime` does on the mount; raises ObjectNotFound."""
        self._raw.set_mtime(name, round(mtime * 1000))

    def unlink(self, name: str) -> None:
        """Removes a name and deletes its object."""
        self._raw.unlink(name)

    def create_table(
        self,
        schema: Any,
        num_rows: int,
        oid: IdLike | None = None,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> TableBuilder:
        """Lays out an Arrow table of fixed-width columns directly in store memory (zero-copy
        creation): fill `builder["col"]` (numpy views) in place, then seal — `with` does it.
        `get(builder.id)` returns a pyarrow.Table over the same bytes. See shoal.arrow."""
        return TableBuilder(self, schema, num_rows, oid, timeout_ms, node=node)

    def create_array(
        self,
        oid: IdLike,
        shape: int | Sequence[int],
        dtype: Any = np.float64,
        timeout_ms: int = 0,
        *,
        node: int | None = None,
    ) -> np.ndarray:
        """Allocates a numpy array directly in store memory (zero-copy creation).

        Fill it in place, then `seal(oid)`; `get(oid)` returns an array over the same memory."""
        shape = _checked_shape(shape)
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        if size >= 1 << 63:
            raise InvalidArgument(f"an array of shape {shape} and dtype {dtype} overflows 64 bits")
        metadata = _codec.ndarray_metadata(shape, dtype)
        buffer = self._raw.create(as_bytes(oid), size, metadata, timeout_ms, node)
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)

    # -- cluster: HugeTables, barriers, flags (see shoal.hugetable, shoal._sync) -----------------

    def put_chunk(self, name: str, index: int, value: Any, *, node: int | None = None) -> ObjectID:
        """Stores chunk `index` of HugeTable `name` (in `node`'s memory, default this node's)."""
        return hugetable.put_chunk(self, name, index, value, node=node)

    def get_table(self, name: str, parts: int, timeout_ms: int = -1) -> Any:
        """Assembles HugeTable `name` (chunks 0..parts-1, wherever they live) with no copy."""
        return hugetable.get_table(self, name, parts, timeout_ms)

    def delete_table(self, name: str, parts: int) -> None:
        """Frees every chunk of HugeTable `name` on the node that holds it."""
        hugetable.delete_table(self, name, parts)

    def barrier(
        self,
        name: str,
        parties: int | Sequence[str],
        timeout: float | None = None,
        *,
        party: str | None = None,
    ) -> int:
        """Waits until every party of barrier `name` has arrived, across the nodes of a
        cluster; returns this arrival's slot.

        `parties` is a count, or the names of the parties (then `party` says which one this
        process is). After `timeout` seconds (None: forever) raises shoal.Timeout naming the
        parties that did not arrive. A barrier name is used once; add a round number to reuse
        it. Built on the store's ids alone, with no coordinator (shoal._sync)."""
        return _sync.barrier(self, name, parties, timeout, party=party)

    def set_flag(self, name: str, value: Any, *, node: int | None = None) -> None:
        """Sets flag `name` to a small JSON value, kept in `node`'s memory (default: this one)."""
        _sync.set_flag(self, name, value, node=node)

    def get_flag(self, name: str, *, node: int | None = None, default: Any = None) -> Any:
        """Flag `name`'s value on `node` (default: this one), or `default` if it is not set."""
        return _sync.get_flag(self, name, node=node, default=default)

    def wait_flag(
        self, name: str, value: Any, *, node: int | None = None, timeout: float | None = None
    ) -> None:
        """Waits until flag `name` on `node` equals `value`; shoal.Timeout after `timeout` s."""
        _sync.wait_flag(self, name, value, node=node, timeout=timeout)

    # -- misc -----------------------------------------------------------------------------------

    def subscribe(self) -> Subscription:
        """A stream of seal and removal notifications (a second connection)."""
        return Subscription(self._raw.socket)

    @property
    def socket(self) -> str:
        return self._raw.socket

    @property
    def capacity(self) -> int:
        return self.stats()["capacity"]

    @property
    def node(self) -> int:
        """This client's node in a cluster (0 for a single daemon)."""
        return self._raw.node

    @property
    def clustered(self) -> bool:
        """Whether the daemon is a node of a cluster."""
        return self._raw.clustered

    @property
    def cluster_identity(self) -> str | None:
        """The cluster's identity, `name=NAME token-sha256=HEX` (the cluster file's name and
        a digest of its token, never the token): equal for clients of any two nodes of one
        cluster, different for another cluster; None when the daemon is not a cluster node."""
        return self._raw.cluster_identity

    @property
    def peer_encryption(self) -> str | None:
        """How this client's node protects its traffic with the other nodes: e.g.
        `tls1.3, data channel tls-userspace`, or `none: insecure_cleartext`; None when the
        daemon is not a cluster node (docs/security.md, "Peer traffic over TLS")."""
        return self._raw.peer_encryption

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes as this client's daemon sees them now, one dict per node:
        node, alive, access ("mapped" or "network"), region, region_size. `alive` is whether
        the node answers the daemon's heartbeats (a dead or partitioned node turns False within
        half a lease); raises InvalidArgument if the daemon is not a cluster node."""
        return self._raw.cluster_nodes()

    @property
    def region_address(self) -> int:
        """Where the store's region is mapped in this process."""
        return self._raw.region_address

    @property
    def requests(self) -> int:
        """Requests this client has sent its daemon through the socket so far. Gets of
        objects in memory, and creates, seals and releases of small objects, take none
        (the fast path, docs/fast-path.md)."""
        return self._raw.requests

    @property
    def region_size(self) -> int:
        return self._raw.region_size

    def close(self) -> None:
        """Disconnects: the daemon releases this client's references. Do not use buffers
        from this client afterwards."""
        self._raw.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"shoal.Client(socket={self.socket!r})"


class Subscription:
    """Seal and removal notifications: iterate, or call `next(timeout)`."""

    def __init__(self, socket: str) -> None:
        self._raw = _internal.Subscription(socket)

    def next(self, timeout: float | None = None) -> tuple[ObjectID, str, int, int] | None:
        """(id, "sealed" | "removed", data_size, metadata_size), or None after `timeout` s."""
        event = self._raw.next(timeout)
        if event is None:
            return None
        oid, kind, data_size, metadata_size = event
        return ObjectID(oid), kind, data_size, metadata_size

    def close(self) -> None:
        """Ends the subscription (also wakes a `next` blocked in another thread)."""
        self._raw.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> tuple[ObjectID, str, int, int]:
        event = self.next(None)
        assert event is not None
        return event
