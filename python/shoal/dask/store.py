"""A Dask process's connection to its shoal store: finding it, naming objects after keys,
storing and reading values, and what a failure turns into.

Workers find the store by the socket given to the worker class (`shoal_socket=`), else
Dask's config `shoal.socket` (environment: DASK_SHOAL__SOCKET), else $SHOAL_SOCKET or the
per-user default, where `shoal.connect()` starts an embedded store if none runs (its
capacity: `shoal.capacity`, default 1 GiB). Workers of one host that find the same socket
share one store. Any failure of the store (none at the socket, full, gone) is logged once
per worker and kind and the value stays with Dask (docs/dask.md, "Errors").

On a store with a tier below memory, a get that finds memory full of referenced objects
(the object has to come back from the tier) makes room first: the process releases the
values it holds (`Store.make_room`, the data mapping's), and asks again, waiting for
others' releases up to ROOM_WAIT_S before the key's read fails.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import shoal
from shoal import layout
from shoal.dask.backing import Stored
from shoal.errors import Disconnected, ObjectNotFound, ShoalError, StoreFull

log = logging.getLogger("distributed.worker.shoal")

#: Names of a Dask cluster's objects: ROOT/<scheduler>/<key>/<worker> (docs/dask.md).
ROOT = "dask"
#: Longest name component kept as is; a longer key is cut and ends with its hash.
_COMPONENT = 200
#: How long a read of a value on a tier waits for memory (other processes releasing
#: theirs) before it fails: longer than any task's hold on its inputs here.
ROOM_WAIT_S = 120.0
#: Each ask of that wait: how long the daemon waits for room before answering StoreFull.
ROOM_ASK_MS = 1000


def component(text: str) -> str:
    """`text` as one name component: `%` and `/` escaped, never empty, `.` or `..`, cut
    to a bounded length with a hash that keeps it unique."""
    escaped = text.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    if escaped in ("", ".", ".."):
        escaped = "%" + escaped.replace(".", "%2E")
    if len(escaped.encode()) > _COMPONENT:
        digest = hashlib.sha1(escaped.encode(), usedforsecurity=False).hexdigest()[:16]
        escaped = escaped.encode()[: _COMPONENT - 20].decode(errors="ignore") + "~" + digest
    return escaped


def names_below(prefix: str, name: str) -> list[str]:
    """The components of `name` below directory `prefix` (`ls(prefix)` lists it)."""
    return name[len(prefix.rstrip("/")) + 1 :].split("/")


def key_prefix(scope: str, key: Any) -> str:
    """The directory of every object of `key` in the cluster named `scope`."""
    return f"{ROOT}/{component(scope)}/{component(str(key))}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _region_file(client: shoal.Client) -> str:
    """The file this process maps the store's region from (unique per daemon and host)."""
    address = client.region_address
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 else fields[0]
    return f"{client.socket}@{address:x}"


