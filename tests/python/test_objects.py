"""The Plasma life cycle: create, write, seal, get, release, delete, and friends."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
from _shoal_testing import MiB, in_region, wait_for

import shoal

OID = shoal.ObjectID


def test_create_write_seal_get_release_delete(store):
    client = store.client()
    oid = OID.from_random()
    data = bytes(range(256)) * 4 + b"tail"

    buffer = client.create(oid, len(data), metadata=b"meta!")
    assert len(buffer) == len(data)
    assert not buffer.readonly
    assert bytes(buffer.id) == oid.binary()
    assert in_region(client, buffer.address, len(data))
    memoryview(buffer)[:] = data

    # Unsealed: listed as being written, invisible to contains/get.
    [info] = client.list()
    assert (info.id, info.data_size, info.metadata_size, info.sealed) == (oid, len(data), 5, False)
    assert not client.contains(oid)
    assert client.get_buffers([oid], timeout_ms=0) == [None]
    stats = client.stats()
    assert (stats["objects"], stats["sealed"], stats["referenced"]) == (1, 0, 1)
    assert stats["used"] == 1088  # 1028 + 5 bytes rounded up to 64-byte lines

    client.seal(oid)
    assert client.contains(oid)
    assert client.list()[0].sealed
    stats = client.stats()
    assert (stats["objects"], stats["sealed"], stats["referenced"], stats["evictable"]) == (1, 1, 1, 0)

    got = client.get_buffer(oid, timeout_ms=0)
    assert got.readonly
    assert got.address == buffer.address  # same memory, no copy
    assert bytes(got) == data
    assert bytes(got.metadata()) == b"meta!"
    assert client.list()[0].ref_count == 2  # the creator's buffer and ours

    del buffer, got
    gc.collect()
    assert client.list()[0].ref_count == 0
    stats = client.stats()
    assert (stats["referenced"], stats["evictable"]) == (0, 1)

    client.delete(oid)
    assert not client.contains(oid)
    assert client.list() == []
    stats = client.stats()
    assert (stats["used"], stats["objects"], stats["sealed"]) == (0, 0, 0)


def test_seal_with_release_drops_creator_reference(store):
    client = store.client()
    oid = OID.from_random()
    buffer = client.create(oid, 10)
    memoryview(buffer)[:] = b"0123456789"
    client.seal(oid, release=True)
    assert client.list()[0].ref_count == 0
    assert client.stats()["evictable"] == 1
    assert bytes(client.get_buffer(oid)) == b"0123456789"


def test_buffer_of_creator_released_after_seal_does_not_steal_a_get_reference(store):
    """seal(release=True) already gave the creator's reference back, so freeing the
    create() buffer afterwards must not release a reference taken later by get()."""
    client = store.client()
    oid = OID.from_random()
    buffer = client.create(oid, 100)
    memoryview(buffer)[:] = b"x" * 100
    client.seal(oid, release=True)
    reader = client.get_buffer(oid)
    assert client.list()[0].ref_count == 1
    del buffer
    gc.collect()
    # The reader still uses the object: it must stay referenced (not evictable).
    assert client.list()[0].ref_count == 1
    assert client.stats()["referenced"] == 1
    assert client.evict(1 << 30) == 0
    assert bytes(reader) == b"x" * 100


def test_seal_with_release_after_the_buffer_was_collected(store):
    """release=True means "drop the creator's reference now rather than when its buffer is
    freed"; if the buffer is already freed there is nothing left to drop, and the seal must
    still happen (whether the garbage collector ran first must not matter)."""
    client = store.client()
    oid = OID.from_random()
    memoryview(client.create(oid, 3))[:] = b"abc"  # the buffer is a temporary
    gc.collect()
    client.seal(oid, release=True)
    assert client.contains(oid)
    assert bytes(client.get_buffer(oid)) == b"abc"

    array_oid = OID.from_random()
    client.create_array(array_oid, 4, np.int32)[:] = 5
    client.seal(array_oid, release=True)
    assert client.get(array_oid).tolist() == [5] * 4
    assert client.stats()["referenced"] == 0


def test_metadata_round_trip(store):
    client = store.client()
    oids = [OID.from_random() for _ in range(3)]
    metadata = [b"", b"m", bytes(range(256)) * 10]
    for oid, meta in zip(oids, metadata, strict=True):
        buffer = client.create(oid, 7, metadata=meta)
        memoryview(buffer)[:] = b"payload"
        client.seal(oid, release=True)
        del buffer
    for _oid, meta, got in zip(oids, metadata, client.get_buffers(oids, timeout_ms=0), strict=True):
        assert bytes(got) == b"payload"
        assert bytes(got.metadata()) == meta
        assert got.metadata().readonly
    sizes = {o.id: o.metadata_size for o in client.list()}
    assert [sizes[o] for o in oids] == [0, 1, 2560]


def test_zero_size_object(store):
    client = store.client()
    oid = client.put(b"")
    got = client.get_buffer(oid)
    assert len(got) == 0 and bytes(got) == b""
    assert client.list()[0].data_size == 0
    assert client.stats()["used"] == 64  # even an empty object takes one line


def test_get_with_timeout_returns_none(store):
    client = store.client()
    missing = OID.from_random()
    start = time.monotonic()
    assert client.get_buffers([missing], timeout_ms=150) == [None]
    assert 0.14 <= time.monotonic() - start < 3
    assert client.get([missing], timeout_ms=0) == [None]
    with pytest.raises(shoal.ObjectNotFound):
        client.get(missing, timeout_ms=50)

    # Mixed: the present object comes back, the missing one is None.
    present = client.put(b"here")
    got = client.get_buffers([present, missing], timeout_ms=50)
    assert bytes(got[0]) == b"here" and got[1] is None

    # An unsealed object is not returned either, even to its creator.
    unsealed = OID.from_random()
    buffer = client.create(unsealed, 4)
    assert client.get_buffers([unsealed], timeout_ms=50) == [None]
    client.abort(unsealed)
    del buffer


def test_get_blocks_until_another_process_seals(store, spawn):
    client = store.client()
    oid = OID.from_random()
    writer = spawn(
        """
        client = shoal.Client(sys.argv[1])
        oid = bytes.fromhex(sys.argv[2])
        buffer = client.create(oid, 11, metadata=b"late")
        memoryview(buffer)[:] = b"hello world"
        emit("created")
        time.sleep(0.2)
        client.seal(oid, release=True)
        emit("sealed")
        sys.stdin.readline()  # stay connected until told to go
        """,
        store.socket,
        oid.hex(),
    )
    assert writer.json() == "created"
    assert not client.contains(oid)
    start = time.monotonic()
    got = client.get_buffer(oid, timeout_ms=20_000)
    elapsed = time.monotonic() - start
    assert bytes(got) == b"hello world"
    assert bytes(got.metadata()) == b"late"
    assert 0.1 < elapsed < 10, elapsed
    assert writer.json() == "sealed"
    writer.send("bye")
    writer.finish()
    # The writer is gone but the sealed object stays.
    assert client.contains(oid)


def test_blocking_get_of_many_waits_for_all(store, spawn):
    client = store.client()
    oids = [OID.from_random() for _ in range(3)]
    first = client.put(b"first", oids[0])
    assert first == oids[0]
    writer = spawn(
        """
        client = shoal.Client(sys.argv[1])
        for i, hex_id in enumerate(sys.argv[2:]):
            time.sleep(0.05)
            client.put(str(i).encode(), shoal.ObjectID.from_hex(hex_id))
        emit("done")
        """,
        store.socket,
        oids[1].hex(),
        oids[2].hex(),
    )
    got = client.get(oids, timeout_ms=20_000)
    assert [g.to_pybytes() for g in got] == [b"first", b"0", b"1"]
    assert writer.json() == "done"
    writer.finish()


def test_abort(store):
    client = store.client()
    before = client.stats()["used"]
    oid = OID.from_random()
    buffer = client.create(oid, 1000, metadata=b"x")
    assert client.stats()["used"] > before
    client.abort(oid)
    assert client.list() == []
    assert not client.contains(oid)
    assert client.stats()["used"] == before
    del buffer
    gc.collect()
    # The id is free again.
    assert client.get(client.put(b"again", oid)).to_pybytes() == b"again"


def test_deferred_delete_while_referenced(store):
    client = store.client()
    data = np.arange(MiB // 8, dtype=np.int64)
    oid = client.put(data)
    used = client.stats()["used"]
    assert used >= MiB

    array = client.get(oid)
    client.delete(oid)
    # Gone from view at once...
    assert not client.contains(oid)
    assert client.list() == []
    assert client.get_buffers([oid], timeout_ms=0) == [None]
    with pytest.raises(shoal.ObjectNotFound):
        client.delete(oid)
    # ...but its memory stays valid while the array uses it.
    assert client.stats()["used"] == used
    assert client.stats()["referenced"] == 1
    assert np.array_equal(array, data)

    del array
    gc.collect()
    wait_for(lambda: client.stats()["used"] == 0, timeout=2, message="memory freed after release")
    assert client.stats()["objects"] == 0


def test_subscribe_sealed_and_removed(store):
    client = store.client()
    subscription = client.subscribe()
    assert subscription.next(timeout=0.05) is None

    oid = client.put(b"abc")
    assert subscription.next(timeout=5) == (oid, "sealed", 3, len(b"shoal/bytes"))

    # A created-then-aborted object was never visible: no notification.
    aborted = OID.from_random()
    buffer = client.create(aborted, 10)
    client.abort(aborted)
    del buffer

    client.delete(oid)
    assert subscription.next(timeout=5) == (oid, "removed", 0, 0)

    # Eviction is a removal too.
    evicted = client.put(b"x" * 1000)
    assert subscription.next(timeout=5) == (evicted, "sealed", 1000, len(b"shoal/bytes"))
    assert client.evict(1) == 1024
    assert subscription.next(timeout=5) == (evicted, "removed", 0, 0)
    assert subscription.next(timeout=0.1) is None


def test_subscribe_deferred_delete_notifies_removal_once(store):
    client = store.client()
    subscription = client.subscribe()
    oid = client.put(b"abc")
    assert subscription.next(timeout=5)[1] == "sealed"
    held = client.get_buffer(oid)
    client.delete(oid)
    assert subscription.next(timeout=5) == (oid, "removed", 0, 0)
    del held
    gc.collect()
    wait_for(lambda: client.stats()["objects"] == 0, timeout=2)
    # The object was removed once; freeing its memory later is not a second removal.
    assert subscription.next(timeout=0.2) is None


def test_subscription_from_other_process(store, spawn):
    client = store.client()
    listener = spawn(
        """
        subscription = shoal.Client(sys.argv[1]).subscribe()
        emit("ready")
        events = [subscription.next(timeout=10) for _ in range(2)]
        emit([[e[0].hex(), e[1], e[2]] for e in events])
        """,
        store.socket,
    )
    assert listener.json() == "ready"
    oid = client.put(b"12345")
    client.delete(oid)
    assert listener.json() == [[oid.hex(), "sealed", 5], [oid.hex(), "removed", 0]]
    listener.finish()


def test_every_seal_after_subscribe_returns_is_delivered(store):
    """The subscription is registered before Subscribe is answered: a seal by another
    client right after `subscribe()` returns is never missed."""
    client, other = store.client(), store.client()
    for _ in range(30):
        with client.subscribe() as subscription:
            oid = other.put(b"x")
            assert subscription.next(timeout=5) == (oid, "sealed", 1, len(b"shoal/bytes"))


def test_subscription_close_wakes_a_blocked_next(store):
    import threading

    subscription = store.client().subscribe()
    outcome: list[BaseException | object] = []

    def wait() -> None:
        try:
            outcome.append(subscription.next())
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            outcome.append(err)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    subscription.close()
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "close() left next() blocked"
    assert isinstance(outcome[0], shoal.Disconnected)
    with pytest.raises(shoal.Disconnected):
        subscription.next(timeout=0.1)
    subscription.close()  # idempotent


def test_dropping_many_buffers_releases_them_all(store):
    """Drops of a burst of buffers are coalesced into few Release messages; all arrive,
    and another client sees the references gone without this client calling again."""
    client, observer = store.client(), store.client()
    ids = [OID.from_random() for _ in range(2000)]
    client.put_batch(ids, [b"v"] * len(ids))
    buffers = client.get_buffers(ids)
    assert observer.stats()["referenced"] == len(ids)
    del buffers
    wait_for(lambda: observer.stats()["referenced"] == 0, timeout=2)
    # An isolated drop is sent at once.
    time.sleep(0.01)
    one = client.get_buffer(ids[0])
    del one
    wait_for(lambda: observer.stats()["referenced"] == 0, timeout=0.05)


def test_ids_are_read_from_any_iterable_and_checked(store):
    client = store.client()
    ids = [OID.from_random() for _ in range(3)]
    client.put_batch(ids, [b"a", b"b", b"c"])
    got = client.get_buffers(i for i in ids)  # a generator
    assert [bytes(b) for b in got] == [b"a", b"b", b"c"]
    assert [bytes(b) for b in client.get_buffers(tuple(i.binary() for i in ids))] == [b"a", b"b", b"c"]
    for bad in ([b"short"], [ids[0], 7], ["x" * 20], 42):
        with pytest.raises(TypeError, match="ObjectID or 20 bytes"):
            client.get_buffers(bad)
    del got


def test_evict_lru_order_and_referenced_objects_stay(store):
    client = store.client()
    a, b, c = (client.put(np.full(MiB // 8, i, dtype=np.int64)) for i in range(3))
    assert client.stats()["evictable"] == 3
    client.get(a)  # touch a (the temporary is released at once): b is now the oldest
    gc.collect()
    freed = client.evict(1)
    assert freed >= MiB
    assert not client.contains(b)
    assert client.contains(a) and client.contains(c)
    stats = client.stats()
    assert (stats["evictions"], stats["evicted_bytes"]) == (1, freed)

    held = client.get(c)
    freed = client.evict(1 << 40)  # everything evictable
    assert not client.contains(a)
    assert client.contains(c)  # referenced: never evicted
    assert freed >= MiB
    assert client.evict(1 << 40) == 0
    assert np.array_equal(held, np.full(MiB // 8, 2, dtype=np.int64))


def test_create_evicts_unreferenced_objects_when_full(store):
    client = store.client()
    old = client.put(b"\1" * (40 * MiB))
    assert client.stats()["evictable"] == 1
    new = client.put(b"\2" * (30 * MiB))  # only fits if `old` goes
    assert not client.contains(old)
    assert client.get(new).to_pybytes()[:3] == b"\2\2\2"
    assert client.stats()["evictions"] == 1


def test_put_batch(store):
    client = store.client()
    rng = np.random.default_rng(7)
    sizes = [0, 1, 63, 64, 65, 4096, 100_000] + list(rng.integers(0, 5000, 43))
    payloads = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]
    oids = [OID.from_random() for _ in payloads]
    inputs = [
        p if i % 3 == 0 else bytearray(p) if i % 3 == 1 else memoryview(p) for i, p in enumerate(payloads)
    ]
    client.put_batch(oids, inputs)
    stats = client.stats()
    assert (stats["objects"], stats["sealed"], stats["referenced"]) == (50, 50, 0)
    got = client.get_buffers(oids, timeout_ms=0)
    assert [bytes(g) for g in got] == payloads
    assert all(bytes(g.metadata()) == b"" for g in got)

    # With metadata, and numpy arrays as sources.
    more = [OID.from_random() for _ in range(3)]
    arrays = [np.arange(10, dtype=np.float64), np.ones((3, 4), dtype=np.int16), np.zeros(0)]
    client.put_batch(more, arrays, metadata=[b"a", b"bb", b""])
    for oid, array, meta in zip(more, arrays, [b"a", b"bb", b""], strict=True):
        buffer = client.get_buffer(oid)
        assert bytes(buffer) == array.tobytes()
        assert bytes(buffer.metadata()) == meta


def test_large_puts_stream_every_byte_and_copy_into_checks_its_buffers(store):
    # 40 MB: above shoal_core::copy::STREAM_THRESHOLD (32 MiB), so put copies with
    # non-temporal stores, through _internal.copy_into and through put_batch.
    client = store.client()
    value = np.random.default_rng(3).integers(0, 256, 40_000_003, dtype=np.uint8)
    oid = client.put(value)
    assert np.array_equal(client.get(oid), value)
    client.delete(oid)  # room for the next one in a small test store
    batch = OID.from_random()
    client.put_batch([batch], [value[1:]])
    assert memoryview(client.get_buffer(batch)) == memoryview(value[1:])
    client.delete(batch)

    buffer = client.create(OID.from_random(), 10)
    with pytest.raises(ValueError, match="copy of 9 bytes"):
        shoal._internal.copy_into(buffer, b"123456789")
    with pytest.raises(ValueError, match="read-only"):
        shoal._internal.copy_into(bytes(10), b"0123456789")
    shoal._internal.copy_into(buffer, b"0123456789")
    assert bytes(buffer) == b"0123456789"


def test_create_array_zero_copy(store):
    client = store.client()
    oid = OID.from_random()
    array = client.create_array(oid, (100, 10), np.float32)
    assert array.shape == (100, 10) and array.dtype == np.float32
    assert array.flags.writeable and array.flags.c_contiguous
    assert in_region(client, array.ctypes.data, array.nbytes)
    array[:] = np.arange(1000, dtype=np.float32).reshape(100, 10)
    client.seal(oid)

    got = client.get(oid)
    assert isinstance(got, np.ndarray)
    assert got.ctypes.data == array.ctypes.data
    assert got.shape == (100, 10) and got.dtype == np.float32
    assert not got.flags.writeable
    assert np.array_equal(got, np.arange(1000, dtype=np.float32).reshape(100, 10))

    scalar_oid = OID.from_random()
    scalar = client.create_array(scalar_oid, (), np.int64)
    scalar[()] = 42
    client.seal(scalar_oid, release=True)
    assert client.get(scalar_oid).shape == ()
    assert int(client.get(scalar_oid)) == 42

    vector_oid = OID.from_random()
    client.create_array(vector_oid, 5, "u1")[:] = 7
    client.seal(vector_oid)
    assert client.get(vector_oid).tolist() == [7] * 5


@pytest.mark.parametrize("line", [64, 128])
def test_line_size_alignment(make_store, line):
    daemon = make_store(args=["--line-size", str(line)] if line != 64 else [])
    client = daemon.client()
    assert client.stats()["line_size"] == line
    assert client.region_address % 4096 == 0
    oids = [client.put(b"x" * n) for n in (1, 100, line - 1, line, line + 1, 1000)]
    oids.append(client.put(np.arange(33, dtype=np.int8)))
    for oid in oids:
        buffer = client.get_buffer(oid)
        assert (buffer.address - client.region_address) % line == 0
    array = client.create_array(OID.from_random(), 3, np.int8)
    assert (array.ctypes.data - client.region_address) % line == 0
    # Every object takes whole lines.
    assert client.stats()["used"] % line == 0


def test_list_and_stats_with_many_objects(store):
    client = store.client()
    oids = {client.put(i.to_bytes(4, "little")) for i in range(100)}
    assert {o.id for o in client.list()} == oids
    assert all(o.sealed and o.data_size == 4 for o in client.list())
    stats = client.stats()
    assert (stats["objects"], stats["sealed"], stats["evictable"]) == (100, 100, 100)
    assert stats["capacity"] == 64 * MiB == client.capacity
    assert stats["used"] == 100 * 64
    client.delete(list(oids))
    assert client.list() == [] and client.stats()["used"] == 0


def test_contains_and_object_id(store):
    client = store.client()
    oid = OID.from_random()
    assert not client.contains(oid)
    client.put(b"x", oid)
    assert client.contains(oid) and client.contains(oid.binary())
    assert OID.from_hex(oid.hex()) == oid
    assert hash(OID(oid.binary())) == hash(oid)
    assert bytes(oid) == oid.binary() and len(oid.binary()) == OID.SIZE == 20
    assert oid != oid.binary()
    assert sorted([oid, OID(b"\0" * 20)])[0] == OID(b"\0" * 20)


def test_client_context_manager_and_close_release_references(store):
    observer = store.client()
    oid = observer.put(b"shared")
    with shoal.Client(store.socket) as client:
        buffer = client.get_buffer(oid)
        assert observer.stats()["referenced"] == 1
        assert repr(client) == f"shoal.Client(socket={store.socket!r})"
    del buffer
    wait_for(lambda: observer.stats()["referenced"] == 0, timeout=2)
    wait_for(lambda: observer.stats()["clients"] == 1, timeout=2)
