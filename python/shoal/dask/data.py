"""A worker's `data=` mapping over a shoal store.

A value at least `threshold` bytes (Dask's `sizeof`) whose bytes pickle out of band
(Arrow tables and batches, pandas frames, numpy arrays, anything pickle protocol 5 gives
buffers for) goes into one store object (create → write → seal, named after its key);
the mapping keeps the value rebuilt over the object and drops the private copy. Smaller
values, and any value the store refuses, stay with Dask: in a `distributed.spill`
SpillBuffer when the worker has a memory limit (Dask's own spilling), else a dict.

Spilling by tiering, on a store with a tier below memory (a burst buffer, a backing
store): the mapping keeps its most recently used values mapped, `hold` bytes of their
objects at most (default an eighth of the store's capacity), and releases the older
ones: their bytes stay in the store, unreferenced, so the daemon evicts them down a tier
when memory is short and brings them back by id when the key is read again. Values the
scheduler says no task waits for and a client keeps (`cool`) are released at once and
leave memory before any other, the most recently cooled first: a job that scans a
persisted collection larger than memory then restores what the store cannot hold once,
not every value on every pass (LRU would evict each value just before the scan comes
back to it). A create or a read that finds the store full of referenced objects
releases every value the mapping holds and asks again (`Store.make_room`).

Young values: with `young` > 0 a new value stays private until another worker asks for
it, a client keeps it, newer ones need the room or the memory monitor evicts
(`promote`); most values are read by the next task here and forgotten, and never need an
object. A value that is another key's, unchanged (an alias task), shares its object, and
so does one that views a part of it (a column projection: `layout.Part`).

A tasks shuffle's groups go into the store one object per piece on a tiered store, and a
split takes its piece's object over, unread, instead of copying it (`pieces.py`).

On a store without tiers every value stays referenced (an unreferenced object there could
be evicted for good).

Dask's memory monitor calls `evict()` when the process's private memory passes the
spill threshold (distributed's `ManualEvictProto`): a value held privately moves into
the store (spilling by tiering instead of pickling to the worker's disk); with none
left, the oldest view over the store is dropped, which frees nothing of the process but
leaves the object to the store's tiers. An evicted key comes back by mapping its
object again; its large buffers are never copied.
"""

from __future__ import annotations

import gc
import logging
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

from dask.sizeof import sizeof

from shoal import layout
from shoal.dask import backing, pieces
from shoal.dask.backing import Stored
from shoal.dask.pieces import Pieces, worth_pieces
from shoal.dask.store import ROOM_ASK_MS, Store
from shoal.errors import ShoalError, StoreFull

log = logging.getLogger("distributed.worker.shoal")

#: Values smaller than this stay with Dask (a store object costs a create, a copy and a
#: name; below this size Dask's own handling is as cheap and sends no fewer bytes).
DEFAULT_THRESHOLD = 64 * 1024
#: Young values that view store objects, at most: each keeps a whole object referenced
#: (a piece of 1 MiB may hold one of 32), so beyond these the oldest goes into the store as
#: a copy of its own. Two: a task's result read by the next task (a column projection).
YOUNG_VIEWS = 2
#: A value that views part of a kept key's object shares it only if it views at least this
#: fraction of it (an eighth: one column of a set_index's four still does): a smaller piece
#: would keep the whole object referenced, be restored whole and count whole against
#: `hold`; it gets a copy of its own instead.
PART_SHARE = 8
#: On a tiered store, the share of its capacity one worker keeps mapped by default: the
#: store's other workers and the objects tasks are using need the rest.
DEFAULT_HOLD_SHARE = 8


class _Fast:
    """What Dask's memory monitor tests for emptiness: values held in this process."""

    def __init__(self, data: StoreData) -> None:
        self._data = data

    def __len__(self) -> int:
        return len(self._data._private_fast()) + len(self._data._views) + len(self._data._young)


