"""shoal: a zero-copy shared-memory object store for Apache Arrow data.

import shoal, pyarrow as pa
client = shoal.connect()            # starts an embedded store if none runs
oid = client.put(pa.table({"x": [1, 2, 3]}))
table = client.get(oid)             # a pyarrow.Table over store memory, no copy
"""

from __future__ import annotations

from shoal import _embedded, _internal
from shoal._ids import ObjectID
from shoal.client import Buffer, Client, ObjectInfo, Subscription
from shoal.errors import (
    Disconnected,
    InvalidArgument,
    NotOwner,
    ObjectAlreadySealed,
    ObjectExists,
    ObjectInUse,
    ObjectNotFound,
    ObjectNotSealed,
    ObjectTooLarge,
    ProtocolError,
    ShoalError,
    StoreFull,
    Timeout,
)

__version__ = _internal.__version__


def connect(
    socket: str | None = None, *, capacity: str | int | None = None, start: bool | None = None
) -> Client:
    """Connects to a shoal daemon.

    With no `socket`, uses $SHOAL_SOCKET or the per-user default and, if no daemon runs
    there, starts an embedded one (`capacity`, default 1 GiB) that exits when its last
    client has gone. With an explicit `socket`, the daemon must be running unless
    `start=True`.
    """
    path = socket or _embedded.default_socket()
    may_start = start if start is not None else socket is None
    try:
        return Client(path)
    except Disconnected:
        if not may_start:
            raise
    _embedded.start(path, capacity or _embedded.DEFAULT_CAPACITY)
    return Client(path)


__all__ = [
    "Buffer",
    "Client",
    "Disconnected",
    "InvalidArgument",
    "NotOwner",
    "ObjectAlreadySealed",
    "ObjectExists",
    "ObjectID",
    "ObjectInUse",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectNotSealed",
    "ObjectTooLarge",
    "ProtocolError",
    "ShoalError",
    "StoreFull",
    "Subscription",
    "Timeout",
    "connect",
]
