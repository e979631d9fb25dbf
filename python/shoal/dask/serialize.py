"""The `shoal` serialization family: a value that lies in a store object travels as the
object's id when the receiver reaches that object through shoal.

Dask tries the families a message asks for in order; `shoal.dask.Worker.get_data` puts
`shoal` first. `Worker` adds its store's identity and its shoal cluster's to the handshake
of every comm it opens (`Store.handshake`). `dumps` sends the 20-byte id of the object a
value was rebuilt over (`shoal.dask.backing`) when the receiving comm's handshake names
the same store (same host: the receiver maps the same pages) or a node of the same shoal
cluster (another host: the receiver's daemon gets the object from its owner, a network
pull into a copy in the receiver's store); otherwise it raises NotImplementedError, so
Dask goes on to its own families ("dask", "pickle") as before. `loads` takes the
receiver's own reference to the object and rebuilds the value over it; the data mapping
then adopts it without a second object. A value that is a part of an object (a projection
of a kept value, `layout.Part`) travels with its pickle stream and where its buffers lie,
to a receiver on the same store only (another would pull the whole object). A group
stored as pieces (`pieces.py`) travels as its items' ids and names, to the same store
only.
"""

from __future__ import annotations

from typing import Any

from distributed.protocol.serialize import register_serialization_family

from shoal import layout
from shoal.dask import backing, store
from shoal.dask.pieces import Pieces

NAME = "shoal"
#: The handshake key a shoal worker adds (`Store.handshake`: its store's and cluster's
#: identities).
HANDSHAKE_KEY = "shoal"


def dumps(value: Any, context: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[bytes]]:
    recipient = (context or {}).get("recipient") or {}
    theirs = recipient.get(HANDSHAKE_KEY)
    if isinstance(value, Pieces):
        # A shuffle group stored as pieces: its items' ids, to a receiver on the same store only.
        if not isinstance(theirs, dict) or theirs.get("store") != value.store.identity:
            raise NotImplementedError("pieces, for a receiver on another store")
        items = list(value.oids)
        header = {
            "store": value.store.identity,
            "pieces": items,
            "sizes": [value.sizes[i] for i in items],
            "names": None if value.names is None else [value.names[i] for i in items],
        }
        return header, [value.oids[i] for i in items]
    stored = backing.lookup(value)
    if stored is None:
        raise NotImplementedError("not a value rebuilt over a store object")
    header: dict[str, Any] = {"store": stored.store, "nbytes": stored.nbytes}
    frames = [stored.oid]
    if stored.part is not None:  # a view of the object: where its buffers lie in it
        header["part"] = [list(p) if isinstance(p, tuple) else None for p in stored.part.pieces]
        frames += [stored.part.stream, *(p for p in stored.part.pieces if isinstance(p, bytes))]
    if isinstance(theirs, dict) and theirs.get("store") == stored.store:
        return header, frames
    if stored.part is not None:
        # Another store would pull the whole object for a part of it: Dask's own path sends
        # only the part's bytes.
        raise NotImplementedError("a part of an object, for a receiver on another store")
    here = store.current()
    if here is None or here.identity != stored.store or here.reaches(theirs) != "cluster":
        raise NotImplementedError("the receiver reaches neither this store nor its cluster")
    header["cluster"] = here.cluster
    return header, frames


def loads(header: dict[str, Any], frames: list[Any]) -> Any:
    here = store.current()
    if here is None or here.reaches(header) is None:
        raise ValueError(
            "a shoal reference arrived at a process that reaches neither its store nor its cluster"
        )
    if "pieces" in header:
        oids = [bytes(frame) for frame in frames]
        return Pieces(
            here,
            dict(zip(header["pieces"], oids, strict=True)),
            dict(zip(header["pieces"], header["sizes"], strict=True)),
            None if header["names"] is None else dict(zip(header["pieces"], header["names"], strict=True)),
        )
    part = None
    if "part" in header:
        inline = iter(frames[2:])
        pieces = tuple(bytes(next(inline)) if p is None else (p[0], p[1]) for p in header["part"])
        part = layout.Part(bytes(frames[1]), pieces)
    stored, value = here.open_object(bytes(frames[0]), part=part)
    backing.received(value, stored)
    return value


def register() -> None:
    """Makes the family known to Dask in this process (importing shoal.dask does it)."""
    register_serialization_family(NAME, dumps, loads)
