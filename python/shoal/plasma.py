"""Apache Arrow Plasma's Python API on shoal: change one import.

    import shoal.plasma as plasma          # was: import pyarrow.plasma as plasma

    with plasma.start_plasma_store(10**8) as (socket_name, proc):
        client = plasma.connect(socket_name)
        object_id = client.put(np.arange(10))
        array = client.get(object_id)       # zero-copy view of store memory

Everything `pyarrow.plasma` (Arrow 11) offers is here with the same names,
signatures and semantics: `ObjectID`, `ObjectNotAvailable`, `PlasmaBuffer`,
`PlasmaClient` (`create`, `seal`, `get_buffers`, `get_metadata`, `put`, `get`,
`put_raw_buffer`, `create_and_seal`, `contains`, `hash`, `delete`, `list`,
`evict`, `subscribe`, `get_next_notification`, `get_notification_socket`,
`decode_notifications`, `store_capacity`, `debug_string`, `disconnect`), the
exceptions `PlasmaObjectExists`, `PlasmaObjectNotFound`, `PlasmaStoreFull`,
`connect` and `start_plasma_store`. Plasma's exceptions are subclasses of both
shoal's (`shoal.ObjectExists`, ...) and `pyarrow.lib.ArrowException`, so
`except` clauses written for either keep working. `subscribe` reports the
objects already sealed first, as Plasma did.

Deliberate differences from Plasma:

* `put`/`get` use shoal's value codec instead of the removed pyarrow
  serialization: Arrow tables, record batches, arrays and numpy arrays are
  stored in Arrow IPC / raw form and read back without a copy; everything
  else (including bytes, containers and custom classes) is pickled, so
  `serialization_context` is unnecessary and ignored (with a FutureWarning,
  as Plasma warned). `put` writes a codec tag as the object's metadata, and
  `get` of an object stored with `create`/`create_and_seal`/`put_raw_buffer`
  returns its data as a `pyarrow.Buffer` instead of failing to deserialize.
* `hash` is an 8-byte BLAKE2b digest of the data size, data and metadata;
  it has Plasma's size and properties (equal content, equal hash) but not
  its xxhash64 value.
* `delete` ignores ids that are missing, as Plasma did, and unsealed ones
  (Plasma deleted those once sealed and released). A referenced object
  disappears at once and is freed when released (Plasma kept it visible
  until released).
* A buffer, and every Arrow or numpy view made from it, keeps its object
  referenced (Plasma released it when the Python buffer object died, even
  if Arrow views of its memory remained).
* `contains` is False for an object this client created but has not sealed
  (Plasma's client answered True for its own unsealed objects); `get` of an
  empty object returns it (Plasma returned ObjectNotAvailable).
* `list()["ref_count"]` counts every reference (two `get`s from one client
  count twice; Plasma counted clients). `create_time` and
  `construct_duration` are kept by this module: exact for objects created in
  this process, otherwise from when `list()` first saw the object.
* Errors are more precise but still caught as before: sealing another
  client's object raises PlasmaNotOwner (a PlasmaObjectNotFound), sealing
  twice PlasmaObjectAlreadySealed (a pyarrow ArrowTypeError), a lost
  connection PlasmaDisconnected (an OSError).
* `release` and `_release` only send releases already queued: a buffer
  releases its object when it is garbage, never twice.
* Notifications on the socket from `get_notification_socket` are framed like
  Plasma's (an 8-byte length, then the message) but the message is shoal's
  own encoding, which `decode_notifications` reads; it is not a flatbuffer.
* `start_plasma_store` runs `python -m shoal serve`; `external_store` is not
  supported, `use_valgrind`/`use_profiler` are accepted and ignored, and
  `use_hugepages` needs `plasma_directory` on a hugetlbfs mount.
* `memcopy_threads` is ignored: large copies run in Rust without the GIL.
* No DeprecationWarnings.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from shoal import _codec, errors
from shoal._ids import ObjectID as _ShoalObjectID
from shoal._ids import as_bytes
from shoal.client import Client, Subscription, get_batch
from shoal.errors import ObjectExists, ObjectNotFound, ObjectTooLarge, ShoalError, StoreFull

__all__ = [
    "ObjectID",
    "ObjectNotAvailable",
    "PLASMA_WAIT_TIMEOUT",
    "PlasmaBuffer",
    "PlasmaClient",
    "PlasmaObjectExists",
    "PlasmaObjectNotFound",
    "PlasmaStoreFull",
    "connect",
    "start_plasma_store",
]

PLASMA_WAIT_TIMEOUT = 2**30

#: Plasma returned its own Buffer subclass; shoal returns plain pyarrow Buffers.
PlasmaBuffer = pa.Buffer


# -- ids and sentinels ---------------------------------------------------------------------------


class ObjectID(_ShoalObjectID):
    """An ObjectID is a string of 20 bytes used to identify Plasma objects.

    A `shoal.ObjectID` too: ids from either module compare equal and hash alike.
    """

    __slots__ = ()

    def __init__(self, object_id: bytes) -> None:
        if not isinstance(object_id, bytes) or len(object_id) != self.SIZE:
            raise ValueError("Object ID must by 20 bytes, is " + str(object_id))
        super().__init__(object_id)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (ObjectID, (self.binary(),))

    def binary(self) -> bytes:
        """
        Return the binary representation of this ObjectID.

        Returns
        -------
        bytes
            Binary representation of the ObjectID.
        """
        return super().binary()

    @classmethod
    def from_random(cls) -> ObjectID:
        """
        Returns a randomly generated ObjectID.

        Returns
        -------
        ObjectID
            A randomly generated ObjectID.
        """
        return cls(os.urandom(cls.SIZE))


def _plasma_id(oid: _ShoalObjectID | bytes) -> ObjectID:
    if isinstance(oid, ObjectID):
        return oid
    return ObjectID(as_bytes(oid))


class ObjectNotAvailable:
    """
    Placeholder for an object that was not available within the given timeout.

    `get` returns the class itself, as Plasma did.
    """


# -- exceptions ----------------------------------------------------------------------------------


class PlasmaObjectExists(ObjectExists, pa.lib.ArrowException):
    """An object with this id already exists (a `shoal.ObjectExists`)."""


class PlasmaObjectNotFound(ObjectNotFound, pa.lib.ArrowException):
    """The object does not exist (a `shoal.ObjectNotFound`)."""


class PlasmaStoreFull(StoreFull, pa.lib.ArrowException):
    """The store cannot make room for the object (a `shoal.StoreFull`)."""


class _PlasmaObjectTooLarge(PlasmaStoreFull, ObjectTooLarge):
    """The object is larger than the whole store."""


_PLASMA_ERRORS: dict[type, type] = {
    ObjectExists: PlasmaObjectExists,
    ObjectNotFound: PlasmaObjectNotFound,
    StoreFull: PlasmaStoreFull,
    ObjectTooLarge: _PlasmaObjectTooLarge,
}
# What Plasma raised where shoal has a more precise error.
_PLASMA_BASES: dict[type, type] = {
    errors.NotOwner: PlasmaObjectNotFound,  # seal/abort of another client's object
    errors.ObjectAlreadySealed: pa.lib.ArrowTypeError,  # seal twice
}
_errors_lock = threading.Lock()


def _plasma_error_class(cls: type) -> type:
    """The Plasma-flavoured class for a shoal error: also a pyarrow ArrowException."""
    with _errors_lock:
        plasma_cls = _PLASMA_ERRORS.get(cls)
        if plasma_cls is None:
            base = _PLASMA_BASES.get(cls, pa.lib.ArrowException)
            plasma_cls = type("Plasma" + cls.__name__, (cls, base), {"__module__": __name__})
            _PLASMA_ERRORS[cls] = plasma_cls
        return plasma_cls


@contextlib.contextmanager
def _plasma_errors() -> Iterator[None]:
    """Re-raises shoal errors as their Plasma-flavoured subclasses."""
    try:
        yield
    except ShoalError as exc:
        if isinstance(exc, pa.lib.ArrowException):
            raise
        plasma_exc = _plasma_error_class(type(exc))(*exc.args)
        raise plasma_exc.with_traceback(exc.__traceback__) from None


# -- object timestamps (Plasma's list() reports them; the store does not keep them) -------------


class _Timestamps:
    """Creation and seal times of one store's objects, as seen from this process."""

    MAX_OBJECTS = 1 << 16

    def __init__(self) -> None:
        self._times: dict[bytes, list[float | None]] = {}  # id -> [create time, seal time]
        self._lock = threading.Lock()

    def created(self, oid: bytes, sealed: bool = False) -> None:
        now = time.time()
        with self._lock:
            self._times.pop(oid, None)
            while len(self._times) >= self.MAX_OBJECTS:
                del self._times[next(iter(self._times))]
            self._times[oid] = [now, now if sealed else None]

    def sealed(self, oid: bytes) -> None:
        with self._lock:
            entry = self._times.get(oid)
            if entry is not None and entry[1] is None:
                entry[1] = time.time()

    def forget(self, oids: Iterable[bytes]) -> None:
        with self._lock:
            for oid in oids:
                self._times.pop(oid, None)

    def observe(self, listing: list[tuple[bytes, int, int, bool, int, bool, int]]) -> list[tuple[int, int]]:
        """(create_time, construct_duration) per listed object; forgets unlisted ones. Objects
        not created in this process date from when they were first listed."""
        now = time.time()
        result = []
        with self._lock:
            for oid, _, _, sealed, *_ in listing:
                times = self._times.get(oid)
                if times is None:
                    times = self._times[oid] = [now, now if sealed else None]
                elif sealed and times[1] is None:
                    times[1] = now
                create_time = int(times[0])
                result.append((create_time, int(times[1]) - create_time if sealed else -1))
            present = {o[0] for o in listing}
            for oid in [oid for oid in self._times if oid not in present]:
                del self._times[oid]
        return result


