"""Which store object backs which Python value in this process.

A worker's data mapping rebuilds each large value over its object and registers the pair
here; the `shoal` serialization family looks a value up to send its object's id instead of
its bytes, and a value that family received is held here until the data mapping adopts
it (so it is not copied into a second object). Values are found by identity: the mapping
holds each registered value, so its `id` stays its own while it is registered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal._internal import Buffer
    from shoal.layout import Part

#: Received values not yet adopted, kept at most: a value deserialized for anything else
#: than the data mapping (none today) must not be held forever.
RECEIVED_LIMIT = 256
#: Seconds after which a received value not adopted yet is taken for one that never will
#: be (its key released on the way): Dask adopts a value within its transfer's handling.
RECEIVED_STALE_S = 5.0


@dataclass
class Stored:
    """One value's object: its id, the store that holds it and this process's reference."""

    oid: bytes
    #: The store's identity (`store.Store.identity`).
    store: str
    #: The object's size in bytes.
    nbytes: int
    #: This process's reference to the object (a read-only view of it), kept while the key
    #: is held; None once released (an evicted value over a tiered store: the tiers may
    #: move the bytes down, a get brings them back).
    buffer: Buffer | None
    #: A value that is a part of the object (`layout.Part`: a projection of the value laid
    #: out there) rather than the value laid out in it.
    part: Part | None = None


#: id(value) → (value, the object it lies in, how many keys registered it): an alias key
#: holds the very value of the key it aliases.
_values: dict[int, tuple[Any, Stored, int]] = {}
_received: OrderedDict[int, tuple[Any, Stored, float]] = OrderedDict()


def register(value: Any, stored: Stored) -> None:
    """`value` was rebuilt over `stored`'s object (the caller keeps `value` alive until
    `unregister`); one `unregister` per `register`."""
    entry = _values.get(id(value))
    if entry is not None and entry[0] is value:
        _values[id(value)] = (value, entry[1], entry[2] + 1)
    else:
        _values[id(value)] = (value, stored, 1)


def unregister(value: Any) -> None:
    entry = _values.get(id(value))
    if entry is not None and entry[0] is value:
        if entry[2] > 1:
            _values[id(value)] = (value, entry[1], entry[2] - 1)
        else:
            del _values[id(value)]


def lookup(value: Any) -> Stored | None:
    """The object `value` was rebuilt over, or None (a value held in process memory)."""
    entry = _values.get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None


def received(value: Any, stored: Stored) -> None:
    """`value` arrived from another worker as a reference to `stored`."""
    _received[id(value)] = (value, stored, time.monotonic())
    while len(_received) > RECEIVED_LIMIT:
        _received.popitem(last=False)


def drop_received(older_than: float | None = None) -> int:
    """Forgets the received values not adopted `older_than` seconds (default
    `RECEIVED_STALE_S`) after they arrived (their store references go with the last of
    their other holders); returns how many. Why: one that is never adopted (its key
    released while it was on its way) would keep its object referenced until
    `RECEIVED_LIMIT` newer values arrive, which a full store cannot wait for. Younger
    ones may be a transfer in progress, which a drop would turn into a copy."""
    cutoff = time.monotonic() - (RECEIVED_STALE_S if older_than is None else older_than)
    stale = [key for key, (_, _, at) in _received.items() if at <= cutoff]
    for key in stale:
        _received.pop(key, None)
    return len(stale)


def take_received(value: Any) -> Stored | None:
    """The object a received `value` lies in, forgotten here (the caller adopts it)."""
    # An entry holds its value alive, so no other live value can have its id.
    entry = _received.pop(id(value), None)
    return None if entry is None else entry[1]
