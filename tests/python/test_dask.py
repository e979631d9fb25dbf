"""shoal as Dask's data plane (shoal.dask), with a real Dask: LocalClusters of worker
processes on one host sharing one store.

Measured: results equal to stock Dask's; a large value handed from one worker to another
sends only its object's id (bytes through the socket, from Dask's own transfer log) and
the receiver reads the sender's pages; a killed worker's keys are not recomputed; workers
reading more shared memory than their limit are neither paused nor restarted; a full or
missing store gives Dask's behaviour with one warning.
"""

from __future__ import annotations

import operator
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _shoal_testing import Daemon, MiB, short_dir, wait_for

REASON = "no dask: scripts/setup-test-tools.sh installs it (pip install 'shoal[dask]')"
dask = pytest.importorskip("dask", reason=REASON)
distributed = pytest.importorskip("distributed", reason=REASON)
pd = pytest.importorskip("pandas", reason=REASON)

import dask.array as da  # noqa: E402
import dask_jobs  # noqa: E402
from dask.dataframe.backends import ShuffleGroupResult  # noqa: E402
from dask.sizeof import sizeof  # noqa: E402
from distributed import Client, LocalCluster, get_worker  # noqa: E402
from distributed.protocol import dumps as dask_dumps  # noqa: E402
from distributed.protocol import loads as dask_loads  # noqa: E402
from distributed.protocol.serialize import Serialize, deserialize, serialize  # noqa: E402

import shoal  # noqa: E402
import shoal.dask  # noqa: E402
import shoal.dask.forget  # noqa: E402
import shoal.dask.heap  # noqa: E402
import shoal.dask.pieces  # noqa: E402
from shoal import layout  # noqa: E402
from shoal.dask import backing  # noqa: E402
from shoal.dask.data import StoreData  # noqa: E402
from shoal.dask.pieces import Pieces  # noqa: E402
from shoal.dask.store import Store  # noqa: E402
from shoal.errors import ShoalError  # noqa: E402


class Wrapper:
    """An object Dask sizes by `sys.getsizeof` (tens of bytes) around a large array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


@contextmanager
def dask_cluster(socket: str, workers: int = 3, **options: Any) -> Iterator[Client]:
    """A LocalCluster of `workers` shoal worker processes (one thread each) on `socket`."""
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            worker_class=shoal.dask.Nanny,
            shoal_socket=socket,
            dashboard_address=":0",
            **options,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(short_dir(tmp_path_factory.mktemp("dask")) / "store", capacity="512MiB")
    yield daemon
    daemon.teardown()


@pytest.fixture(scope="module")
def client(store: Daemon) -> Iterator[Client]:
    with dask_cluster(store.socket) as client:
        yield client


def in_region(address: int, size: int) -> bool:
    """Whether [address, address + size) lies in this worker's mapping of the store."""
    here = get_worker().shoal.client
    return here.region_address <= address and address + size <= here.region_address + here.region_size


def forget_all(data: StoreData, opened: Store) -> None:
    """Forgets every key of `data`, deletes their objects and waits until the store is empty."""
    oids = {data.stored(key).oid for key in data}
    for key in list(data):
        del data[key]
    opened.client.delete(list(oids))
    wait_for(lambda: opened.client.stats()["objects"] == 0, timeout=5, message="the objects freed")


def dask_names(store: Daemon) -> list[str]:
    return [row.name for row in store.client().ls("dask")]


# -- the data mapping and the serialization family, in this process ---------------------------


def test_mapping_keeps_large_values_in_the_store_and_maps_them_back(store: Daemon) -> None:
    opened = Store.open(store.socket)
    data = StoreData(opened, threshold=64 * 1024)
    region = (opened.client.region_address, opened.client.region_size)

    def inside(address: int, size: int) -> bool:
        return region[0] <= address and address + size <= region[0] + region[1]

    array = np.arange(MiB, dtype=np.int64)
    data["array"] = array
    data["small"] = {"a": 1}
    frame = pd.DataFrame({"x": np.arange(100_000, dtype=np.float64), "y": np.arange(100_000)})
    data["frame"] = frame
    # The large values were rebuilt over the store (their private copies can go); the small
    # one stays a Python value.
    view = data["array"]
    assert view is not array and inside(view.ctypes.data, view.nbytes) and not view.flags.writeable
    np.testing.assert_array_equal(view, array)
    column = data["frame"]["x"].to_numpy()
    assert inside(column.ctypes.data, column.nbytes)
    pd.testing.assert_frame_equal(data["frame"], frame)
    assert data["small"] == {"a": 1} and data.stored("small") is None
    assert data.stored_count == 2 and len(data.fast) == 3
    oid = data.stored("array").oid

    # evict: the private value moves into the store first, then views are dropped; the
    # keys come back by mapping the same objects (no new object, no copy).
    assert data.evict() > 0 and data.stored("small") is not None
    while len(data.fast):
        assert data.evict() == 0
    assert set(data.slow) == {"array", "small", "frame"}
    objects = opened.client.stats()["objects"]
    again = data["array"]
    assert inside(again.ctypes.data, again.nbytes) and again.ctypes.data == view.ctypes.data
    assert data.stored("array").oid == oid and opened.client.stats()["objects"] == objects
    assert data["small"] == {"a": 1}

    # The serialization family: an id for a receiver on the same store, Dask's own path
    # otherwise.
    assert opened.cluster is None  # a single daemon: no cluster to reach it through
    same = {"recipient": {"shoal": opened.handshake()}}
    header, frames = serialize(again, serializers=["shoal", "dask", "pickle"], context=same)
    assert header["serializer"] == "shoal" and frames == [oid]
    other = {"recipient": {"shoal": {"store": "another store", "cluster": None}}}
    header, frames = serialize(again, serializers=["shoal", "dask", "pickle"], context=other)
    assert header["serializer"] != "shoal" and sum(memoryview(f).nbytes for f in frames) >= array.nbytes
    header, frames = serialize(array, serializers=["shoal", "dask", "pickle"], context=same)
    assert header["serializer"] != "shoal"  # a private value has no object to point at

    for key in list(data):
        del data[key]
    assert len(data) == 0 and backing.lookup(again) is None
    opened.client.delete(oid)