_timestamps: dict[str, _Timestamps] = {}
_timestamps_lock = threading.Lock()


def _store_timestamps(socket_name: str) -> _Timestamps:
    key = os.path.realpath(socket_name)
    with _timestamps_lock:
        return _timestamps.setdefault(key, _Timestamps())


# -- notifications -------------------------------------------------------------------------------

_NOTIFICATION = struct.Struct("<20sqq")  # id, data size, metadata size (-1, -1: removed)
_FRAME_LENGTH = struct.Struct("=Q")  # Plasma's native 8-byte length prefix


def _notification(event: tuple[_ShoalObjectID, str, int, int]) -> tuple[ObjectID, int, int]:
    oid, kind, data_size, metadata_size = event
    if kind == "removed":
        return _plasma_id(oid), -1, -1
    return _plasma_id(oid), data_size, metadata_size


class _Notifications:
    """Plasma's notification stream: first the objects sealed when subscribing, then live events."""

    def __init__(self, subscription: Subscription, existing: list[tuple[ObjectID, int, int]]) -> None:
        self._subscription = subscription
        self._pending = collections.deque(existing)
        # An object sealed between subscribing and listing is in both: report it once.
        self._replayed = {oid.binary() for oid, _, _ in existing}

    def next(self, timeout: float | None) -> tuple[ObjectID, int, int] | None:
        """The next notification, or None after `timeout` seconds. Waits in slices so
        that Ctrl-C still interrupts a blocked reader."""
        if self._pending:
            return self._pending.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if remaining <= 0:
                return None
            with _plasma_errors():
                event = self._subscription.next(remaining)
            if event is None:
                continue
            key = event[0].binary()
            if key in self._replayed:
                self._replayed.discard(key)
                if event[1] == "sealed":
                    continue
            return _notification(event)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("the notification socket was closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class _NotificationPump:
    """Forwards a subscription to a socketpair, for users who select() on Plasma's socket."""

    def __init__(self, notifications: _Notifications) -> None:
        self.user_socket, self._feed = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(notifications,), name="shoal-plasma-notifications", daemon=True
        )
        self._thread.start()

    def _run(self, notifications: _Notifications) -> None:
        try:
            while not self._stop.is_set():
                notification = notifications.next(0.2)
                if notification is None:
                    continue
                oid, data_size, metadata_size = notification
                message = _NOTIFICATION.pack(oid.binary(), data_size, metadata_size)
                self._feed.sendall(_FRAME_LENGTH.pack(len(message)) + message)
        except (OSError, ShoalError):
            pass  # the reader or the daemon went away
        finally:
            self._feed.close()

    def close(self, wait: bool = True) -> None:
        """Stops forwarding; with `wait`, also closes the user's socket (which unblocks
        a forwarder stuck on a full socket) and joins the thread."""
        self._stop.set()
        if wait:
            self.user_socket.close()
            self._thread.join(timeout=1.0)


