"""Zero copy, measured: addresses inside the shared mapping, no anonymous memory growth in
a reading process, and buffers that keep their objects referenced."""

from __future__ import annotations

import gc
import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _shoal_testing import Daemon, MiB, in_region, short_dir, wait_for

import shoal

OBJECT_SIZE = 64 * MiB

READER = """
import pyarrow.compute as pc
client = shoal.Client(sys.argv[1])
oid, table_oid = bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
n = int(sys.argv[4])

def mapping_of(address):
    with open("/proc/self/maps") as f:
        for line in f:
            bounds = line.split()[0]
            low, high = (int(x, 16) for x in bounds.split("-"))
            if low <= address < high:
                return {"line": line.strip(), "low": low, "high": high}
    return None

def inside(address, size):
    return client.region_address <= address and address + size <= client.region_address + client.region_size

gc.collect()
before = status()
array = client.get(oid, timeout_ms=10_000)
address = array.ctypes.data
after_get = status()
total = int(array.sum(dtype=np.uint64))          # touches every page
samples_ok = bool(np.array_equal(array[:: 4096 // 8], np.arange(0, n, 4096 // 8, dtype=np.uint64)))
after_read = status()

buffer = client.get_buffer(oid)
arrow_view = pa.py_buffer(buffer)
numpy_view = np.frombuffer(buffer, dtype=np.uint8)
memory_view = memoryview(buffer)

gc.collect()
before_table = status()
table = client.get(table_oid)
column = table.column("x").chunk(0)
table_sum = pc.sum(column).as_py()
after_table = status()

emit({
    "address": address,
    "nbytes": array.nbytes,
    "in_region": inside(address, array.nbytes),
    "mapping": mapping_of(address),
    "region": [client.region_address, client.region_size],
    "total": total,
    "samples_ok": samples_ok,
    "before": before,
    "after_get": after_get,
    "after_read": after_read,
    "buffer_address": buffer.address,
    "arrow_address": arrow_view.address,
    "arrow_size": arrow_view.size,
    "numpy_address": int(numpy_view.ctypes.data),
    "memoryview_readonly": memory_view.readonly,
    "column_address": column.buffers()[1].address,
    "column_in_region": inside(column.buffers()[1].address, column.buffers()[1].size),
    "table_sum": table_sum,
    "before_table": before_table,
    "after_table": after_table,
})
"""


def test_second_process_reads_64_mib_without_copying(make_store, python):
    daemon = make_store(capacity="96MiB")
    client = daemon.client()
    n = OBJECT_SIZE // 8
    oid = shoal.ObjectID.from_random()
    array = client.create_array(oid, n, np.uint64)  # written in place: zero-copy creation
    step = 1 << 20
    for start in range(0, n, step):
        array[start : start + step] = np.arange(start, min(start + step, n), dtype=np.uint64)
    client.seal(oid, release=True)
    del array
    rows = 2 * MiB
    table_oid = client.put(pa.table({"x": np.arange(rows, dtype=np.int64)}))

    report = python(READER, daemon.socket, oid.hex(), table_oid.hex(), str(n), timeout=60)

    # The array is a view of the child's mapping of the region, not a private copy.
    assert report["nbytes"] == OBJECT_SIZE
    assert report["in_region"], report
    mapping = report["mapping"]
    assert mapping is not None
    assert "/dev/shm/shoal-" in mapping["line"], mapping["line"]
    assert mapping["low"] <= report["region"][0] and report["region"][0] + OBJECT_SIZE <= mapping["high"]
    # Contents are right and were all read.
    assert report["total"] == n * (n - 1) // 2
    assert report["samples_ok"]
    # Reading 64 MiB made no anonymous (private) memory; the pages are shared ones.
    anon_growth = report["after_read"]["RssAnon"] - report["before"]["RssAnon"]
    assert anon_growth < 4 * MiB, f"RssAnon grew by {anon_growth / MiB:.1f} MiB"
    # The client maps the region populated (MAP_POPULATE), so the object's shared
    # pages are resident from connect on: reading adds none.
    assert report["after_read"]["RssShmem"] >= OBJECT_SIZE, report["after_read"]
    rss_growth = report["after_read"]["VmRSS"] - report["before"]["VmRSS"]
    assert rss_growth < OBJECT_SIZE + 4 * MiB  # one mapping of the object, never two
    # Views over the buffer see the same address: no copy in between.
    assert report["arrow_address"] == report["buffer_address"] == report["numpy_address"] == report["address"]
    assert report["arrow_size"] == OBJECT_SIZE
    assert report["memoryview_readonly"]
    # Arrow: same story for a 16 MiB column.
    assert report["column_in_region"]
    assert report["table_sum"] == rows * (rows - 1) // 2
    table_anon = report["after_table"]["RssAnon"] - report["before_table"]["RssAnon"]
    assert table_anon < 4 * MiB, f"RssAnon grew by {table_anon / MiB:.1f} MiB reading a table"