def test_layout_is_one_object_with_aligned_buffers() -> None:
    table = pa.table({"a": np.arange(1000, dtype=np.int64), "b": pa.array(["x"] * 1000)})
    pickled = layout.pickle_value(table)
    assert pickled.out_of_band >= 8000 and len(pickled.stream) < pickled.out_of_band
    assert all(offset % layout.ALIGN == 0 for offset in pickled.offsets())
    assert pickled.size >= pickled.out_of_band + len(pickled.stream)


def test_a_tiered_store_takes_every_value_and_reads_each_back_from_its_tier(tmp_path: Path) -> None:
    """Spilling by tiering: three times the store's memory in values, all of them in the
    store; the mapping releases what it holds so the daemon moves objects down its burst
    buffer, and reads them back by id, making room when memory is full of its own values."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        assert opened.tiered and opened.capacity == 16 * MiB
        # Holding every value it maps: a full store has it release them all (at a create,
        # then at a read of a value on the tier).
        data = StoreData(opened, hold=64 * MiB)
        values = {i: np.full(MiB // 2, float(i)) for i in range(12)}  # 4 MiB each
        for key, value in values.items():
            data[key] = value
        assert data.stored_count == 12 and data.released_count > 0
        assert data.stored(0).buffer is None  # released to the tier
        for key in sorted(values, reverse=True) + sorted(values):
            np.testing.assert_array_equal(data[key], values[key])
        tiers = opened.client.tiers()
        assert tiers["restores"] > 0, tiers
        assert set(data) == set(values) and not data._private
        data.release_all()
        # With the default hold (an eighth of the store) values are released as they go.
        trimmed = StoreData(opened)
        assert trimmed.hold == 2 * MiB
        for key in range(4):
            trimmed[f"t{key}"] = values[key]
        assert len(trimmed.fast) == 1 and trimmed.released_count == 3
        np.testing.assert_array_equal(trimmed["t0"], values[0])
        for mapping in (data, trimmed):
            oids = [mapping.stored(key).oid for key in mapping]
            for key in list(mapping):
                del mapping[key]
            opened.client.delete(oids)
        wait_for(lambda: opened.client.stats()["referenced"] == 0, timeout=5, message="references released")
    finally:
        daemon.teardown()


def test_a_small_piece_of_a_stored_value_is_kept_as_a_copy_not_a_view(tmp_path: Path) -> None:
    """A value under the threshold that lies in another value's object (a shuffle's split of
    a group) stays with Dask as a copy of its own: as a view it would keep the whole object
    referenced for as long as Dask holds the piece."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        data = StoreData(opened)
        data["group"] = np.arange(MiB // 8, dtype=np.float64)  # 1 MiB: an object
        oid = data.stored("group").oid
        piece = data["group"][1000:1100]  # 800 B of the group's object
        low, high = data._region
        assert low <= piece.ctypes.data < high
        data["piece"] = piece
        del piece
        kept = data["piece"]
        assert data.stored("piece") is None  # with Dask, under the threshold
        assert not low <= kept.ctypes.data < high  # its own memory
        np.testing.assert_array_equal(kept, np.arange(1000, 1100, dtype=np.float64))
        del data["group"]

        def refs() -> int:
            return next((o.ref_count for o in opened.client.list() if o.id.binary() == oid), 0)

        wait_for(lambda: refs() == 0, timeout=5, message="the group's object released")
        larger = np.arange(MiB // 8, dtype=np.float64)
        data["larger"] = larger[:100]  # not a store view: kept as it is
        assert np.shares_memory(data["larger"], larger)
        # A small-looking object that wraps a whole stored value is not copied (1 MiB of
        # private memory Dask's sizeof would not count); it stays the view it is.
        data["whole"] = np.arange(MiB // 8, dtype=np.float64)
        data["wrapper"] = Wrapper(data["whole"])
        assert data.stored("wrapper") is None and low <= data["wrapper"].array.ctypes.data < high
        del data["wrapper"]
        opened.client.delete(oid)
        opened.client.delete([data.stored(k).oid for k in data if data.stored(k) is not None])
    finally:
        daemon.teardown()


def test_making_room_lets_go_of_received_values_never_adopted(tmp_path: Path, monkeypatch) -> None:
    """A value that came from another worker as a reference, and whose key was released
    before the data mapping adopted it, keeps its object referenced only until the store
    needs room; one that arrived just now (a transfer in progress) is kept."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        data = StoreData(opened)
        sender = Store.open(daemon.socket)
        stored, value = sender.put(layout.pickle_value(np.full(MiB // 8, 1.0)), None)
        del value
        stored.buffer = None  # the sender let go of it

        def refs() -> int:
            return next(o.ref_count for o in opened.client.list() if o.id.binary() == stored.oid)

        # The sender's release may still be on its way (it goes from its release thread when
        # the connection is busy), and a read through the fast path reaches the daemon's
        # count some time after it was made: one at a time, so that neither hides the other.
        wait_for(lambda: refs() == 0, timeout=5, message="the sender's reference released")
        arrived = opened.open_object(stored.oid)
        backing.received(arrived[1], arrived[0])
        del arrived
        # Only the received value holds it, and nothing adopts it.
        wait_for(lambda: refs() == 1, timeout=5, message="the received value's reference counted")
        data.release_all()
        assert refs() == 1  # just arrived: maybe on its way to the mapping
        monkeypatch.setattr(backing, "RECEIVED_STALE_S", 0.0)
        data.release_all()
        wait_for(lambda: refs() == 0, timeout=5, message="the received value's reference released")
        opened.client.delete(stored.oid)
    finally:
        daemon.teardown()


def test_a_value_that_is_a_kept_keys_shares_its_object(tmp_path: Path) -> None:
    """An alias task returns its input unchanged (Dask's graph over a persisted collection
    starts with one per partition): the alias shares the kept input's object instead of a
    copy, and is released to the tiers as any value; an intermediate's value is copied (its
    object goes when its key is forgotten); a kept alias gets an object of its own."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        data = StoreData(opened, hold=8 * MiB)
        value = np.full(MiB // 8, 2.0)
        data["a"] = value
        data["copy"] = data["a"]  # "a" not kept (yet): an intermediate's value is copied
        assert data.stored("copy").oid != data.stored("a").oid and data.stored_count == 2
        data.keep(["a"])
        objects = opened.client.stats()["objects"]
        data["alias"] = data["a"]
        assert opened.client.stats()["objects"] == objects and data.stored_count == 2
        oid = data.stored("a").oid
        assert data.stored("alias").oid == oid
        # One value under two keys: dropping one key's view leaves the other's registered
        # (it is still sent by reference).
        data._drop_view("a")
        assert backing.lookup(data["alias"]) is not None
        assert data.release_all() > 0  # the alias's reference goes too: nothing pinned
        np.testing.assert_array_equal(data["alias"], value)
        # Kept by a client, an alias gets its own object: it may outlive "a".
        data.keep(["alias"])
        assert data.stored("alias").oid != oid and data.stored_count == 3
        np.testing.assert_array_equal(data["alias"], value)
        forget_all(data, opened)
    finally:
        daemon.teardown()


@contextmanager
def named_tiered_data(tmp_path: Path) -> Iterator[tuple[Store, StoreData]]:
    """A 16 MiB store over a burst buffer, and a data mapping of it (4 MiB held mapped)
    naming objects `dask/scope/<key>/w0`, as a worker does."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        data = StoreData(opened, hold=4 * MiB)
        data.name_of = lambda key: f"dask/scope/{key}/w0"
        yield opened, data
    finally:
        daemon.teardown()


def test_a_shuffle_group_is_stored_one_object_per_piece_and_a_piece_comes_back_alone(
    tmp_path: Path, monkeypatch
) -> None:
    """A tasks shuffle splits each partition into a dict {index: frame} and one task per
    index takes its piece: on a tiered store the dict is one object per item, so a piece
    read after the group left memory is restored alone (not its group); the value handed
    out reads items on demand, pickles as the plain dict, travels by ids to a worker of
    the same store, and is found again by its key's directory (a dead worker's keys)."""
    with named_tiered_data(tmp_path) as (opened, data):
        # What pandas' shuffle returns: a dict subclass that only sizes itself otherwise.
        group = ShuffleGroupResult(
            (i, pd.DataFrame({"x": np.full(MiB // 8, float(i)), "i": np.arange(MiB // 8)})) for i in range(4)
        )
        data["group"] = group
        pieces = data["group"]
        assert isinstance(pieces, Pieces) and sorted(pieces) == [0, 1, 2, 3] and len(pieces) == 4
        assert data.stored_count == 1 and data.stored("group") is None and "group" in data
        names = sorted(row.name for row in opened.client.ls("dask/scope/group"))
        assert names == [f"dask/scope/group/w0/{i}-of-4" for i in range(4)], names
        assert all(size < 2.1 * MiB for size in pieces.sizes.values()), pieces.sizes  # one piece each
        assert sizeof(pieces) == sum(pieces.sizes.values())
        # Every piece down the tier, then one read: only that piece comes back.
        wait_for(lambda: opened.client.stats()["referenced"] == 0, timeout=5, message="pieces unreferenced")
        assert opened.client.evict(64 * MiB) >= 4 * 2 * MiB, opened.client.stats()
        wait_for(lambda: opened.client.tiers()["queue_depth"] == 0, timeout=5, message="pieces written down")
        before = opened.client.tiers()["restored_bytes"]
        piece = pieces[2]
        pd.testing.assert_frame_equal(piece, group[2])
        low = opened.client.region_address
        assert low <= piece["x"].to_numpy().ctypes.data < low + opened.client.region_size  # a view
        restored = opened.client.tiers()["restored_bytes"] - before
        assert pieces.sizes[2] <= restored < pieces.sizes[2] + 4096, (restored, pieces.sizes)
        with pytest.raises(KeyError):
            pieces[7]
        # Pickled (Dask's own transfer to another store) it is the dict.
        again = pickle.loads(pickle.dumps(pieces))
        assert type(again) is ShuffleGroupResult and sorted(again) == [0, 1, 2, 3]
        pd.testing.assert_frame_equal(again[3], group[3])
        # To a worker of the same store only the ids travel; another store gets Dask's bytes.
        same = {"recipient": {"shoal": opened.handshake()}}
        header, frames = serialize(pieces, serializers=["shoal", "dask", "pickle"], context=same)
        assert header["serializer"] == "shoal" and sum(len(f) for f in frames) == 4 * 20
        monkeypatch.setattr(shoal.dask.store, "_current", opened)
        received = deserialize(header, frames)
        assert isinstance(received, Pieces) and received.oids == pieces.oids
        other = {"recipient": {"shoal": {"store": "another store", "cluster": None}}}
        header, frames = serialize(pieces, serializers=["shoal", "dask", "pickle"], context=other)
        assert header["serializer"] != "shoal"
        assert sorted(deserialize(header, frames)) == [0, 1, 2, 3]
        # Adopted by another mapping of the store (as a dead worker's key): no copy.
        assert opened.find("dask/scope/group") is None  # not one object
        found = shoal.dask.pieces.find(opened, "dask/scope/group")
        assert found is not None and found.oids == pieces.oids and found.names == pieces.names
        other_data = StoreData(opened)
        other_data["group"] = found
        assert other_data.stored_count == 0 and other_data["group"].oids == pieces.oids
        del data["group"], other_data["group"]
        assert "group" not in data and not len(data)
        assert opened.forget("dask/scope/group", time.time() + 1) == 4
        del piece, frames  # their references: the deletes of their objects wait for them
        wait_for(lambda: opened.client.stats()["objects"] == 0, timeout=5, message="the pieces deleted")


class ListsThenRebinds:
    """A client whose listing is followed by a store under a listed name (the key computed
    again between a forget's listing and its delete)."""

    def __init__(self, client: shoal.Client, rebind: Any) -> None:
        self._client, self._rebind = client, rebind

    def ls(self, prefix: str) -> list[Any]:
        rows = self._client.ls(prefix)
        self._rebind()
        return rows

    def delete(self, oids: list[Any]) -> None:
        self._client.delete(oids)


def test_forgotten_keys_lose_their_objects_on_a_thread_by_id(tmp_path: Path) -> None:
    """A worker's forgets run on a thread with a connection of its own (forget.py), those
    queued meanwhile in one delete: what was sealed before each forget goes, what was
    stored after it stays, and closing waits for the queue. They delete by id, so a name
    bound again between the listing and the delete keeps its new object."""
    with named_tiered_data(tmp_path) as (opened, data):
        for key in ("a", "b", "c"):
            data[key] = np.full(MiB // 8, 1.0)
        before = time.time()
        time.sleep(0.01)
        data["late"] = np.full(MiB // 8, 2.0)
        forgetting = shoal.dask.forget.Forgetting(opened)
        # A listing the store refuses leaves the others of its batch to be deleted.
        for prefix in ("dask/scope/a", "dask//bad", "dask/scope/b", "dask/scope/late"):
            assert forgetting.forget(prefix, before)
        assert forgetting.close(timeout=10)
        assert forgetting.forgotten == 2
        assert not forgetting.forget("dask/scope/c", time.time())  # closed: the caller's to do
        assert sorted(row.name for row in opened.client.ls("dask/scope")) == [
            "dask/scope/c/w0",
            "dask/scope/late/w0",
        ]
        # The key stored again under its name after the forget listed the old object.
        stored_again = ListsThenRebinds(opened.client, lambda: data.__setitem__("c", np.full(MiB // 8, 3.0)))
        failures: list[ShoalError] = []
        assert shoal.dask.store.forget(stored_again, [("dask/scope/c", time.time())], failures.append) == 1
        assert not failures
        data.release_all()
        np.testing.assert_array_equal(data["c"], np.full(MiB // 8, 3.0))
        assert [row.id.binary() for row in opened.client.ls("dask/scope/c")] == [data.stored("c").oid]


def split(group: Pieces, item: int) -> Any:
    """What a split task returns: `group[item]` with `pieces.splitting` set, as the worker
    runs one."""
    token = shoal.dask.pieces.splitting.set(True)
    try:
        return group[item]
    finally:
        shoal.dask.pieces.splitting.reset(token)


def test_a_split_takes_its_pieces_object_over(tmp_path: Path) -> None:
    """A split gets its item unread, and its key takes the item's object over (renamed,
    timed now) instead of reading and copying it: the group's deletion leaves it, a stale
    delete of the split's name leaves it, the group still reads the item by id, the same
    key computed again claims it again. Refused (no scheduler told), the item is read and
    copied. Only shuffle groups are pieces; a group under a second key is copied."""
    with named_tiered_data(tmp_path) as (opened, data):
        told: list[tuple[Any, Any]] = []
        data.on_claim = lambda key, source: told.append((key, source))
        group = ShuffleGroupResult((i, np.full(MiB // 8, float(i))) for i in range(3))
        data["group"] = group
        pieces = data["group"]
        objects = opened.client.stats()["objects"]
        unread = split(pieces, 1)
        assert isinstance(unread, shoal.dask.pieces.Item) and sizeof(unread) == pieces.sizes[1]
        before = time.time()
        data["split"] = unread
        assert data.claimed_count == 1 and told == [("split", "group")]
        assert opened.client.stats()["objects"] == objects and data.stored_count == 1  # no copy
        assert data.stored("split").oid == pieces.oids[1] and data.stored("split").buffer is None
        names = sorted(row.name for row in opened.client.ls("dask/scope"))
        assert names == ["dask/scope/group/w0/0-of-3", "dask/scope/group/w0/2-of-3", "dask/scope/split/w0"]
        # A delete sent before the claim (for an earlier run of the key) leaves it.
        assert opened.forget("dask/scope/split", before - 1) == 0
        # The group is not whole under its name any more: not adopted without the item.
        assert shoal.dask.pieces.find(opened, "dask/scope/group") is None
        np.testing.assert_array_equal(data["split"], group[1])
        # The same key computed again here claims the same object again: nothing deleted.
        del data["split"]
        data["split"] = split(pieces, 1)
        assert data.claimed_count == 2 and data.stored("split").oid == pieces.oids[1]
        assert opened.client.stats()["objects"] == objects
        # So does a process whose Pieces of the group never saw the claim (fetched again).
        fresh = Pieces(opened, pieces.oids, pieces.sizes, pieces.names)
        del data["split"]
        data["split"] = split(fresh, 1)
        assert data.claimed_count == 3 and data.stored("split").oid == pieces.oids[1]
        assert opened.client.stats()["objects"] == objects
        # The group's objects go with it; the claimed one stays, readable by both.
        del data["group"]
        assert opened.forget("dask/scope/group", time.time() + 1) == 2
        data.release_all()
        np.testing.assert_array_equal(pieces[1], group[1])
        np.testing.assert_array_equal(data["split"], group[1])
        # Another key gets a copy: the item is claimed under another name.
        data["other"] = split(pieces, 1)
        assert data.claimed_count == 3 and data.stored_count == 2
        assert [key for key, _ in told] == ["split"] * 3  # a refused claim is not told
        np.testing.assert_array_equal(data["other"], group[1])
        # No claim without telling the scheduler: the item is read and copied.
        data["group2"] = ShuffleGroupResult((i, np.full(MiB // 8, float(i))) for i in range(2))
        data.can_claim = lambda: False
        data["split2"] = split(data["group2"], 0)
        assert data.claimed_count == 3 and data.stored_count == 4
        np.testing.assert_array_equal(data["split2"], np.zeros(MiB // 8))
        # A group returned unchanged under a second key gets objects of its own (the first
        # key's go with it); a plain dict keyed by ints is a dict, in one object.
        data["alias"] = data["group2"]
        assert data.holds_pieces("alias") and data["alias"].oids.keys() == data["group2"].oids.keys()
        assert not set(data["alias"].oids.values()) & set(data["group2"].oids.values())
        data["plain"] = {i: np.full(MiB // 8, float(i)) for i in range(2)}
        assert not data.holds_pieces("plain") and type(data["plain"]) is dict
        for key in list(data):
            del data[key]
        opened.forget("dask/scope", time.time() + 1)
        wait_for(lambda: opened.client.stats()["objects"] == 0, timeout=5, message="every object deleted")


def test_a_projection_of_a_kept_value_views_its_object(tmp_path: Path, monkeypatch) -> None:
    """A column projection of a persisted partition (pandas' copy-on-write makes it of views
    of the partition's columns) is recorded as a part of the partition's object, not copied
    into an object of its own: after a release it is rebuilt over the same pages, and the
    `shoal` family sends a worker of the same store the object's id, the projection's pickle
    stream and its small column index (a worker of another store gets Dask's own bytes). A
    projection of an intermediate is copied, and so is one a client keeps, one of the
    partition a client lets go of, and one under an eighth of the partition."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="64MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        monkeypatch.setattr(shoal.dask.store, "_current", opened)
        data = StoreData(opened, hold=32 * MiB)
        rows = 256 * 1024  # 8 MiB of columns
        rng = np.random.default_rng(0)
        frame = pd.DataFrame({
            "k": rng.integers(0, 1000, rows),
            "v": rng.random(rows),
            "w": rng.standard_normal(rows),
            "id": rng.integers(0, 2**62, rows),
        })  # fmt: skip
        expected = frame[["k", "v", "w"]]
        low, high = data._region

        def in_store(value: pd.DataFrame) -> bool:
            return all(low <= value[c].to_numpy().ctypes.data < high for c in value.columns)

        data["frame"] = frame
        data["copy"] = data["frame"][["k", "v", "w"]]  # "frame" not kept (yet): copied
        assert data.stored("copy").oid != data.stored("frame").oid and data.stored_count == 2
        data.keep(["frame"])
        objects = opened.client.stats()["objects"]
        oid = data.stored("frame").oid
        data["projection"] = data["frame"][["k", "v", "w"]]
        assert data.stored("projection").oid == oid and data.stored("projection").part is not None
        assert opened.client.stats()["objects"] == objects and data.stored_count == 2
        assert in_store(data["projection"])
        # Released, then read again: rebuilt over the partition's object, not a copy.
        assert data.release_all() > 0
        again = data["projection"]
        pd.testing.assert_frame_equal(again, expected)
        assert in_store(again) and opened.client.stats()["objects"] == objects

        # Sent by reference in a Dask message: the id, the stream and the column index's few
        # bytes (inline frames); received, it views the same pages and is an alias there too.
        same = {"recipient": {"shoal": opened.handshake()}}
        header, frames = serialize(again, serializers=["shoal", "dask", "pickle"], context=same)
        assert header["serializer"] == "shoal" and bytes(frames[0]) == oid and len(frames) > 2
        wire = dask_dumps({"value": Serialize(again)}, serializers=["shoal", "dask", "pickle"], context=same)
        assert sum(memoryview(f).nbytes for f in wire) < 16 * 1024
        received = dask_loads(wire, deserializers=["shoal", "dask", "pickle"])["value"]
        pd.testing.assert_frame_equal(received, expected)
        assert in_store(received)
        data["received"] = received
        assert data.stored("received").part is not None and data.stored_count == 2
        data.keep(["received"])  # kept there by a client: an object of its own
        assert data.stored("received").oid != oid and data.stored_count == 3
        del received
        other = {"recipient": {"shoal": {"store": "another store", "cluster": None}}}
        header, frames = serialize(again, serializers=["shoal", "dask", "pickle"], context=other)
        assert header["serializer"] != "shoal"
        del frames, wire  # Dask's own frames view the object

        # A piece under an eighth of the partition would keep all of it referenced: copied.
        data["piece"] = data["frame"]["v"].iloc[: rows // 8]  # 256 KiB of the 8 MiB
        assert data.stored("piece").oid != oid and data.stored_count == 4

        # Kept by a client, a projection gets an object of its own: it may outlive "frame".
        data.keep(["projection"])
        assert data.stored("projection").oid != oid and data.stored_count == 5
        # So does one still lying in the partition when the client lets go of it.
        data["columns"] = data["frame"][["v", "w"]]
        assert data.stored("columns").oid == oid
        data.release_all()
        del data["frame"]
        assert data.stored("columns").oid != oid and data.stored_count == 6
        pd.testing.assert_frame_equal(data["columns"], frame[["v", "w"]])
        opened.client.delete(oid)  # as the scheduler plugin does once "frame" is forgotten
        pd.testing.assert_frame_equal(data["projection"], expected)
        del again
        forget_all(data, opened)
    finally:
        daemon.teardown()


def test_a_kept_value_an_alias_lies_in_is_cooled_once_the_alias_is_forgotten(tmp_path: Path) -> None:
    """The scheduler cools a persisted partition as soon as the task reading it (an alias
    task) is done, while the alias's own reader has yet to run: cooled then, the object is
    the first the store evicts once the alias's view goes, and the reader restores it
    again. The cool waits for the last alias (or projection) lying in the object."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="16MiB", args=["--burst", str(directory / "burst")])
    try:
        opened = Store.open(daemon.socket)
        cooled: list[bytes] = []
        opened.cool = cooled.extend  # what the daemon is told, in order
        data = StoreData(opened, hold=8 * MiB)
        data["a"] = np.full(MiB // 8, 2.0)
        data["b"] = np.full(MiB // 8, 3.0)
        data.keep(["a", "b"])
        data["alias"] = data["a"]
        data["slice"] = data["a"][: MiB // 16]  # a part of "a": a projection
        a, b = data.stored("a").oid, data.stored("b").oid
        data.cool(["a", "b"])
        assert cooled == [b]  # "b" at once; "a" still has an alias and a projection
        del data["alias"]
        assert cooled == [b]
        data.keep(["slice"])  # kept by a client: an object of its own, no longer in "a"
        assert data.stored("slice").oid != a
        assert cooled == [b, a]  # the last of them gone from "a": "a" cooled now
        # Read again meanwhile, an input is in use: no cool when its alias goes (the
        # scheduler cools it anew once its new reader is done).
        data["c"] = np.full(MiB // 8, 4.0)
        data.keep(["c"])
        data["c-alias"] = data["c"]
        c = data.stored("c").oid
        data.cool(["c"])
        assert data["c"][0] == 4.0
        del data["c-alias"]
        assert cooled == [b, a]
        for key in list(data):
            del data[key]
        opened.client.delete([a, b, c])
    finally:
        daemon.teardown()


def test_young_values_stay_private_until_shared_kept_or_crowded(store: Daemon) -> None:
    """A new value needs no object until another worker asks for it, a client keeps it,
    newer values need the room or the memory monitor evicts; one forgotten before that is
    never copied into the store."""
    opened = Store.open(store.socket)
    data = StoreData(opened, young=2 * MiB)
    values = {key: np.full(MiB // 8, float(i)) for i, key in enumerate("abcdef")}  # 1 MiB each
    data["a"] = values["a"]
    assert data["a"] is values["a"] and data.stored("a") is None and "a" in data
    del data["a"]  # forgotten young: never stored
    assert data.stored_count == 0 and "a" not in data
    for key in "bcd":  # 3 MiB in 2 MiB of young values: the oldest goes into the store
        data[key] = values[key]
    assert data.stored("b") is not None and data.stored("c") is None and data.stored_count == 1
    data.promote(["c"])  # another worker asks for it
    data.keep(["d"])  # a client keeps it
    assert data.stored("c") is not None and data.stored("d") is not None
    data["e"] = values["e"]
    assert data.evict() == sizeof(values["e"]) and data.stored("e") is not None  # the monitor
    big = np.full(MiB // 2, 5.0)  # 4 MiB: above the young budget, stored at once
    data["big"] = big
    assert data.stored("big") is not None and data.stored_count == 5
    for key in "bcde":
        np.testing.assert_array_equal(data[key], values[key])
    assert len(data) == 5 and set(data) == {"b", "c", "d", "e", "big"}
    oids = [data.stored(key).oid for key in data]
    for key in list(data):
        del data[key]
    opened.client.delete(oids)


# -- a cluster of worker processes on one store --------------------------------------------------


def test_results_equal_stock_dask(client: Client, store: Daemon) -> None:
    n = 400_000
    frame, jobs = dask_jobs.jobs(n, keys=1000, partitions=8)
    stored_before = sum(client.run(lambda dask_worker: dask_worker.data.stored_count).values())
    got = {name: dask.compute(job)[0] for name, job in jobs().items()}
    # Stock Dask, no distributed, no shoal (P2P shuffles need distributed: tasks shuffles).
    with dask.config.set({"scheduler": "sync", "dataframe.shuffle.method": "tasks"}):
        want = {name: dask.compute(job)[0] for name, job in jobs().items()}
    assert dask_jobs.equal(got, want) == dict.fromkeys(got, True)
    stored = sum(client.run(lambda dask_worker: dask_worker.data.stored_count).values())
    assert stored - stored_before >= 8  # the partitions went through the store

    # persist: the partitions stay in the store, their objects named by key and worker;
    # once released, the scheduler plugin deletes them.
    persisted = frame.persist()
    assert len(persisted.compute()) == n
    # dask/<scheduler>/<key>/<worker name>: `shoal ls dask` shows whose each object is
    # (objects of the keys released above may still be on their way out).
    scope = shoal.dask.store.component(client.scheduler.address)
    pattern = re.compile(rf"dask/{re.escape(scope)}/\('frompandas-[0-9a-f]+', \d+\)/[0-2]")
    names = dask_names(store)
    assert len([name for name in names if pattern.fullmatch(name)]) == 8, names
    del persisted
    wait_for(lambda: not dask_names(store), timeout=10, message="objects of released keys deleted")


def make_table(rows: int) -> pa.Table:
    return pa.table({"x": np.arange(rows, dtype=np.int64), "y": np.ones(rows)})


def buffers_in_region(table: pa.Table) -> tuple[int, bool]:
    large = [
        b
        for column in table.columns
        for chunk in column.chunks
        for b in chunk.buffers()
        if b and b.size > 4096
    ]
    return sum(b.size for b in large), all(in_region(b.address, b.size) for b in large)


def test_handoff_sends_only_the_id_and_the_receiver_reads_the_same_pages(client: Client) -> None:
    sender, receiver = sorted(client.scheduler_info()["workers"])[:2]
    rows = 4 * MiB  # 64 MiB of columns
    table = client.submit(make_table, rows, workers=[sender], key="handoff-table")
    nbytes, inside = client.submit(buffers_in_region, table, workers=[receiver]).result()
    assert nbytes == 16 * rows and inside  # the receiver's columns are views of the store

    def sent(dask_worker: Any) -> list[tuple[int, int]]:
        return [
            (entry["total"], entry["compressed"])
            for entry in dask_worker.transfer_outgoing_log
            if "handoff-table" in entry["keys"]
        ]

    ((total, on_the_wire),) = client.run(sent, workers=[sender])[sender]
    assert total >= 16 * rows  # what Dask counts the value as
    assert on_the_wire < 64 * 1024, f"{on_the_wire} bytes went through the socket"

    # One object for both workers: the sender's, named after key and worker.
    def objects(dask_worker: Any) -> Any:
        stored = dask_worker.data.stored("handoff-table")
        return None if stored is None else stored.oid

    oids = client.run(objects, workers=[sender, receiver])
    assert oids[sender] is not None and oids[sender] == oids[receiver]
    del table


def produce(index: int, log: str) -> np.ndarray:
    with open(log, "a") as f:
        f.write(f"{index}\n")
    return np.full(MiB // 8, index, dtype=np.float64)


def test_killed_worker_keys_are_not_recomputed(store: Daemon, tmp_path: Path) -> None:
    log = str(tmp_path / "computed")
    with dask_cluster(store.socket) as client:
        workers = sorted(client.scheduler_info()["workers"])
        victim = workers[0]
        # allow_other_workers: a lost key would be computed again elsewhere (and
        # counted), not wait for its dead worker.
        parts = [
            client.submit(produce, i, log, workers=[workers[i % 3]], allow_other_workers=True, pure=False)
            for i in range(6)
        ]
        distributed.wait(parts)
        held = client.run(lambda dask_worker: list(dask_worker.data), workers=[victim])[victim]
        assert len(held) == 2, held
        # Kept by the client: in the store within moments of their tasks' end (`shoal-kept`).
        wait_for(
            lambda: all(
                client.run(
                    lambda dask_worker: [dask_worker.data.stored(k) is not None for k in dask_worker.data],
                    workers=[victim],
                )[victim]
            ),
            timeout=10,
            message="the victim's values in the store",
        )
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: victim not in client.scheduler_info()["workers"], timeout=20, message="the worker removed"
        )
        total = client.submit(lambda *arrays: float(sum(a.sum() for a in arrays)), *parts).result()
        assert total == sum(i * (MiB // 8) for i in range(6))
        with open(log) as f:
            computed = sorted(int(line) for line in f)
        assert computed == list(range(6)), f"recomputed: {computed}"
        adopted = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["shoal"].adopted)
        assert adopted == 2
        del parts
        wait_for(lambda: not dask_names(store), timeout=10, message="objects deleted")


def touch(array: np.ndarray) -> float:
    return float(array.sum())


def probe() -> dict[str, Any]:
    import psutil

    return {
        "rss": psutil.Process().memory_info().rss,
        "private": shoal.dask.private_memory(),
        "status": get_worker().status.name,
    }


def test_no_worker_paused_or_restarted_for_shared_memory(tmp_path: Path) -> None:
    daemon = Daemon(short_dir(tmp_path) / "store", capacity="768MiB")
    limit = 400 * MiB
    try:
        with dask_cluster(daemon.socket, workers=2, memory_limit=limit) as client:
            workers = sorted(client.scheduler_info()["workers"])
            pids = client.run(os.getpid)
            # 5 × 100 MiB in the store; every worker reads all of it, and holds it (each
            # array is a dependency it received: a view of the store's pages).
            arrays = [
                client.submit(lambda i: np.full(100 * MiB // 8, float(i)), i, workers=[workers[i % 2]])
                for i in range(5)
            ]
            sums = [client.submit(touch, a, workers=[w], pure=False) for w in workers for a in arrays]
            assert sum(client.gather(sums)) == 2 * sum(i * 100 * MiB // 8 for i in range(5))
            time.sleep(1.0)  # several rounds of both memory monitors (every 100 ms)
            for w in workers:
                reading = client.submit(probe, workers=[w], pure=False).result()
                # By Dask's measure each worker is over its terminate threshold (95 %) ...
                assert reading["rss"] > 0.95 * limit, reading
                # ... by its own memory well under the pause threshold (80 %).
                assert reading["private"] < 0.8 * limit, reading
                assert reading["status"] == "running"
            assert client.run(os.getpid) == pids  # no restart
            events = client.get_events("all")
            assert not [e for e in events if "worker-restart-memory" in str(e)]
            logs = "\n".join(line for w in client.get_worker_logs().values() for _, line in w)
            assert "Pausing worker" not in logs and "exceeded" not in logs
            assert client.run(lambda dask_worker: dask_worker.status.name) == dict.fromkeys(pids, "running")
            # Each keeps freed memory for its next tasks (a quarter of the limit, heap.py).
            assert client.run(lambda dask_worker: dask_worker.shoal_heap_kept) == dict.fromkeys(pids, True)
            del arrays
    finally:
        daemon.teardown()


ALLOCATIONS = """
import resource, sys
import numpy as np
from shoal.dask import heap
if sys.argv[1] == "kept":
    assert heap.keep_freed(heap.default_keep(400 << 20))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    np.ones(1 << 20)
start = faults()
for _ in range(50):
    scratch = np.ones(1 << 20)  # 8 MiB, as a task's intermediate, freed at once
    del scratch
print(faults() - start)
"""


def test_a_worker_keeps_freed_memory_for_its_next_tasks() -> None:
    """Under Dask's trim setting each 8 MiB array a task makes is a fresh mapping whose
    pages fault in (and are zeroed); with the heap kept (heap.py) the next array reuses the
    last one's pages."""
    env = os.environ | {"MALLOC_TRIM_THRESHOLD_": "65536"}  # as Dask's nanny starts a worker

    def faults(mode: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", ALLOCATIONS, mode], env=env, capture_output=True, text=True, check=True
        )
        return int(run.stdout)

    as_dask, kept = faults("dask"), faults("kept")
    assert as_dask >= 50 and kept * 20 < as_dask, (kept, as_dask)
    assert not shoal.dask.heap.keep_freed(0)  # 0: Dask's setting stays


# -- errors: Dask's behaviour, one warning -----------------------------------------------------


def test_missing_store_gives_stock_dask(tmp_path: Path) -> None:
    socket = str(short_dir(tmp_path) / "nobody.sock")
    with dask_cluster(socket, workers=2) as client:
        kinds = client.run(lambda dask_worker: type(dask_worker.data).__name__)
        assert set(kinds.values()) == {"SpillBuffer"}
        x = da.ones((1000, 1000), chunks=(250, 250))
        assert float((x + x.T).sum().compute()) == 2_000_000.0
        logs = [line for w in client.get_worker_logs().values() for _, line in w]
        warnings = [line for line in logs if "shoal: no store at" in line]
        assert len(warnings) == 2, warnings  # one per worker


def test_a_tiered_store_spills_instead_of_dask(tmp_path: Path) -> None:
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="32MiB", args=["--burst", str(directory / "burst")])
    try:
        with dask_cluster(daemon.socket, workers=2) as client:
            # 96 MiB of values through a 32 MiB store: every one in the store, none with Dask.
            # (What one task or one transfer uses at once must fit the store's memory.)
            parts = [client.submit(lambda i: np.full(MiB // 2, float(i)), i) for i in range(24)]
            sums = [client.submit(lambda x: float(x.sum()), part) for part in parts]
            total = client.submit(sum, sums).result(timeout=60)
            assert total == sum(i * (MiB // 2) for i in range(24))
            for i, part in enumerate(parts):
                assert (part.result(timeout=30) == float(i)).all()
            counts = client.run(
                lambda dask_worker: (dask_worker.data.stored_count, dask_worker.data.released_count)
            )
            assert sum(s for s, _ in counts.values()) >= 24 and all(r > 0 for _, r in counts.values()), counts
            private = client.run(
                lambda dask_worker: [type(v).__name__ for v in dask_worker.data._private.values()]
            )
            assert "ndarray" not in sum(private.values(), []), private  # only the small sums
            logs = [line for w in client.get_worker_logs().values() for _, line in w]
            assert not [line for line in logs if "the store is full" in line]
            assert daemon.client().tiers()["spilled_bytes"] + daemon.client().tiers()["drained_bytes"] > 0
            del parts
    finally:
        daemon.teardown()


def test_a_tasks_shuffle_on_a_tiered_store_stores_its_groups_as_pieces(tmp_path: Path) -> None:
    """A set_index and a merge by tasks shuffle over a store smaller than their data: each
    group goes into the store one object per piece, results equal stock Dask's, and every
    object is deleted with its key."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="32MiB", args=["--burst", str(directory / "burst")])
    try:
        with dask_cluster(daemon.socket, workers=2) as client:
            frame, jobs = dask_jobs.jobs(1_000_000, keys=1000, partitions=24)
            picked = ("set_index", "merge")
            with dask.config.set({"dataframe.shuffle.method": "tasks"}):
                got = dict(zip(picked, dask.compute(*(jobs()[name] for name in picked)), strict=True))
            with dask.config.set({"scheduler": "sync", "dataframe.shuffle.method": "tasks"}):
                want = dict(zip(picked, dask.compute(*(jobs()[name] for name in picked)), strict=True))
            assert bool(np.isclose(got["set_index"], want["set_index"]))
            assert bool(np.allclose(got["merge"].sort_index(), want["merge"].sort_index()))
            counts = client.run(
                lambda dask_worker: (dask_worker.data.pieces_count, dask_worker.data.claimed_count)
            )
            assert sum(p for p, _ in counts.values()) >= 12, counts  # a group per partition, at least
            assert sum(c for _, c in counts.values()) >= 12, counts  # and splits took pieces over
            tiers = daemon.client().tiers()
            assert tiers["spilled_bytes"] + tiers["drained_bytes"] > 0, tiers  # too small a store for it
            wait_for(lambda: not dask_names(daemon), timeout=10, message="objects of released keys deleted")
    finally:
        daemon.teardown()


def make_group(n: int) -> ShuffleGroupResult:
    return ShuffleGroupResult((i, np.full(MiB // 8, float(i))) for i in range(n))


def test_a_group_read_again_after_its_split_is_forgotten(tmp_path: Path) -> None:
    """The scheduler deletes a split's claimed object only once its group has left memory:
    until then a task reading the same item again finds it; after both, nothing is left."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="32MiB", args=["--burst", str(directory / "burst")])
    try:
        with dask_cluster(daemon.socket, workers=1) as client:
            group = client.submit(make_group, 3)
            split = client.submit(operator.getitem, group, 1)
            assert float(client.submit(np.sum, split).result(timeout=30)) == MiB // 8
            assert sum(client.run(lambda dask_worker: dask_worker.data.claimed_count).values()) == 1
            del split
            wait_for(
                lambda: (
                    client.run_on_scheduler(
                        lambda dask_scheduler: len(dask_scheduler.plugins["shoal"]._after)
                    )
                    == 1
                ),
                timeout=10,
                message="the split's delete waits for its group",
            )
            # The same key computed again (it claims the object again), another key, and the
            # whole group (every item read to send it) all read item 1.
            again = client.submit(operator.getitem, group, 1)
            other = client.submit(operator.getitem, group, 1, pure=False)
            for value in (again.result(timeout=30), other.result(timeout=30), group.result(timeout=30)[1]):
                np.testing.assert_array_equal(value, np.full(MiB // 8, 1.0))
            del again, other, group
            wait_for(lambda: not dask_names(daemon), timeout=10, message="every object deleted")
    finally:
        daemon.teardown()


def test_a_job_cools_the_kept_values_it_read_and_reads_them_ahead(tmp_path: Path) -> None:
    """A persisted collection larger than the store, scanned twice: each value a task read
    and no other task waits for is cooled (it leaves memory first), only those, and the
    values the client keeps are read ahead of the tasks that need them."""
    directory = short_dir(tmp_path)
    daemon = Daemon(directory / "store", capacity="24MiB", args=["--burst", str(directory / "burst")])
    try:
        with dask_cluster(daemon.socket, workers=2) as client:
            chunks = 8
            data = np.arange(chunks * MiB // 2, dtype=np.float64)  # 8 chunks of 4 MiB
            persisted = da.from_array(data, chunks=MiB // 2).persist()
            distributed.wait(persisted)
            for _ in range(2):
                assert float((persisted + 1).sum().compute()) == float((data + 1).sum())
            cooled = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["shoal"].cooled)
            # Each pass cools each chunk once (its `+ 1` task was the one that waited for it),
            # and never the intermediates.
            assert cooled == 2 * chunks, cooled
            seen = client.run(
                lambda dask_worker: (
                    len(dask_worker.shoal_data._kept_oids),
                    dask_worker.shoal_read_ahead.asked,
                )
            )
            assert sum(kept for kept, _ in seen.values()) == chunks, seen
            assert sum(asked for _, asked in seen.values()) > 0, seen
            assert daemon.client().tiers()["restores"] > 0
            del persisted
    finally:
        daemon.teardown()


def test_full_store_keeps_values_with_dask(tmp_path: Path) -> None:
    daemon = Daemon(short_dir(tmp_path) / "store", capacity="8MiB")
    try:
        with dask_cluster(daemon.socket, workers=2) as client:
            parts = [client.submit(lambda i: np.full(MiB // 2, float(i)), i) for i in range(12)]
            total = client.submit(lambda *a: float(sum(x.sum() for x in a)), *parts).result(timeout=30)
            assert total == sum(i * (MiB // 2) for i in range(12))
            where = client.run(lambda dask_worker: (dask_worker.data.stored_count, len(dask_worker.data)))
            stored = sum(s for s, _ in where.values())
            assert 0 < stored < 12, where  # some in the store, the rest kept by Dask
            logs = [line for w in client.get_worker_logs().values() for _, line in w]
            full = [line for line in logs if "the store is full" in line]
            assert 1 <= len(full) <= 2, full  # at most one per worker
            del parts
    finally:
        daemon.teardown()
