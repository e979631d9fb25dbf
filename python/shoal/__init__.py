"""shoal: a zero-copy shared-memory object store for Apache Arrow data.

import shoal, pyarrow as pa
client = shoal.connect()            # starts an embedded store if none runs
oid = client.put(pa.table({"x": [1, 2, 3]}))
table = client.get(oid)             # a pyarrow.Table over store memory, no copy
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal import _embedded, _internal, _lazy
from shoal._ids import ObjectID
from shoal.errors import (
    Disconnected,
    HomeUnavailable,
    InvalidArgument,
    NameTooLong,
    NodeUnavailable,
    NotOwner,
    ObjectAlreadySealed,
    ObjectCorrupt,
    ObjectExists,
    ObjectInUse,
    ObjectNotFound,
    ObjectNotSealed,
    ObjectTooLarge,
    PermissionDenied,
    ProtocolError,
    ShoalError,
    StoreFull,
    Timeout,
)

if TYPE_CHECKING:
    from shoal.arrow import TableBuilder
    from shoal.client import Buffer, Client, NameInfo, ObjectInfo, Subscription

__version__ = _internal.__version__

# The client pulls in numpy and pyarrow; importing them lazily keeps
# `python -m shoal serve` (the embedded daemon) quick to start.
_LAZY = {
    "Buffer": "shoal.client",
    "Client": "shoal.client",
    "ObjectInfo": "shoal.client",
    "NameInfo": "shoal.client",
    "Subscription": "shoal.client",
    "TableBuilder": "shoal.arrow",
}


def __getattr__(name: str) -> Any:
    return _lazy.resolve(globals(), _LAZY, name, __name__)


def barrier(
    name: str,
    parties: int | Sequence[str],
    timeout: float | None = None,
    *,
    party: str | None = None,
    client: Client | None = None,
) -> int:
    """Deprecated: use `Client.barrier` (the one barrier entry point).

    Kept for programs written against earlier releases: calls `client.barrier`, with
    `client` defaulting to a connection to $SHOAL_SOCKET."""
    import warnings

    warnings.warn(
        "shoal.barrier is deprecated; use client.barrier(name, parties, timeout, party=...)",
        DeprecationWarning,
        stacklevel=2,
    )
    return (client or connect()).barrier(name, parties, timeout, party=party)


def features() -> frozenset[str]:
    """The optional parts this build of shoal has: "cli" (the `shoal` command line inside
    the extension), and of the command line "s3" (an S3 backing store), "fuse" (`shoal
    mount`), "top" (`shoal top`), "etcd" (membership on etcd). The quick start's build
    has "cli" alone;
    `SHOAL_FEATURES=full ./scripts/setup.sh` builds every one (docs/hacking.md, "Optional
    parts"). Without one, what needs it fails saying so."""
    return frozenset(_internal.features())


def build_info() -> dict[str, object]:
    """How this extension was built: "version", "features" (as `features()`) and
    "opt_level", cargo's optimisation level ("3" for the release build `scripts/setup.sh`
    makes; "1" for the one `scripts/test.sh` makes, which shares its dependencies with the
    tests' build). Timings mean something only from opt-level 3: the benchmarks refuse
    any other (`shoal.testing.require_optimized_build`)."""
    return {
        "version": __version__,
        "features": sorted(features()),
        "opt_level": _internal.opt_level(),
    }


def connect(
    socket: str | None = None, *, capacity: str | int | None = None, start: bool | None = None
) -> Client:
    """Connects to a shoal daemon.

    With no `socket`, uses $SHOAL_SOCKET or the per-user default and, if no daemon runs
    there, starts an embedded one (`capacity`, default 1 GiB) that exits when its last
    client has gone. With an explicit `socket`, the daemon must be running unless
    `start=True`.
    """
    from shoal.client import Client

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
    "HomeUnavailable",
    "InvalidArgument",
    "NodeUnavailable",
    "NotOwner",
    "ObjectAlreadySealed",
    "ObjectCorrupt",
    "NameTooLong",
    "ObjectExists",
    "ObjectID",
    "ObjectInUse",
    "ObjectInfo",
    "NameInfo",
    "ObjectNotFound",
    "ObjectNotSealed",
    "ObjectTooLarge",
    "PermissionDenied",
    "ProtocolError",
    "ShoalError",
    "StoreFull",
    "Subscription",
    "TableBuilder",
    "Timeout",
    "barrier",
    "connect",
    "build_info",
    "features",
]