# -- the client ----------------------------------------------------------------------------------


def _id_list(object_ids: Any) -> list[bytes]:
    if isinstance(object_ids, _ShoalObjectID | bytes):
        return [as_bytes(object_ids)]
    return [as_bytes(oid) for oid in object_ids]


def _as_metadata(metadata: Any) -> bytes:
    if metadata is None:
        return b""
    return metadata if isinstance(metadata, bytes) else bytes(metadata)


class PlasmaClient:
    """
    The PlasmaClient is used to interface with a plasma store (a shoal daemon).

    The PlasmaClient can ask the PlasmaStore to allocate a new buffer, seal a
    buffer, and get a buffer. Buffers are referred to by object IDs.

    Make one with `connect()`. Thread-safe.
    """

    def __init__(self, client: Client, store_socket_name: str) -> None:
        self._client = client
        self._raw = client._raw
        self._store_socket_name = store_socket_name
        self._times = _store_timestamps(store_socket_name)
        self._notifications: _Notifications | None = None
        self._pump: _NotificationPump | None = None

    @property
    def store_socket_name(self) -> str:
        return self._store_socket_name

    @property
    def shoal_client(self) -> Client:
        """The underlying `shoal.Client`, for shoal's own API (batches, stats, numpy creation)."""
        return self._client

    def __repr__(self) -> str:
        return f"shoal.plasma.PlasmaClient(store_socket_name={self._store_socket_name!r})"

    # -- create, seal, get ----------------------------------------------------------------------

    def create(self, object_id: ObjectID, data_size: int, metadata: bytes = b"") -> pa.Buffer:
        """
        Create a new buffer in the PlasmaStore for a particular object ID.

        The returned buffer is mutable until ``seal()`` is called.

        Parameters
        ----------
        object_id : ObjectID
            The object ID used to identify an object.
        data_size : int
            The size in bytes of the created buffer.
        metadata : bytes
            An optional string of bytes encoding whatever metadata the user
            wishes to encode.

        Returns
        -------
        buffer : Buffer
            A mutable buffer where to write the object data (a view of store
            memory, no copy).

        Raises
        ------
        PlasmaObjectExists
            This exception is raised if the object could not be created because
            there already is an object with the same ID in the plasma store.

        PlasmaStoreFull
            This exception is raised if the object could
            not be created because the plasma store is unable to evict
            enough objects to create room for it.
        """
        oid = as_bytes(object_id)
        with _plasma_errors():
            buffer = self._raw.create(oid, data_size, _as_metadata(metadata), 0)
        self._times.created(oid)
        return pa.py_buffer(buffer)

    def create_and_seal(self, object_id: ObjectID, data: bytes, metadata: bytes = b"") -> None:
        """
        Store a new object in the PlasmaStore for a particular object ID.

        Parameters
        ----------
        object_id : ObjectID
            The object ID used to identify an object.
        data : bytes
            The object to store.
        metadata : bytes
            An optional string of bytes encoding whatever metadata the user
            wishes to encode.

        Raises
        ------
        PlasmaObjectExists
            This exception is raised if the object could not be created because
            there already is an object with the same ID in the plasma store.

        PlasmaStoreFull: This exception is raised if the object could
                not be created because the plasma store is unable to evict
                enough objects to create room for it.
        """
        oid = as_bytes(object_id)
        view = data if isinstance(data, bytes) else memoryview(data).cast("B")
        with _plasma_errors():
            self._raw.put_batch([oid], [view], [_as_metadata(metadata)], 0)
        self._times.created(oid, sealed=True)

    def seal(self, object_id: ObjectID) -> None:
        """
        Seal the buffer in the PlasmaStore for a particular object ID.

        Once a buffer has been sealed, the buffer is immutable and can only be
        accessed through get.

        Parameters
        ----------
        object_id : ObjectID
            A string used to identify an object.
        """
        oid = as_bytes(object_id)
        with _plasma_errors():
            self._raw.seal([oid], False)
        self._times.sealed(oid)

    def abort(self, object_id: ObjectID) -> None:
        """
        Abort an unsealed object this client created: it is removed and its
        memory freed at once. (Plasma's C++ client had this; its Python one did not.)

        Parameters
        ----------
        object_id : ObjectID
            A string used to identify an object.
        """
        with _plasma_errors():
            self._raw.abort(as_bytes(object_id))

    def _get_raw(self, object_ids: Any, timeout_ms: int) -> list[Any]:
        with _plasma_errors():
            return get_batch(self._raw, _id_list(object_ids), timeout_ms)

    def get_buffers(
        self, object_ids: Sequence[ObjectID], timeout_ms: int = -1, with_meta: bool = False
    ) -> list[Any]:
        """
        Returns data buffer from the PlasmaStore based on object ID.

        If the object has not been sealed yet, this call will block. The
        retrieved buffer is immutable.

        Parameters
        ----------
        object_ids : list
            A list of ObjectIDs used to identify some objects.
        timeout_ms : int
            The number of milliseconds that the get call should block before
            timing out and returning. Pass -1 if the call should block and 0
            if the call should return immediately.
        with_meta : bool

        Returns
        -------
        list
            If with_meta=False, this is a list of PlasmaBuffers for the data
            associated with the object_ids and None if the object was not
            available. If with_meta=True, this is a list of tuples of
            metadata bytes and PlasmaBuffer (both None if not available).
        """
        result: list[Any] = []
        for buffer in self._get_raw(object_ids, timeout_ms):
            data = None if buffer is None else pa.py_buffer(buffer)
            if not with_meta:
                result.append(data)
            else:
                metadata = None if buffer is None else bytes(buffer.metadata())
                result.append((metadata, data))
        return result

    def get_metadata(self, object_ids: Sequence[ObjectID], timeout_ms: int = -1) -> list[pa.Buffer | None]:
        """
        Returns metadata buffer from the PlasmaStore based on object ID.

        If the object has not been sealed yet, this call will block. The
        retrieved buffer is immutable.

        Parameters
        ----------
        object_ids : list
            A list of ObjectIDs used to identify some objects.
        timeout_ms : int
            The number of milliseconds that the get call should block before
            timing out and returning. Pass -1 if the call should block and 0
            if the call should return immediately.

        Returns
        -------
        list
            List of PlasmaBuffers for the metadata associated with the
            object_ids and None if the object was not available.
        """
        return [
            None if buffer is None else pa.py_buffer(buffer.metadata())
            for buffer in self._get_raw(object_ids, timeout_ms)
        ]

    # -- values ---------------------------------------------------------------------------------

    def put_raw_buffer(
        self, value: Any, object_id: ObjectID | None = None, metadata: bytes = b"", memcopy_threads: int = 6
    ) -> ObjectID:
        """
        Store Python buffer into the object store.

        Parameters
        ----------
        value : Python object that implements the buffer protocol
            A Python buffer object to store.
        object_id : ObjectID, default None
            If this is provided, the specified object ID will be used to refer
            to the object.
        metadata : bytes
            An optional string of bytes encoding whatever metadata the user
            wishes to encode.
        memcopy_threads : int, default 6
            Ignored: the copy runs in Rust, without the GIL.

        Returns
        -------
        ObjectID
            The object ID associated to the Python buffer object.
        """
        target_id = _plasma_id(object_id) if object_id else ObjectID.from_random()
        self.create_and_seal(target_id, value, metadata)
        return target_id

    def put(
        self,
        value: Any,
        object_id: ObjectID | None = None,
        memcopy_threads: int = 6,
        serialization_context: Any = None,
    ) -> ObjectID:
        """
        Store a Python value into the object store.

        Arrow tables, record batches, arrays and chunked arrays are stored in
        the Arrow IPC format and numpy arrays as raw bytes, both read back by
        `get` without a copy; any other value is pickled.

        Parameters
        ----------
        value : object
            A Python object to store.
        object_id : ObjectID, default None
            If this is provided, the specified object ID will be used to refer
            to the object.
        memcopy_threads : int, default 6
            Ignored.
        serialization_context : pyarrow.SerializationContext, default None
            Ignored (pickle handles custom types); passing one warns.

        Returns
        -------
        ObjectID
            The object ID associated to the Python object.
        """
        if serialization_context is not None:
            warnings.warn(
                "'serialization_context' is ignored by shoal.plasma: values are pickled",
                FutureWarning,
                stacklevel=2,
            )
        target_id = _plasma_id(object_id) if object_id else ObjectID.from_random()
        oid = target_id.binary()
        if isinstance(value, bytes | bytearray):
            # Plasma's get returned bytes for bytes, not a buffer.
            data = pickle.dumps(value, protocol=5)
            size, metadata = len(data), _codec.TAG_PICKLE

            def write(buf: Any) -> None:
                memoryview(buf)[:] = data

        else:
            size, metadata, write = _codec.encode(value)
        with _plasma_errors():
            buffer = self._raw.create(oid, size, metadata, 0)
        self._times.created(oid)
        try:
            write(buffer)
        except BaseException:
            with _plasma_errors():
                self._raw.abort(oid)
            raise
        with _plasma_errors():
            # The creator's reference goes when `buffer` does (seal-and-release
            # here would release it a second time when the buffer is freed).
            self._raw.seal([oid], False)
        self._times.sealed(oid)
        del buffer
        return target_id

    def get(self, object_ids: Any, timeout_ms: int = -1, serialization_context: Any = None) -> Any:
        """
        Get one or more Python values from the object store.

        Parameters
        ----------
        object_ids : list or ObjectID
            Object ID or list of object IDs associated to the values we get
            from the store.
        timeout_ms : int, default -1
            The number of milliseconds that the get call should block before
            timing out and returning. Pass -1 if the call should block and 0
            if the call should return immediately.
        serialization_context : pyarrow.SerializationContext, default None
            Ignored; passing one warns.

        Returns
        -------
        list or object
            Python value or list of Python values for the data associated with
            the object_ids and ObjectNotAvailable if the object was not
            available. Arrow and numpy values are views of store memory.
        """
        if serialization_context is not None:
            warnings.warn(
                "'serialization_context' is ignored by shoal.plasma: values are pickled",
                FutureWarning,
                stacklevel=2,
            )
        single = isinstance(object_ids, _ShoalObjectID | bytes)
        results = [
            ObjectNotAvailable if buffer is None else _codec.decode(buffer, bytes(buffer.metadata()))
            for buffer in self._get_raw(object_ids, timeout_ms)
        ]
        return results[0] if single else results

    # -- queries and removal --------------------------------------------------------------------

    def contains(self, object_id: ObjectID) -> bool:
        """
        Check if the object is present and sealed in the PlasmaStore.

        Parameters
        ----------
        object_id : ObjectID
            A string used to identify an object.
        """
        with _plasma_errors():
            return self._raw.contains(as_bytes(object_id))

    def hash(self, object_id: ObjectID) -> bytes:
        """
        Compute the checksum of an object in the object store.

        The digest is 8 bytes of BLAKE2b over the data size, the data and the
        metadata: equal objects hash equal, as in Plasma, but the value differs
        from Plasma's xxhash64.

        Parameters
        ----------
        object_id : ObjectID
            A string used to identify an object.

        Returns
        -------
        bytes
            A digest string object's hash.

        Raises
        ------
        PlasmaObjectNotFound
            If the object is not in the store (or not sealed).
        """
        [buffer] = self._get_raw([object_id], 0)
        if buffer is None:
            raise PlasmaObjectNotFound(f"object {as_bytes(object_id).hex()} is not in the store")
        digest = hashlib.blake2b(digest_size=8)
        digest.update(len(buffer).to_bytes(8, "little"))
        digest.update(memoryview(buffer))
        digest.update(memoryview(buffer.metadata()))
        return digest.digest()

    def delete(self, object_ids: Iterable[ObjectID]) -> None:
        """
        Delete the objects with the given IDs from other object store.

        Ids that are missing or not sealed are ignored, as in Plasma. A
        referenced object disappears now and is freed once released.

        Parameters
        ----------
        object_ids : list
            A list of strings used to identify the objects.
        """
        ids = _id_list(object_ids)
        with _plasma_errors():
            self._raw.delete(ids)
        self._times.forget(ids)

    def list(self) -> dict[ObjectID, dict[str, Any]]:
        """
        Experimental: List the objects in the store.

        Returns
        -------
        dict
            Dictionary from ObjectIDs to an "info" dictionary describing the
            object. The "info" dictionary has the following entries:

            data_size
              size of the object in bytes

            metadata_size
              size of the object metadata in bytes

            ref_count
              Number of references to the object buffer

            create_time
              Unix timestamp of the creation of the object

            construct_duration
              Time the creation of the object took in seconds (-1 until sealed)

            state
              "created" if the object is still being created and
              "sealed" if it is already sealed
        """
        with _plasma_errors():
            objects = self._raw.list()
        return {
            ObjectID(oid): {
                "data_size": data_size,
                "metadata_size": metadata_size,
                "ref_count": refs,
                "create_time": create_time,
                "construct_duration": construct_duration,
                "state": "sealed" if sealed else "created",
            }
            for (oid, data_size, metadata_size, sealed, refs, *_), (create_time, construct_duration) in zip(
                objects, self._times.observe(objects), strict=True
            )
        }

    def evict(self, num_bytes: int) -> int:
        """
        Evict some objects until to recover some bytes.

        Recover at least num_bytes bytes if possible. Counts, like Plasma, the
        data and metadata sizes of the evicted objects, least recently used
        first. (The store frees and counts whole 64-byte lines; this method
        lists the store around each eviction to count as Plasma did, so an
        object another client deletes meanwhile may be counted too.)

        Parameters
        ----------
        num_bytes : int
            The number of bytes to attempt to recover.

        Returns
        -------
        int
            The number of bytes evicted.
        """
        freed = 0
        if num_bytes <= 0:
            return freed
        with _plasma_errors():
            listing = self._raw.list()
            while freed < num_bytes:
                evictable = {o[0]: o[1] + o[2] for o in listing if o[3] and o[4] == 0}
                if not evictable or self._raw.evict(num_bytes - freed) == 0:
                    break
                listing = self._raw.list()
                remaining = {o[0] for o in listing}
                freed += sum(size for oid, size in evictable.items() if oid not in remaining)
        return freed

    def release(self, object_id: ObjectID | None = None) -> None:
        """
        Sends the releases of buffers that are already garbage.

        A buffer from `create`/`get_buffers`/`get` releases its object when it
        is freed, so there is nothing to release by hand; this never releases
        a reference twice. Keep no buffer of `object_id` if you want it released.
        """
        with _plasma_errors():
            self._raw.flush_releases()

    _release = release

    # -- store ----------------------------------------------------------------------------------

    def store_capacity(self) -> int:
        """
        Get the memory capacity of the store.

        Returns
        -------

        int
            The memory capacity of the store in bytes.
        """
        with _plasma_errors():
            return self._raw.stats()["capacity"]

    def debug_string(self) -> str:
        """The store's statistics as text."""
        with _plasma_errors():
            stats = self._raw.stats()
        lines = ["========== shoal store: =================="]
        lines += [f"{key}: {value}" for key, value in stats.items()]
        return "\n".join(lines) + "\n"

    def set_client_options(self, client_name: str, limit_output_memory: int) -> None:
        """Accepted for compatibility; shoal has no per-client output quota."""

    # -- notifications --------------------------------------------------------------------------

    def subscribe(self) -> None:
        """Subscribe to notifications about sealed objects.

        As in Plasma, the objects already sealed are reported first.
        """
        with _plasma_errors():
            subscription = self._client.subscribe()
            existing = [(ObjectID(o[0]), o[1], o[2]) for o in self._raw.list() if o[3]]
        self._close_notifications()
        self._notifications = _Notifications(subscription, existing)

    def _require_notifications(self) -> _Notifications:
        if self._notifications is None:
            raise OSError("not subscribed: call subscribe() first")
        return self._notifications

    def get_notification_socket(self) -> socket.socket:
        """
        Get the notification socket: each message is an 8-byte native length,
        then a message for `decode_notifications`. Once it is requested,
        `get_next_notification` reads from it too.
        """
        if self._pump is None:
            self._pump = _NotificationPump(self._require_notifications())
        return self._pump.user_socket

    def decode_notifications(self, buf: bytes) -> tuple[list[ObjectID], list[int], list[int]]:
        """
        Get the notification from the buffer.

        Returns
        -------
        [ObjectID]
            The list of object IDs in the notification message.
        list of int
            The data sizes of the objects in the notification message (-1: deleted).
        list of int
            The metadata sizes of the objects in the notification message (-1: deleted).
        """
        object_ids, data_sizes, metadata_sizes = [], [], []
        for oid, data_size, metadata_size in _NOTIFICATION.iter_unpack(bytes(buf)):
            object_ids.append(ObjectID(oid))
            data_sizes.append(data_size)
            metadata_sizes.append(metadata_size)
        return object_ids, data_sizes, metadata_sizes

    def get_next_notification(self) -> tuple[ObjectID, int, int]:
        """
        Get the next notification from the notification socket.

        Returns
        -------
        ObjectID
            The object ID of the object that was stored.
        int
            The data size of the object that was stored (-1 if it was deleted).
        int
            The metadata size of the object that was stored (-1 if it was deleted).
        """
        notifications = self._require_notifications()
        if self._pump is not None:
            sock = self._pump.user_socket
            (length,) = _FRAME_LENGTH.unpack(_recv_exactly(sock, _FRAME_LENGTH.size))
            object_ids, data_sizes, metadata_sizes = self.decode_notifications(_recv_exactly(sock, length))
            return object_ids[0], data_sizes[0], metadata_sizes[0]
        notification = notifications.next(None)
        assert notification is not None
        return notification

    def _close_notifications(self) -> None:
        if self._pump is not None:
            self._pump.close()
            self._pump = None
        self._notifications = None  # its connection closes when the pump lets go of it

    def __del__(self) -> None:
        pump = getattr(self, "_pump", None)
        if pump is not None:
            pump.close(wait=False)

    def disconnect(self) -> None:
        """
        Disconnect this client from the Plasma store. Buffers from this
        client must not be used afterwards.
        """
        self._close_notifications()
        self._client.close()