def test_views_share_the_buffer_address(store):
    client = store.client()
    oid = client.put(b"0123456789" * 1000)
    buffer = client.get_buffer(oid)
    assert in_region(client, buffer.address, len(buffer))
    assert pa.py_buffer(buffer).address == buffer.address
    assert np.frombuffer(buffer, dtype=np.uint8).ctypes.data == buffer.address
    view = memoryview(buffer)
    assert view.readonly and view.nbytes == 10_000
    assert view.tobytes() == b"0123456789" * 1000
    with pytest.raises(TypeError):
        view[0] = 1
    with pytest.raises(ValueError):
        np.frombuffer(buffer, dtype=np.uint8)[0] = 1
    # A second get of the same object maps the same bytes.
    assert client.get_buffer(oid).address == buffer.address
    assert client.get(oid).address == buffer.address


def test_buffer_keeps_deleted_object_alive(store):
    client = store.client()
    data = np.random.default_rng(3).integers(0, 256, 3 * MiB, dtype=np.uint8).tobytes()
    oid = client.put(data)
    buffer = client.get_buffer(oid)
    client.delete(oid)
    assert not client.contains(oid)
    stats = client.stats()
    assert stats["referenced"] == 1
    assert stats["used"] >= 3 * MiB
    assert bytes(buffer) == data  # still readable through the buffer
    # Dropping the last view releases the reference, then frees the memory.
    del buffer
    gc.collect()
    wait_for(lambda: client.stats()["referenced"] == 0, timeout=1.5, message="reference released")
    wait_for(lambda: client.stats()["used"] == 0, timeout=1.5, message="memory freed")


def test_derived_views_keep_the_object_referenced(store):
    client = store.client()
    oid = client.put(np.arange(1000, dtype=np.int32))
    array = client.get(oid)
    view = array[10:20]  # numpy view of the store array
    arrow = pa.py_buffer(client.get_buffer(oid))
    meta = client.get_buffer(oid).metadata()
    del array
    gc.collect()
    assert client.stats()["referenced"] == 1
    assert view.tolist() == list(range(10, 20))
    del view, arrow
    gc.collect()
    assert client.list()[0].ref_count == 1  # the metadata view still holds it
    del meta
    gc.collect()
    wait_for(lambda: client.stats()["referenced"] == 0, timeout=1.5)


def test_reference_held_by_other_process(store, spawn):
    client = store.client()
    data = bytes(range(256)) * 4096
    oid = client.put(data)
    reader = spawn(
        """
        client = shoal.Client(sys.argv[1])
        buffer = client.get_buffer(bytes.fromhex(sys.argv[2]))
        emit("holding")
        sys.stdin.readline()
        emit(hashlib.sha256(buffer).hexdigest())   # after the owner deleted it
        del buffer
        gc.collect()
        client.stats()  # a round trip: the release went out before it
        emit("released")
        sys.stdin.readline()
        """,
        store.socket,
        oid.hex(),
    )
    assert reader.json() == "holding"
    assert client.list()[0].ref_count == 1
    client.delete(oid)
    assert client.stats()["referenced"] == 1
    reader.send("check")
    assert reader.json() == hashlib.sha256(data).hexdigest()
    assert reader.json() == "released"
    wait_for(lambda: client.stats()["objects"] == 0, timeout=1.5, message="object freed")
    assert client.stats()["used"] == 0
    reader.send("bye")
    reader.finish()


def test_arrow_result_views_share_the_store(store):
    client = store.client()
    oid = client.put(pa.table({"s": ["a", "bb", None], "i": [1, 2, 3]}))
    table = client.get(oid)
    strings = table.column("s").chunk(0)
    sliced = pc.utf8_upper(strings)  # a computed result is a new (heap) array...
    assert not in_region(client, sliced.buffers()[2].address)
    for b in strings.buffers():  # ...while the column itself is store memory
        if b is not None and b.size:
            assert in_region(client, b.address, b.size)


def tmpfs_used() -> int:
    fs = os.statvfs("/dev/shm")
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def test_connecting_does_not_fault_in_an_untouched_region(tmp_path):
    """With --no-prefault nobody has touched the region yet; a client connecting must not
    allocate all of it (it costs ~1.5 s per GiB and commits the whole capacity)."""
    daemon = Daemon(short_dir(tmp_path) / "lazy", capacity="1GiB", connect=False)
    try:
        before = tmpfs_used()
        client = shoal.Client(daemon.socket)
        grown = tmpfs_used() - before
        assert grown < 256 * MiB, f"connecting allocated {grown / MiB:.0f} MiB of the 1 GiB region"
        assert client.get(client.put(b"lazy")).to_pybytes() == b"lazy"
        client.close()
    finally:
        daemon.teardown()
