"""A tasks shuffle's groups stored one object per piece, and each split taking its piece's
object over.

Dask's tasks shuffle splits each partition into a group, a dict {output index: frame}
(`ShuffleGroupResult`), and runs one task per index that takes its piece out
(`operator.getitem`, a *split*); a task per output partition then concatenates its
pieces. Laid out as one object, the group was read (and restored) whole for each split,
and each split's piece was copied into an object of its own: a second copy of the data
per shuffle stage, written to the tier and restored again for the concatenation.

On a tiered store a group is stored one object per piece, named `<key's
name>/<item>-of-<count>`, under the key's directory (the scheduler plugin deletes them
with the key). `Pieces` is the value the data mapping hands out for the key: a read-only
mapping whose items are rebuilt over their objects when read. Pickled, for Dask's own
transfer to a worker of another store, it is the group again.

A split runs with `splitting` set (the worker sets it around a task that is `getitem` of
such an input): it gets its item unread, an `Item`, and the data mapping *claims* the
object for the split's key: the object's time is set to now (so a delete of the split's
name sent before, for an earlier run of the key, leaves it) and it is renamed to the
split's name, then the scheduler is told (`shoal-claimed`, before the task's report).
The same key computed again, in any process, finds its name holding the object and
claims it again. The split reads and copies nothing.
The scheduler deletes a claimant's objects only once its group has left memory too: until
then the group may be read for that item again, and finds the object by id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from dask.sizeof import sizeof

from shoal.dask.store import Store, names_below
from shoal.errors import ShoalError

#: A group is stored as pieces only with at most this many items (each costs a create; a
#: tasks shuffle's groups have up to 32, Dask's default `max_branch`).
MAX_PIECES = 256
#: An item's name below its key's: `<worker>/<item>-of-<count>` (`find` needs the count
#: to tell a whole group from one whose items were claimed).
_ITEM = re.compile(r"(-?\d+)-of-(\d+)")


#: pandas' shuffle group (`dask.dataframe.backends.ShuffleGroupResult`, a dict subclass
#: that only sizes itself otherwise), by name: importing dask.dataframe costs every worker
#: pandas and pyarrow.
_GROUP = ("dask.dataframe.backends", "ShuffleGroupResult")


def worth_pieces(value: Any) -> bool:
    """Whether `value` is stored as pieces: a shuffle's group of 2 to MAX_PIECES items
    keyed by ints. Only that type: any other dict a task returns stays a dict for the
    tasks reading it (a `Pieces` is a read-only mapping, not a dict)."""
    kind = type(value)
    return (
        (kind.__module__, kind.__qualname__) == _GROUP
        and 2 <= len(value) <= MAX_PIECES
        and all(type(item) is int for item in value)
    )


def group_of(items: Any) -> Any:
    """A shuffle group holding `items` (pairs or a mapping)."""
    from dask.dataframe.backends import ShuffleGroupResult

    return ShuffleGroupResult(items)


def item_name(name: str, item: int, count: int) -> str:
    """The name of item `item` of a group of `count` items whose key's object is `name`."""
    return f"{name}/{item}-of-{count}"


