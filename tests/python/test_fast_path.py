"""The fast path from Python (docs/fast-path.md): a get of a sealed object is served from
the shared index with no request, yet its buffer keeps the object from eviction and from
a delete's free, and a process killed while holding buffers holds nothing afterwards."""

from __future__ import annotations

import gc
import os

import numpy as np
from _shoal_testing import Child, Daemon, wait_for

import shoal

HOLDER = """
client = shoal.Client(sys.argv[1])
ids = [bytes.fromhex(h) for h in sys.argv[2].split(",")]
held = [client.get_buffer(oid) for oid in ids]
emit({"held": len(held), "first": bytes(memoryview(held[0])[:4]).hex()})
time.sleep(600)
"""


def put_objects(client, n: int, size: int = 4096) -> list[bytes]:
    ids = [os.urandom(20) for _ in range(n)]
    client.put_batch(ids, [np.full(size, i % 251, dtype=np.uint8) for i in range(n)])
    return ids


def refs(client, oid: bytes) -> int:
    return {o.id.binary(): o.ref_count for o in client.list()}[oid]


def test_a_get_takes_no_request_and_its_buffer_keeps_the_object_referenced(store: Daemon) -> None:
    client = store.client()
    [oid] = put_objects(client, 1)
    buffer = client.get_buffer(oid)
    assert bytes(memoryview(buffer)[:3]) == b"\0\0\0"
    assert client.region_address <= buffer.address < client.region_address + client.region_size
    # The daemon answered nothing, yet the reference shows in its listing.
    assert refs(client, oid) == 1
    assert client.stats()["referenced"] == 1
    assert client.contains(oid)
    del buffer
    gc.collect()
    assert refs(client, oid) == 0
    assert client.stats()["referenced"] == 0


def test_a_large_get_does_not_fill_page_tables_in_the_callers_thread(make_store) -> None:
    """A get costs the same whatever the object's size: a client that never used the
    object's memory has its page tables filled by a background thread, not in the get
    (inline, a 64 MB object took ~1,000 minor faults in the get, several ms)."""
    import resource

    store = make_store(capacity="256MiB", prefault=True)  # clients populate only then
    size = 64 << 20
    writer = store.client()
    wait_for(lambda: writer.controller()["resident"] >= writer.controller()["capacity"], timeout=60)
    [oid] = put_objects(writer, 1, size)
    reader = store.client()  # a new mapping: none of its page tables are filled
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    buffer = reader.get_buffer(oid)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert faults < 64, f"{faults} minor faults in the get of {size} bytes"
    data = np.frombuffer(buffer, dtype=np.uint8)
    assert data.size == size and int(data[::4096].sum()) == 0 and data[-1] == 0
    del data, buffer
    gc.collect()
    assert refs(reader, oid) == 0


def test_a_held_buffer_outlives_eviction_and_delete(store: Daemon) -> None:
    client = store.client()
    ids = put_objects(client, 4)
    buffer = client.get_buffer(ids[0])
    address = buffer.address
    client.evict(1 << 40)
    assert client.contains(ids[0]), "held: not evicted"
    assert not client.contains(ids[1])
    client.delete(ids[0])
    assert not client.contains(ids[0]), "deleted: gone from view at once"
    assert client.get_buffers([ids[0]], timeout_ms=0) == [None]
    assert client.stats()["used"] >= 4096, "its bytes stay for the reader"
    assert buffer.address == address and bytes(memoryview(buffer)[:2]) == b"\0\0"
    del buffer
    gc.collect()
    wait_for(lambda: client.stats()["used"] == 0, message="the deleted object's memory")


def test_a_reader_killed_holding_buffers_holds_nothing(store: Daemon) -> None:
    client = store.client()
    ids = put_objects(client, 8)
    holder = Child(HOLDER, store.socket, ",".join(oid.hex() for oid in ids))
    try:
        assert holder.json()["held"] == 8
        client.evict(1 << 40)
        assert all(client.contains(oid) for oid in ids), "held by the child"
        holder.kill()
    finally:
        holder.close()
    # Its reference table went with its connection: everything can leave memory.
    wait_for(lambda: client.evict(1 << 40) >= 0 and client.stats()["used"] == 0, message="release")


WRITER = """
client = shoal.Client(sys.argv[1])
sealed = []
i = 0
while True:
    oid = bytes([i % 256, (i >> 8) % 256]) + os.urandom(18)
    buf = client.create(oid, 1000)
    memoryview(buf)[:] = bytes([i % 251]) * 1000
    if i % 3 == 0:
        client.seal(oid, release=True)
        sealed.append(oid)
        emit({"sealed": oid.hex(), "fill": i % 251})
    elif i % 3 == 1:
        client.abort(oid)
    del buf
    i += 1
"""


def test_create_seal_put_and_release_take_no_request(store: Daemon) -> None:
    client = store.client()
    other = store.client()
    client.put(np.zeros(10, dtype=np.uint8))  # the first create asks for lent space
    before = client.requests
    ids = []
    for i in range(200):
        oid = os.urandom(20)
        buf = client.create(oid, 1000)
        memoryview(buf)[:] = bytes([i % 251]) * 1000
        client.seal(oid)
        del buf
        ids.append(oid)
        ids.append(client.put(np.full(1000, i % 251, dtype=np.uint8)).binary())
        assert client.contains(oid)
    gc.collect()
    # Only a new lease now and then (each serves 256 KiB of objects here).
    assert client.requests - before <= 2, "no request for create, seal, put, contains or release"
    # Everyone sees them, whole; nothing stays referenced once the buffers are gone.
    for i, oid in enumerate(ids[::2]):
        assert bytes(memoryview(other.get_buffer(oid))[:3]) == bytes([i % 251]) * 3
    for i, oid in enumerate(ids[1::2]):
        assert (other.get(oid) == i % 251).all()
    gc.collect()
    wait_for(lambda: client.stats()["referenced"] == 0, message="the one-way releases")
    stats = client.stats()
    assert stats["lent"] > 0
    assert stats["used"] >= 400 * 1000, "objects count as used, lent space apart"
    # The socket path behaves the same: a sealed id is refused at create.
    try:
        client.create(ids[0], 10)
        raise AssertionError("created twice")
    except shoal.ObjectExists:
        pass


def test_a_writer_killed_mid_create_or_seal_leaves_nothing_lent_and_its_seals_whole(
    store: Daemon,
) -> None:
    client = store.client()
    sealed = {}
    for _ in range(5):
        writer = Child(WRITER, store.socket)
        try:
            for _ in range(3):
                line = writer.json()
                sealed[bytes.fromhex(line["sealed"])] = line["fill"]
            writer.kill()
        finally:
            writer.close()
    wait_for(lambda: client.stats()["clients"] == 1, message="the writers to go")
    stats = client.stats()
    assert stats["lent"] == 0, "a dead writer's lent space is free again"
    for oid, fill in sealed.items():
        assert bytes(memoryview(client.get_buffer(oid))[:8]) == bytes([fill]) * 8
    gc.collect()
    client.evict(1 << 40)
    assert client.stats()["used"] == 0, "nothing else pins memory"
