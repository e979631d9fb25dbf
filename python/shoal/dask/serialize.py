"""The `shoal` serialization family: a value that lies in a store object travels as the
object's id when the receiver reaches the same store.

Dask tries the families a message asks for in order; `shoal.dask.Worker.get_data` puts
`shoal` first. `dumps` sends the 20-byte id of the object a value was rebuilt over
(`shoal.dask.backing`) when the receiving comm's handshake names the same store
(`Worker` adds its store's identity to the handshake), and otherwise raises
NotImplementedError, so Dask goes on to its own families ("dask", "pickle") as before.
`loads` takes the receiver's own reference to the object and rebuilds the value over the
same pages; the data mapping then adopts it without a second object.
"""

from __future__ import annotations

from typing import Any

from distributed.protocol.serialize import register_serialization_family

from shoal.dask import backing, store

NAME = "shoal"
#: The handshake key a shoal worker adds (its store's identity).
HANDSHAKE_KEY = "shoal"


def dumps(value: Any, context: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[bytes]]:
    stored = backing.lookup(value)
    if stored is None:
        raise NotImplementedError("not a value rebuilt over a store object")
    recipient = (context or {}).get("recipient") or {}
    if recipient.get(HANDSHAKE_KEY) != stored.store:
        raise NotImplementedError("the receiver does not reach this store")
    return {"store": stored.store, "nbytes": stored.nbytes}, [stored.oid]


def loads(header: dict[str, Any], frames: list[Any]) -> Any:
    here = store.current()
    if here is None or here.identity != header["store"]:
        raise ValueError("a shoal reference arrived at a process that does not reach its store")
    stored, value = here.open_object(bytes(frames[0]))
    backing.received(value, stored)
    return value


def register() -> None:
    """Makes the family known to Dask in this process (importing shoal.dask does it)."""
    register_serialization_family(NAME, dumps, loads)