class Pieces(Mapping[int, Any]):
    """A stored group's items, each in an object of its own (the module docstring)."""

    def __init__(
        self,
        store: Store,
        oids: dict[int, bytes],
        sizes: dict[int, int],
        names: dict[int, str] | None = None,
    ) -> None:
        self.store = store
        #: item → its object's id, and that object's size.
        self.oids = oids
        self.sizes = sizes
        #: item → its object's name, None for unnamed objects (which nothing claims).
        self.names = names
        #: The key a data mapping of this process holds the value under (`StoreData`).
        self.key: Any = None
        #: Items whose objects a key of this process claimed (no longer under `names`).
        self.claimed: set[int] = set()

    def __getitem__(self, item: int) -> Any:
        """Item `item` rebuilt over its object (restored from a tier if it left memory).
        Raises KeyError for an item the group did not have, ObjectNotFound once the key's
        objects were deleted. While a split runs (`splitting`), the item comes unread, as
        an `Item` for the data mapping to claim (a key computed again claims it again)."""
        self.oids[item]  # KeyError for an item the group did not have
        if splitting.get() and self.names is not None:
            return Item(self, item)
        return self.read(item)

    def read(self, item: int) -> Any:
        """Item `item` rebuilt over its object."""
        return self.store.open_object(self.oids[item])[1]

    def claim(self, item: int, name: str) -> bool:
        """Moves the object of `item` to `name` (the claimant key's), timed now, no longer
        under this key's name, whose deletion then leaves it. True too when `name` holds
        it already (the same key computed again here). False, and nothing changed, when
        the object is not named, was claimed under another name, or its name no longer
        holds it (another process of the store claimed it; the key was computed again)."""
        source = None if self.names is None or item in self.claimed else self.names.get(item)
        if source is None or not self._holds(source, item):
            # Not under the group's name: `name` holds it if this key claimed it before
            # (computed again, here or in another process).
            source = name
            if not self._holds(name, item):
                return False
        client = self.store.client
        try:
            # Timed before it moves: a delete of `name` sent for an earlier run of the
            # claimant (objects sealed before it was sent) must leave this one.
            client.set_mtime(source, time.time())
            if source != name:
                client.rename(source, name)
        except ShoalError:
            return False
        self.claimed.add(item)
        return True

    def _holds(self, name: str, item: int) -> bool:
        """Whether `name` is bound to the object of `item`."""
        try:
            return self.store.client.stat(name).id.binary() == self.oids[item]
        except ShoalError:
            return False

    def __iter__(self) -> Iterator[int]:
        return iter(self.oids)

    def __len__(self) -> int:
        return len(self.oids)

    @property
    def nbytes(self) -> int:
        """Bytes of the items' objects."""
        return sum(self.sizes.values())

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (Dask's own transfer, to a process of another store), it is the group.
        group = group_of(self.items())
        return (type(group), (dict(group),))

    def __repr__(self) -> str:
        return f"Pieces({len(self)} items, {self.nbytes} bytes)"


@dataclass(frozen=True, eq=False)
class Item:
    """Item `item` of `pieces`, unread: what a split task returns (`splitting`). The data
    mapping claims its object for the task's key, or reads it (`read`) to store it as any
    value. Why: a split only passes its piece on; reading it restored it from the tier
    once for the split and again for the task that concatenates it."""

    pieces: Pieces
    item: int

    @property
    def nbytes(self) -> int:
        return self.pieces.sizes[self.item]

    def read(self) -> Any:
        """The item, rebuilt over its object."""
        return self.pieces.read(self.item)


#: True while this context runs a split task: `operator.getitem` of a `Pieces` (set by the
#: worker around such a task; Dask's thread-pool executor runs it with a copy of this
#: context).
splitting: ContextVar[bool] = ContextVar("shoal_splitting", default=False)


def find(store: Store, prefix: str) -> Pieces | None:
    """A group stored as pieces under directory `prefix` (a key's:
    `prefix/<worker>/<item>-of-<count>`, any worker's) with every item there, or None.
    A split claimed an item of it: the item is under the split's name, so the group is
    not whole here, and the key is computed again rather than adopted without it."""
    try:
        rows = store.client.ls(prefix)
    except ShoalError as err:
        store.failed(err, "a lookup")
        return None
    by_worker: dict[str, dict[int, Any]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        below = names_below(prefix, row.name)
        match = _ITEM.fullmatch(below[1]) if len(below) == 2 else None
        if match is not None:
            by_worker.setdefault(below[0], {})[int(match.group(1))] = row
            counts[below[0]] = int(match.group(2))
    for worker, items in by_worker.items():
        if len(items) != counts[worker]:
            continue
        oids = {item: row.id.binary() for item, row in items.items()}
        sizes = {item: row.size for item, row in items.items()}
        return Pieces(store, oids, sizes, names={item: row.name for item, row in items.items()})
    return None


@sizeof.register(Pieces)
@sizeof.register(Item)
def _sizeof_stored(value: Pieces | Item) -> int:
    return value.nbytes