def connect(store_socket_name: str, num_retries: int = -1) -> PlasmaClient:
    """
    Return a new PlasmaClient that is connected a plasma store.

    Parameters
    ----------
    store_socket_name : str
        Name of the socket the plasma store is listening at.
    num_retries : int, default -1
        Number of times to try to connect to plasma store. Default value of -1
        uses the default (50), 100 ms apart, as Plasma did.
    """
    retries = 50 if num_retries < 0 else num_retries
    while True:
        try:
            with _plasma_errors():
                client = Client(os.fspath(store_socket_name))
            return PlasmaClient(client, os.fspath(store_socket_name))
        except errors.Disconnected:
            if retries <= 0:
                raise
            retries -= 1
            time.sleep(0.1)


# -- the store process ---------------------------------------------------------------------------


def _wait_until_serving(socket_name: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rc = proc.poll()
        if rc is not None:
            raise RuntimeError(f"plasma_store exited unexpectedly with code {rc}")
        try:
            Client(socket_name).close()
            return
        except errors.Disconnected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the shoal store did not start listening on {socket_name}") from None
            time.sleep(0.005)


@contextlib.contextmanager
def start_plasma_store(
    plasma_store_memory: int,
    use_valgrind: bool = False,
    use_profiler: bool = False,
    plasma_directory: str | None = None,
    use_hugepages: bool = False,
    external_store: str | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """
    Start a plasma store process (a shoal daemon, `python -m shoal serve`).

    Parameters
    ----------
    plasma_store_memory : int
        Capacity of the plasma store in bytes.
    use_valgrind : bool
        Accepted and ignored. If this is True, use_profiler must be False.
    use_profiler : bool
        Accepted and ignored. If this is True, use_valgrind must be False.
    plasma_directory : str
        Directory where the store's memory-mapped region file is created
        (default: /dev/shm).
    use_hugepages : bool
        True if plasma_directory is a hugetlbfs mount.
    external_store : str
        Not supported (NotImplementedError).

    Yields
    -------
    plasma_store_name : str
        Name of the plasma store socket
    proc : subprocess.Popen
        Process ID of the plasma store process

    The process is killed (SIGKILL, as Plasma did) and its socket removed on exit.
    """
    if use_valgrind and use_profiler:
        raise Exception("Cannot use valgrind and profiler at the same time.")
    if external_store is not None:
        raise NotImplementedError("shoal has no external store for evicted objects")
    if use_hugepages and not plasma_directory:
        raise ValueError("use_hugepages needs plasma_directory on a hugetlbfs mount")

    tmpdir = tempfile.mkdtemp(prefix="test_plasma-")
    proc = None
    # The daemon unlinks its region file as soon as it is mapped, so SIGKILL leaks nothing.
    region = None
    if plasma_directory:
        region = os.path.join(plasma_directory, f"shoal-plasma-{os.getpid()}-{os.urandom(6).hex()}")
    try:
        plasma_store_name = os.path.join(tmpdir, "plasma.sock")
        command = [
            sys.executable,
            "-m",
            "shoal",
            "serve",
            "--socket",
            plasma_store_name,
            "--capacity",
            str(int(plasma_store_memory)),
            "--no-prefault",
        ]
        if region is not None:
            command += ["--region", region]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        _wait_until_serving(plasma_store_name, proc, timeout=15.0)
        yield plasma_store_name, proc
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if region is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(region)
        shutil.rmtree(tmpdir, ignore_errors=True)
