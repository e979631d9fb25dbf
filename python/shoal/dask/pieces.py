"""A dict of values stored as one object per item (a shuffle's group), and the key that
takes one of them unchanged (a split) taking its object over.

Dask's tasks shuffle splits each partition into a dict {output index: frame} (a group)
and runs one task per index that takes its piece out (`operator.getitem`); a task per
output partition then concatenates its pieces. Laid out as one object, the group was
read (and restored) whole for each split, and each split's piece was copied into an
object of its own: a second copy of the data per shuffle stage, written to the tier and
restored again for the concatenation.

On a tiered store such a dict is stored as one object per item, named `<key's
name>/<item>`, under the key's directory (the scheduler plugin deletes them with the key).
`Pieces` is the value the data mapping hands out for the key: a read-only mapping whose
items are rebuilt over their objects when read (each read takes its own reference,
which goes with the value). Pickled, for Dask's own transfer to a worker of another
store, it is the dict again, of its type.

A task that returns an item unchanged (the split) *claims* its object: the data mapping
renames the object to the task's key (no copy), so the group's deletion no longer takes
it. The scheduler is told first (`shoal-claimed`) and deletes a claimant's objects only
once its group has left memory too: until then the group may be read for that item
again, and its objects are found by id under the claimant's name.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dask.sizeof import sizeof

from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.client import NameInfo
    from shoal.dask.backing import Stored
    from shoal.dask.store import Store

#: A dict is stored as pieces only with at most this many items (each costs a create; a
#: tasks shuffle's groups have up to 32, Dask's default `max_branch`).
MAX_PIECES = 256


def worth_pieces(value: Any) -> bool:
    """Whether `value` is stored as pieces: a dict of 2 to MAX_PIECES items keyed by ints (a
    shuffle's group: pandas' is `ShuffleGroupResult`, a dict subclass that only sizes
    itself differently), of a type that reads items as dict does and carries nothing else
    (no `__missing__`, no attributes). Anything else is laid out in one object."""
    kind = type(value)
    return (
        isinstance(value, dict)
        and kind.__getitem__ is dict.__getitem__
        and not hasattr(kind, "__missing__")
        and not getattr(value, "__dict__", None)
        and 2 <= len(value) <= MAX_PIECES
        and all(type(item) is int for item in value)
    )


def _rebuilt(kind: type[dict[int, Any]], items: dict[int, Any]) -> dict[int, Any]:
    """A dict of type `kind` holding `items` (a pickled `Pieces`), without calling its
    `__init__`, whose arguments a subclass may define otherwise."""
    value = kind.__new__(kind)
    dict.update(value, items)
    return value


class Pieces(Mapping[int, Any]):
    """A stored dict's items, each in an object of its own (the module docstring)."""

    def __init__(
        self,
        store: Store,
        oids: dict[int, bytes],
        sizes: dict[int, int],
        kind: type[dict[int, Any]] = dict,
        names: dict[int, str] | None = None,
    ) -> None:
        self.store = store
        #: item → its object's id, and that object's size.
        self.oids = oids
        self.sizes = sizes
        #: The stored dict's type (a dict subclass, `worth_pieces`).
        self.kind = kind
        #: item → its object's name, None for unnamed objects (which nothing claims).
        self.names = names
        #: The key this process holds the value under (set by the data mapping).
        self.key: Any = None
        #: Items whose objects a key of this process claimed (`claim`).
        self.claimed: set[int] = set()

    def __getitem__(self, item: int) -> Any:
        """Item `item` rebuilt over its object (restored from a tier if it left memory).
        Raises KeyError for an item the dict did not have, ObjectNotFound once the key's
        objects were deleted. While a split task runs (`splitting`): the item unread, an
        `Item` for the data mapping to claim."""
        oid = self.oids[item]
        if splitting.get():
            return Item(self, item)
        stored, value = self.store.open_object(oid)
        at = id(value)
        try:
            ref = weakref.ref(value, lambda _: _handed.pop(at, None))
        except TypeError:
            return value  # no weak reference to it: it cannot be recognised, nor claimed
        _handed[at] = (ref, stored, self, item)
        return value

    def claim(self, item: int, name: str) -> bool:
        """Moves the object of `item` to `name` (the claimant key's), no longer under this
        key's name, whose deletion then leaves it. False, and nothing changed, when the
        object is not named, was claimed already here, or is not under this key's name
        any more (another process of the store claimed it)."""
        source = None if self.names is None else self.names.get(item)
        if source is None or item in self.claimed:
            return False
        try:
            self.store.client.rename(source, name)
        except ShoalError:
            return False
        self.claimed.add(item)
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(self.oids)

    def __len__(self) -> int:
        return len(self.oids)

    @property
    def nbytes(self) -> int:
        """Bytes of the items' objects."""
        return sum(self.sizes.values())

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (Dask's own transfer, to a process of another store), it is the dict.
        return (_rebuilt, (self.kind, dict(self.items())))

    def __repr__(self) -> str:
        return f"Pieces({len(self)} items, {self.nbytes} bytes)"


#: Items `Pieces` handed out and still alive, by id: (a weak reference to the value, its
#: record with the reference the value holds, its Pieces, its item).
_handed: dict[int, tuple[weakref.ref[Any], Stored, Pieces, int]] = {}


def handed(value: Any) -> tuple[Stored, Pieces, int] | None:
    """If `value` is an item a `Pieces` of this process handed out, unchanged: its record,
    its Pieces and its item; else None."""
    entry = _handed.get(id(value))
    if entry is None or entry[0]() is not value:
        return None
    return entry[1], entry[2], entry[3]


@dataclass(frozen=True)
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
        with _reading():
            return self.pieces[self.item]


#: True while this context runs a split task: `operator.getitem` of a `Pieces` (set by the
#: worker around such a task; Dask runs it in a thread with a copy of this context).
splitting: ContextVar[bool] = ContextVar("shoal_splitting", default=False)


@contextmanager
def _reading() -> Iterator[None]:
    token = splitting.set(False)
    try:
        yield
    finally:
        splitting.reset(token)


def find(store: Store, prefix: str) -> Pieces | None:
    """A dict stored as pieces under directory `prefix` (a key's: `prefix/<worker>/<item>`,
    any worker's), or None. Items a split claimed are under the split's name, not here."""
    try:
        rows = store.client.ls(prefix)
    except ShoalError as err:
        store.failed(err, "a lookup")
        return None
    by_worker: dict[str, dict[int, NameInfo]] = {}
    for row in rows:
        below = row.name[len(prefix.rstrip("/")) + 1 :].split("/")
        if len(below) == 2 and below[1].lstrip("-").isdigit():
            by_worker.setdefault(below[0], {})[int(below[1])] = row
    for items in by_worker.values():
        oids = {item: row.id.binary() for item, row in items.items()}
        sizes = {item: row.size for item, row in items.items()}
        return Pieces(store, oids, sizes, names={item: row.name for item, row in items.items()})
    return None


@sizeof.register(Pieces)
@sizeof.register(Item)
def _sizeof_stored(value: Pieces | Item) -> int:
    return value.nbytes