class StoreData(MutableMapping[Any, Any]):
    """`Worker(data=...)`: keys → values, large values living in the store."""

    def __init__(
        self,
        store: Store,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        private: MutableMapping[Any, Any] | None = None,
        hold: int | None = None,
        young: int = 0,
    ) -> None:
        """`private` holds what stays with Dask (default a dict; the worker passes a
        SpillBuffer when it has a memory limit). `hold`: bytes of objects kept mapped on
        a tiered store (the module docstring; default capacity / DEFAULT_HOLD_SHARE). `young`:
        bytes of new values kept private until they are shared (`promote`), short of room
        or known to be kept (0: every value goes into the store at once)."""
        self.store = store
        self.threshold = threshold
        self._private: MutableMapping[Any, Any] = {} if private is None else private
        #: key → its object, for every key whose value lives in the store.
        self._stored: dict[Any, Stored] = {}
        #: key → its items' objects, for every key whose value is a shuffle group stored as pieces
        #: (a shuffle's group, `pieces.py`): nothing of them is held mapped here.
        self._pieces: dict[Any, Pieces] = {}
        #: key → the value rebuilt over its object, oldest use first.
        self._views: OrderedDict[Any, Any] = OrderedDict()
        #: Bytes of the objects under `_views`.
        self._held = 0
        self.young = young
        #: [start, end) of the store's memory in this process.
        self._region = (store.client.region_address, store.client.region_address + store.client.region_size)
        #: New values kept private until promoted, oldest first: key → (value, its bytes by
        #: `sizeof`); and those bytes in all.
        self._young: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._young_bytes = 0
        #: Young values that are views of store objects (`_views_the_store`).
        self._young_views: set[Any] = set()
        #: Objects of keys a client keeps (`keep`; cooled ones too) → the first such key:
        #: read ahead of their tasks, and an alias may share them.
        self._kept_oids: dict[bytes, Any] = {}
        #: Keys whose value is a kept key's, unchanged (an alias task returned its input) or
        #: a view of a part of it (`_part`):
        #: they share its object, which is deleted only once no client keeps that key (and
        #: a graph over a persisted collection keeps it: dask-expr's holds its futures).
        self._aliases: set[Any] = set()
        #: Objects cooled while an alias still lies in them: cooled once the last such alias
        #: is forgotten. Cooled at once, the object is the first the store evicts as soon as
        #: the alias's view is released, and the task reading the alias restores it again.
        self._cool_later: set[bytes] = set()
        self.hold = hold if hold is not None else store.capacity // DEFAULT_HOLD_SHARE
        #: key → the object's name; set by the worker once it knows its own name.
        self.name_of: Callable[[Any], str | None] = lambda key: None
        #: Whether a claim can be told to whoever deletes objects, and tells them that `key`
        #: claimed an item of `source`'s pieces (`pieces.py`): the worker tells the
        #: scheduler (before it reports the task); with none, this process deletes
        #: objects itself.
        self.can_claim: Callable[[], bool] = lambda: True
        self.on_claim: Callable[[Any, Any], None] = lambda key, source: None
        #: Values put into the store, keys evicted and values released to the tiers, since
        #: start (for tests and logs).
        self.stored_count = 0
        #: Of those, shuffle groups stored one object per piece (`pieces.py`); and splits
        #: that took their piece's object over (no read, no copy).
        self.pieces_count = 0
        self.claimed_count = 0
        self.evicted_count = 0
        self.released_count = 0
        #: Times a create or a read found the store full and this mapping released all it
        #: held (`release_all`), and the seconds that took.
        self.rooms_made = 0
        self.room_making_s = 0.0
        if store.tiered:
            store.make_room = self.release_all

    def keep_private_in(self, private: MutableMapping[Any, Any]) -> None:
        """Holds what stays with Dask in `private` (empty; before any value arrives)."""
        if len(self) or len(private):
            raise ValueError("keep_private_in needs both mappings empty")
        self._private = private

    # -- Dask's ManualEvictProto --------------------------------------------------------------

    @property
    def fast(self) -> _Fast:
        return _Fast(self)

    @property
    def slow(self) -> dict[Any, Stored]:
        """Keys in the store with no value rebuilt in this process."""
        return {k: s for k, s in self._stored.items() if k not in self._views}

    def evict(self) -> int:
        """Moves the oldest privately held value into the store, or (none left) drops the
        oldest view over the store. Returns the private bytes freed (0 for a view), -1 if
        nothing could be evicted; never raises (the value stays where it was)."""
        try:
            if self._young:
                return self._promote(next(iter(self._young)))
            fast = self._private_fast()
            if fast:
                return self._evict_private(next(iter(fast)))
            if self._views:
                self._drop_view(next(iter(self._views)))
                self.evicted_count += 1
                return 0
        except Exception:
            log.exception("shoal: evict failed")
        return -1

    def _private_fast(self) -> Any:
        """The privately held values still in memory (a SpillBuffer's fast part)."""
        return getattr(self._private, "fast", self._private)

    def _evict_private(self, key: Any) -> int:
        value = self._private[key]
        size = sizeof(value)
        if self._store_value(key, value, force=True):
            del self._private[key]
            self.evicted_count += 1
            return size
        # The store refused it: Dask's own spilling, where the worker has it.
        spill = getattr(self._private, "evict", None)
        return spill() if spill is not None else -1

    # -- the mapping ---------------------------------------------------------------------------

    def __setitem__(self, key: Any, value: Any) -> None:
        if key in self:
            del self[key]
        if isinstance(value, Pieces):
            if value.store.identity == self.store.identity and value.key in (None, key):
                # Another worker's group, or a dead worker's (`pieces.find`): no copy.
                value.key = key
                self._pieces[key] = value
                return
            # Another key's group (a task returned it unchanged): its objects go with that
            # key, so this one gets its own.
            value = pieces.group_of(value.items())  # its items over store memory: one copy
        if self._claim(key, value):
            return
        if isinstance(value, pieces.Item):  # not claimed: stored as the item itself
            value = value.read()
        stored = backing.take_received(value)
        if stored is not None:  # a reference another worker sent: no second object
            if stored.part is not None:  # a view of another key's object: an alias here too
                self._aliases.add(key)
            self._keep(key, stored, value)
            return
        stored = self._share(value)
        size, pickled = 0, None
        if stored is None:
            size = sizeof(value)
            if self._kept_oids and self.store.usable and size >= self.threshold:
                pickled, stored = self._part(value)
        if stored is not None:  # another key's value, or a view of it: no second object
            self._aliases.add(key)
            self._keep(key, stored, value)
            return
        if self._keep_young(key, value, size, pickled):
            return
        if not self._store_value(key, value, force=False, size=size, pickled=pickled):
            self._private[key] = self._detached(value, size)

    def _detached(self, value: Any, size: int) -> Any:
        """`value` as Dask may keep it privately: a small value whose buffers lie in store
        memory (a shuffle's split of a group, under the threshold) becomes a copy of its
        own, since as a view it keeps the whole object it lies in referenced for as long as
        Dask holds it. Under pressure a set_index held 160 such pieces at once, each
        pinning a group of 30-57 MB: memory filled with objects nobody read, and reads
        waited for room until they failed. Larger values stay as they are, and so does a
        value whose buffers are larger than its size says (an object wrapping a large
        array): a copy of those would be private memory Dask does not count. `size`: its
        `sizeof`."""
        if isinstance(value, (str, bytes, int, float, bool, type(None))) or size >= self.threshold:
            return value
        try:
            pickled = layout.pickle_value(value)
        except Exception:
            return value  # not picklable out of band: no buffer to copy
        if pickled.out_of_band >= self.threshold or not self._in_store(pickled.buffers):
            return value
        try:
            return pickle.loads(pickled.stream, buffers=[bytearray(b) for b in pickled.buffers])
        except Exception:
            return value  # a type that does not rebuild over copies: kept as the view it is

    def _keep_young(self, key: Any, value: Any, size: int, pickled: layout.Pickled | None) -> bool:
        """Keeps `value` (of `sizeof` `size`; `pickled`, if the caller has it so) young if it
        fits `young` and would go into the store; promotes the oldest young values beyond
        the bounds. Returns whether it was kept."""
        if not self.young or not self.store.usable:
            return False
        if not self.threshold <= size <= self.young:
            return False
        if self._in_store(pickled.buffers) if pickled is not None else self._views_the_store(value):
            while len(self._young_views) >= YOUNG_VIEWS:
                self._promote(next(k for k in self._young if k in self._young_views))
            self._young_views.add(key)
        self._young[key] = (value, size)
        self._young_bytes += size
        while self._young_bytes > self.young:
            self._promote(next(iter(self._young)))
        return True

    def _views_the_store(self, value: Any) -> bool:
        """Whether a buffer of `value` lies in the store's memory: a piece of another value
        (a column projection, a shuffle's split of a group), which while young keeps that
        whole object referenced; stored, it is a copy of its own and the other can go."""
        try:
            buffers = layout.pickle_value(value).buffers
        except Exception:
            return False  # not picklable out of band: it would stay private anyway
        return self._in_store(buffers)

    def _in_store(self, buffers: list[memoryview]) -> bool:
        """Whether one of `buffers` lies in the store's memory."""
        low, high = self._region
        return any(b.nbytes and low <= layout.address(b) < high for b in buffers)

    def promote(self, keys: Iterable[Any]) -> None:
        """Moves the young values of `keys` into the store: another worker asks for them,
        or a client keeps them."""
        for key in keys:
            if key in self._young:
                self._promote(key)

    def _promote(self, key: Any) -> int:
        """Moves young `key` into the store (or, refused, to Dask's own keeping); returns
        its private bytes."""
        value, size = self._young.pop(key)
        self._young_bytes -= size
        self._young_views.discard(key)
        if not self._store_value(key, value, force=False):
            self._private[key] = value
        return size

    def _share(self, value: Any) -> Stored | None:
        """A reference of this process's own to the object `value` already lies in, if it
        is a kept key's (a value this mapping rebuilt over this store), or None. Not for an
        intermediate's object: it is deleted when that key is forgotten, which the alias
        may outlive, and holding a reference meanwhile would pin it in memory (alias tasks
        run ahead of the tasks that read them)."""
        source = backing.lookup(value)
        if source is None or source.store != self.store.identity or source.oid not in self._kept_oids:
            return None
        buffer = source.buffer
        if buffer is None:
            try:  # the value's arrays keep the object referenced: it is in memory
                buffer = self.store.client.get_buffer(source.oid, timeout_ms=0)
            except ShoalError:
                return None
        return Stored(source.oid, source.store, source.nbytes, buffer, source.part)

    def _part(self, value: Any) -> tuple[layout.Pickled | None, Stored | None]:
        """`value` pickled, and a record of it as a part of a kept key's object it views
        (a column projection or a slice of a persisted partition, which pandas'
        copy-on-write makes of views), or None: then it is a value of its own. Why: in a
        groupby over a persisted frame every partition's projection was copied into an
        object of its own, a second copy of the frame crowding the first out of memory.
        Kept keys' objects only, as for `_share`."""
        try:
            pickled = layout.pickle_value(value)
        except Exception:
            return None, None  # not picklable out of band: it stays with Dask
        if pickled.out_of_band < self.threshold or not self._in_store(pickled.buffers):
            return pickled, None
        for key in self._views:
            source = self._stored[key]
            if source.buffer is None or source.part is not None or source.oid not in self._kept_oids:
                continue
            part = layout.part_of(pickled, source.buffer, self.threshold)
            if part is not None and part.inside * PART_SHARE >= source.nbytes:
                return pickled, Stored(source.oid, source.store, source.nbytes, source.buffer, part)
        return pickled, None

    def _unalias(self, key: Any) -> None:
        """Gives alias `key` an object of its own (one copy): a client keeps it, so it may
        outlive the key whose object it shares."""
        value = self[key]
        shared = self._stored.pop(key)
        self._alias_gone(key, shared.oid)
        view = self._views.pop(key, None)
        if view is not None:
            backing.unregister(view)
            self._held -= shared.nbytes
        if not self._store_value(key, value, force=True):
            self._private[key] = value
        shared.buffer = None

    def _store_value(
        self,
        key: Any,
        value: Any,
        *,
        force: bool,
        size: int | None = None,
        pickled: layout.Pickled | None = None,
    ) -> bool:
        """Puts `value` (its `sizeof` `size` and `pickled` if the caller has them) into the
        store if it belongs there (`force`: any picklable value, as for an eviction);
        returns whether it went."""
        if not self.store.usable:
            return False
        if not force and (sizeof(value) if size is None else size) < self.threshold:
            return False
        name = self.name_of(key)
        if self.store.tiered and worth_pieces(value):
            stored_as_pieces = self._store_pieces(key, value, name)
            if stored_as_pieces is not None:
                return stored_as_pieces
        try:
            pickled = pickled or layout.pickle_value(value)
        except Exception:
            return False  # not picklable out of band: Dask keeps it as it is
        if not force and pickled.out_of_band < len(pickled.stream):
            return False  # mostly in-band: a rebuilt value would be a copy, not a view
        try:
            try:
                stored, view = self.store.put(pickled, name)
            except StoreFull:
                if not self.release_all():
                    raise
                # Released: the daemon moves them down as the create needs room.
                stored, view = self.store.put(pickled, name, timeout_ms=ROOM_ASK_MS)
        except Exception as err:
            self.store.failed(err, "a value")
            return False
        self._keep(key, stored, view)
        self.stored_count += 1
        return True

    def _store_pieces(self, key: Any, value: dict[int, Any], name: str | None) -> bool | None:
        """Stores shuffle group `value` as one object per item (`pieces.py`, named after
        `name`); returns whether it went, or None for a group whose items do not all
        pickle out of band (then it is laid out in one object, as any value). A failed
        create deletes the items stored before it."""
        try:
            pickled = {item: layout.pickle_value(piece) for item, piece in value.items()}
        except Exception:
            return None
        if sum(p.out_of_band for p in pickled.values()) < sum(len(p.stream) for p in pickled.values()):
            return None  # mostly in-band: decided as one value
        oids: dict[int, bytes] = {}
        sizes: dict[int, int] = {}
        names = (
            None if name is None else {item: pieces.item_name(name, item, len(pickled)) for item in pickled}
        )
        try:
            for item, piece in pickled.items():
                piece_name = None if names is None else names[item]
                try:
                    oid = layout.store(self.store.client, piece, name=piece_name)
                except StoreFull:
                    if not self.release_all():
                        raise
                    oid = layout.store(self.store.client, piece, name=piece_name, timeout_ms=ROOM_ASK_MS)
                oids[item], sizes[item] = oid.binary(), piece.size
        except Exception as err:
            if oids:
                try:
                    self.store.client.delete(list(oids.values()))
                except ShoalError:
                    pass  # gone with the store: nothing left to delete
            self.store.failed(err, "a value")
            return False
        self._pieces[key] = Pieces(self.store, oids, sizes, names)
        self._pieces[key].key = key
        self.stored_count += 1
        self.pieces_count += 1
        return True

    def _claim(self, key: Any, value: Any) -> bool:
        """Takes the object of a group's item over for `key` if `value` is one, unread (a
        shuffle's split: `pieces.Item`; no read, no copy). Returns whether it did."""
        if not isinstance(value, pieces.Item):
            return False
        group, item = value.pieces, value.item
        name = self.name_of(key)
        if name is None or not self.store.usable or group.store.identity != self.store.identity:
            return False
        if not self.can_claim() or not group.claim(item, name):
            return False
        self.on_claim(key, group.key)
        # Unread: mapped when a task reads it.
        self._stored[key] = Stored(group.oids[item], self.store.identity, group.sizes[item], None)
        self.claimed_count += 1
        return True

    def _keep(self, key: Any, stored: Stored, view: Any) -> None:
        self._stored[key] = stored
        self._hold_view(key, view)

    # -- what stays mapped ---------------------------------------------------------------------

    def _hold_view(self, key: Any, view: Any) -> None:
        """Keeps `view` as `key`'s value, then releases the oldest others beyond `hold`."""
        self._views[key] = view
        backing.register(view, self._stored[key])
        self._held += self._stored[key].nbytes
        if self.store.tiered:
            while self._held > self.hold and len(self._views) > 1:
                self._drop_view(next(iter(self._views)))
                self.released_count += 1

    def _drop_view(self, key: Any) -> int:
        """Forgets `key`'s view; on a tiered store releases its object too (its reference
        goes once no task uses the value any more). Returns the object's bytes."""
        backing.unregister(self._views.pop(key))
        stored = self._stored[key]
        self._held -= stored.nbytes
        if self.store.tiered:
            stored.buffer = None
        return stored.nbytes

    def cool(self, keys: Iterable[Any]) -> None:
        """The worker's tasks are done with `keys` for now: their views go (each object's
        reference with it, once no task result keeps the value) and the store evicts their
        objects before any other (`Store.cool`). A tiered store only; keys held by Dask
        are left alone."""
        if not self.store.tiered or not self.store.usable:
            return
        oids = []
        for key in keys:
            stored = self._stored.get(key)
            if stored is None:
                continue
            self._kept_oids.setdefault(stored.oid, key)
            if key in self._views:
                self._drop_view(key)
                self.released_count += 1
            if self._aliases_in(stored.oid):
                self._cool_later.add(stored.oid)
            else:
                oids.append(stored.oid)
        if oids:
            self.store.cool(oids)

    def _alias_gone(self, key: Any, oid: bytes) -> None:
        """Alias `key` no longer lies in object `oid` (forgotten, or given its own object):
        an input cooled while it did is cooled now if no other alias lies in it."""
        self._aliases.discard(key)
        if oid in self._cool_later and not self._aliases_in(oid):
            self._cool_later.discard(oid)
            self.store.cool([oid])

    def _aliases_in(self, oid: bytes) -> list[Any]:
        """The aliases (and projections) of this worker that lie in object `oid`."""
        return [key for key in self._aliases if self._stored[key].oid == oid]

    def keep(self, keys: Iterable[Any]) -> None:
        """A client keeps `keys` (a persisted collection): their values are read ahead of the
        tasks that need them (`read_ahead`)."""
        keys = list(keys)
        self.promote(keys)
        for key in keys:
            if key in self._aliases:
                self._unalias(key)
            stored = self._stored.get(key)
            if stored is not None:
                self._kept_oids.setdefault(stored.oid, key)

    def read_ahead(self, keys: Iterable[Any], budget: int) -> list[bytes]:
        """The objects of `keys` worth restoring ahead of the tasks reading them, in order:
        values a client keeps that this process does not map now; the first of them, and
        the others while they fit in `budget` bytes."""
        oids = []
        for key in keys:
            stored = self._stored.get(key)
            if stored is None or stored.oid not in self._kept_oids or key in self._views:
                continue
            budget -= stored.nbytes
            if budget < 0 and oids:
                break
            oids.append(stored.oid)
        return oids

    def release_all(self) -> int:
        """Releases every value mapped here to the store's tiers (a tiered store only), and
        received values left unadopted (`backing.drop_received`); returns the bytes
        released. `Store.make_room` of this mapping's store."""
        if not self.store.tiered:
            return 0
        started = time.monotonic()
        released = 0
        while self._views:
            released += self._drop_view(next(iter(self._views)))
            self.released_count += 1
        backing.drop_received()
        # A released value may still be held by cyclic garbage (a finished task's frames, an
        # exception's traceback): collected now, so its buffer's reference goes with it.
        gc.collect()
        self.rooms_made += 1
        self.room_making_s += time.monotonic() - started
        return released

    def __getitem__(self, key: Any) -> Any:
        if key in self._pieces:
            return self._pieces[key]
        if key in self._young:
            return self._young[key][0]
        if key in self._views:
            self._views.move_to_end(key)
            return self._views[key]
        stored = self._stored.get(key)
        if stored is None:
            return self._private[key]
        view = self.store.view(stored)  # mapped again; raises if the object is gone
        self._hold_view(key, view)
        if self._kept_oids.get(stored.oid) == key:
            self._cool_later.discard(stored.oid)  # read again: in use, the scheduler cools it anew
        return view

    def __delitem__(self, key: Any) -> None:
        if self._pieces.pop(key, None) is not None:
            return  # nothing held; the scheduler deletes the objects with the key's others
        held = self._stored.get(key)
        if key in self._aliases:
            self._alias_gone(key, held.oid)
        if held is not None and self._kept_oids.get(held.oid) == key:
            del self._kept_oids[held.oid]
            self._cool_later.discard(held.oid)
            # The scheduler deletes the object now: an alias or projection still lying in it
            # (the client let go of a collection a running job still reads) gets a copy.
            for alias in self._aliases_in(held.oid):
                if self._stored[alias].buffer is None:
                    self._stored[alias].buffer = held.buffer
                try:
                    self._unalias(alias)
                except ShoalError as err:  # gone already: its reader fails as an alias's did
                    log.warning("shoal: %s outlived the value it views (%s)", alias, err)
        if key in self._young:  # never shared: it never needed an object
            self._young_bytes -= self._young.pop(key)[1]
            self._young_views.discard(key)
            return
        stored = self._stored.pop(key, None)
        if stored is None:
            del self._private[key]
            return
        view = self._views.pop(key, None)
        if view is not None:
            backing.unregister(view)
            self._held -= stored.nbytes
        # The reference goes; the object stays for other workers that hold the key until
        # the scheduler forgets it (shoal.dask.scheduler deletes it then).
        stored.buffer = None

    def __contains__(self, key: object) -> bool:
        return key in self._stored or key in self._pieces or key in self._young or key in self._private

    def __iter__(self) -> Iterator[Any]:
        yield from self._stored
        yield from self._pieces
        yield from self._young
        yield from self._private

    def __len__(self) -> int:
        return len(self._stored) + len(self._pieces) + len(self._young) + len(self._private)

    def holds_pieces(self, key: Any) -> bool:
        """Whether `key`'s value is a shuffle group stored as pieces (`pieces.py`)."""
        return key in self._pieces

    def stored(self, key: Any) -> Stored | None:
        """The object holding `key`'s value, or None (held by Dask)."""
        return self._stored.get(key)