@dataclass
class Store:
    """One process's client of the store and its failure state."""

    client: shoal.Client
    #: Equal in two processes exactly when they reach the same store: this boot of the
    #: host and the region's file.
    identity: str
    #: Whether the store has a tier below memory (then values' objects are released when
    #: the store fills, so the tiers may move them down).
    tiered: bool
    #: The shoal cluster the store is a node of (`Client.cluster_identity`), None for a
    #: single store: processes of two nodes of one cluster reach each other's objects
    #: through their own daemons (a get pulls a copy over the network, or maps the peer's
    #: region where the fabric allows).
    cluster: str | None = None
    #: Set once the daemon is gone: everything falls back to Dask from then on.
    gone: bool = False
    #: The store's capacity in bytes when this process connected.
    capacity: int = 0
    #: Releases what this process holds in the store; returns the bytes released (the
    #: data mapping installs its own).
    make_room: Callable[[], int] = field(default=lambda: 0, repr=False)  # holds nothing

    def __post_init__(self) -> None:
        self._warned: set[str] = set()
        #: Reads that found memory full of values in use and waited for room, and the
        #: seconds they waited (the benchmarks report both).
        self.room_waits = 0
        self.room_wait_s = 0.0

    @classmethod
    def open(cls, socket: str | None = None, capacity: str | int | None = None) -> Store:
        """Connects as the module docstring says. Raises ShoalError or OSError when no
        store can be reached."""
        client = shoal.connect(socket, capacity=capacity)
        tiered = bool(client.tiers().get("tiers"))
        identity = f"{_boot_id()}:{_region_file(client)}"
        return cls(client, identity, tiered, client.cluster_identity, capacity=client.stats()["capacity"])

    def reaches(self, handshake: Any) -> str | None:
        """How a process whose comm handshake carried `handshake` (`handshake()` of its
        store) reaches this store's objects: "store" (the same store), "cluster" (a node of
        the same shoal cluster), or None."""
        if not isinstance(handshake, dict):
            return None
        if handshake.get("store") == self.identity:
            return "store"
        if self.cluster is not None and handshake.get("cluster") == self.cluster:
            return "cluster"
        return None

    def handshake(self) -> dict[str, str | None]:
        """What this process adds to its comms' handshakes (`reaches` reads it)."""
        return {"store": self.identity, "cluster": self.cluster}

    @property
    def usable(self) -> bool:
        return not self.gone

    def warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)

    def failed(self, err: BaseException, what: str) -> None:
        """Turns a store error into Dask's own behaviour: logged once per kind."""
        if isinstance(err, Disconnected):
            self.gone = True
            self.warn_once("gone", "shoal: the store went away (%s); Dask keeps new data itself", err)
        elif isinstance(err, StoreFull):
            self.warn_once("full", "shoal: the store is full (%s); Dask keeps %s itself", err, what)
        else:
            self.warn_once(type(err).__name__, "shoal: %s failed (%r); Dask keeps it itself", what, err)

    def put(self, pickled: layout.Pickled, name: str | None, *, timeout_ms: int = 0) -> tuple[Stored, Any]:
        """Stores a pickled value in one create → write → seal (named `name`; the create
        waits up to `timeout_ms` for memory) and returns its record and the value rebuilt
        over the object. Raises StoreFull (or another ShoalError)."""
        oid = layout.store(self.client, pickled, name=name, timeout_ms=timeout_ms)
        return self.open_object(oid.binary())

    def open_object(
        self, oid: bytes, *, wait_ms: int = 0, part: layout.Part | None = None
    ) -> tuple[Stored, Any]:
        """The record of sealed object `oid` with this process's reference, and its value
        (or the value `part` of it describes) rebuilt over store memory. An object of
        another node of the cluster comes through this store's daemon (a network pull into
        a copy here, or the peer's region mapped). Raises ObjectNotFound (or
        Disconnected, NodeUnavailable, StoreFull)."""
        buffer = self._get(oid, wait_ms)
        stored = Stored(oid, self.identity, len(buffer), buffer, part)
        return stored, self.view(stored)

    def view(self, stored: Stored) -> Any:
        """The value of `stored` rebuilt over store memory, taking a reference again if the
        record had released its own."""
        if stored.buffer is None:
            stored.buffer = self._get(stored.oid, 0)
        if stored.part is not None:
            return layout.read_part(stored.buffer, stored.part)
        return layout.read(stored.buffer)

    def _get(self, oid: bytes, wait_ms: int) -> Any:
        """`oid`'s buffer (a new reference). An object on a tier that memory has no room
        for comes back once room is made (the module docstring)."""
        try:
            return self.client.get_buffer(oid, timeout_ms=wait_ms)
        except StoreFull:
            if not self.tiered:
                raise
        started = time.monotonic()
        self.room_waits += 1
        try:
            while True:
                self.make_room()
                try:
                    return self.client.get_buffer(oid, timeout_ms=max(wait_ms, ROOM_ASK_MS))
                except StoreFull:
                    if time.monotonic() >= started + ROOM_WAIT_S:
                        raise
                    self.warn_once("room", "shoal: the store is full of values in use; a read waits for room")
        finally:
            self.room_wait_s += time.monotonic() - started

    def cool(self, oids: list[bytes]) -> None:
        """Tells the store this process is done reading `oids` for now: they leave memory
        first when room is needed (`shoal.Client.cool`). An object deleted meanwhile, or
        already down a tier, is skipped."""
        try:
            self.client.cool(oids)
        except ObjectNotFound:
            pass  # the others were cooled
        except ShoalError as err:
            self.failed(err, "a hint")

    def find(self, prefix: str) -> tuple[Stored, Any] | None:
        """A value stored in one object under directory `prefix` (any worker's:
        `prefix/<worker>`), or None. Deeper names are values stored in parts
        (`pieces.find`)."""
        try:
            rows = self.client.ls(prefix)
        except ShoalError as err:
            self.failed(err, "a lookup")
            return None
        for row in rows:
            if len(names_below(prefix, row.name)) > 1:
                continue
            try:
                stored, value = self.open_object(row.id.binary())
            except ShoalError:
                continue
            return stored, value
        return None

    def forget(self, prefix: str, before: float) -> int:
        """Deletes every object named under directory `prefix` and sealed before `before`
        (seconds since the epoch; a seal in the same millisecond is kept); returns how many."""
        try:
            return forget(self.client, [(prefix, before)], lambda err: self.failed(err, "a delete"))
        except ShoalError as err:
            self.failed(err, "a delete")
            return 0


def forget(
    client: shoal.Client, forgets: list[tuple[str, float]], failed: Callable[[ShoalError], None]
) -> int:
    """Deletes, in one request, the objects named under each directory `prefix` of
    `forgets` and sealed before its `before` (seconds since the epoch; a seal in the same
    millisecond is kept); returns how many were listed. By id, not by name: a name bound
    again after the listing keeps its new object (forget.py). An object deleted meanwhile
    is no error; a listing that fails leaves its prefix alone (told to `failed`) and the
    others are deleted. Raises Disconnected, or the delete's error."""
    oids = []
    for prefix, before in forgets:
        limit = int(before * 1000)
        try:
            rows = client.ls(prefix)
        except Disconnected:
            raise
        except ShoalError as err:
            failed(err)
            continue
        oids += [row.id for row in rows if round(row.mtime * 1000) < limit]
    if oids:
        try:
            client.delete(oids)
        except ObjectNotFound:
            pass  # deleted meanwhile (the others were deleted)
    return len(oids)


_current: Store | None = None


def use(store: Store) -> None:
    """Makes `store` the one this process reads received references from."""
    global _current
    _current = store


def current() -> Store | None:
    return _current
