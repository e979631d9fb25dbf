"""Clusters on one host: several daemons, one object namespace, zero-copy remote gets.

Each test starts its own emulated cluster (`python -m shoal cluster up`): one daemon
per node with its own socket, /dev/shm region and peer RPC port.
"""

from __future__ import annotations

import gc
import resource
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _shoal_testing import in_region, snapshot, wait_for

import shoal

OID = shoal.ObjectID


def object_refs(client: shoal.Client, oid: shoal.ObjectID) -> int:
    return next(o.ref_count for o in client.list() if o.id == oid)


def test_a_get_on_another_node_reads_the_owners_memory_in_place(mapped_cluster):
    cluster = mapped_cluster
    owner, reader = cluster.client(0), cluster.client(1)
    table = pa.table({"x": np.arange(100_000), "s": [f"row {i}" for i in range(100_000)]})
    oid = owner.put(table)
    got = reader.get(oid)
    assert got.equals(table)
    assert pc.sum(got["x"]).as_py() == 100_000 * 99_999 // 2
    address = got["x"].chunk(0).buffers()[1].address
    # Not in the reader's own region (no copy landed there), but in node 0's region,
    # at the very address node 0's client sees it (offset for offset).
    assert not in_region(reader, address)
    owner_address = owner.get(oid)["x"].chunk(0).buffers()[1].address
    assert address - reader._raw.get([oid])[0].address == owner_address - owner.get_buffer(oid).address
    buffer = reader.get_buffer(oid)
    assert buffer.readonly
    assert reader.stats()["objects"] == 0, "the reader's node stored nothing"


def test_ids_are_unique_across_the_cluster(cluster):
    clients = [cluster.client(i) for i in range(3)]
    oid = clients[0].put(b"first")
    for other in clients[1:]:
        before = snapshot(other)
        with pytest.raises(shoal.ObjectExists, match="exists in the cluster"):
            other.put(b"second", oid)
        with pytest.raises(shoal.ObjectExists):
            other.create(oid, 10)
        assert snapshot(other) == before
    # Unsealed ids are claimed too.
    pending = OID.from_random()
    buffer = clients[2].create(pending, 8)
    with pytest.raises(shoal.ObjectExists):
        clients[0].put(b"x", pending)
    clients[2].abort(pending)
    del buffer
    wait_for(lambda: _try_put(clients[0], pending), timeout=5, message="id free after abort")


def _try_put(client: shoal.Client, oid: shoal.ObjectID) -> bool:
    try:
        client.put(b"now mine", oid)
        return True
    except shoal.ObjectExists:
        return False


def test_a_batch_create_that_conflicts_anywhere_creates_nothing(cluster):
    a, b = cluster.client(0), cluster.client(1)
    taken = a.put(b"taken")
    fresh = [OID.from_random() for _ in range(50)]
    before = snapshot(b)
    with pytest.raises(shoal.ObjectExists):
        b.put_batch([*fresh, taken], [b"v"] * 51)
    assert snapshot(b) == before
    b.put_batch(fresh, [b"v"] * 50)  # the fresh ids were not left claimed
    assert all(a.contains(i) is False for i in fresh)  # contains is local


def test_a_multi_get_spread_over_every_node(cluster):
    clients = [cluster.client(i) for i in range(3)]
    ids = []
    for node, client in enumerate(clients):
        batch = [OID.from_random() for _ in range(200)]
        client.put_batch(batch, [bytes([node]) * 64] * 200)
        ids += batch
    for reader in clients:
        buffers = reader.get_buffers(ids, timeout_ms=5000)
        assert [bytes(b)[0] for b in buffers] == [i // 200 for i in range(600)]
        del buffers


def test_delete_from_another_node_and_reuse_of_the_id(cluster):
    a, b, c = cluster.client(0), cluster.client(1), cluster.client(2)
    oid = a.put(b"short-lived")
    assert b.get(oid).to_pybytes() == b"short-lived"  # b caches the owner
    b.delete(oid)
    assert not a.contains(oid)
    assert b.get_buffers([oid], timeout_ms=100) == [None]
    c.put(b"reborn", oid)
    assert b.get(oid).to_pybytes() == b"reborn"
    with pytest.raises(shoal.ObjectNotFound):
        b.delete(OID.from_random())


def test_objects_referenced_from_another_node_are_not_evicted(cluster):
    owner, reader = cluster.client(0), cluster.client(1)
    kept, loose = owner.put(b"k" * 1000), owner.put(b"l" * 1000)
    held = reader.get_buffer(kept)
    assert object_refs(owner, kept) == 1
    owner.evict(10**9)
    assert owner.contains(kept) and not owner.contains(loose)
    del held
    gc.collect()
    wait_for(lambda: object_refs(owner, kept) == 0, timeout=3)
    assert owner.evict(10**9) > 0 and not owner.contains(kept)


def test_a_get_waits_for_a_seal_on_another_node(cluster):
    writer, reader = cluster.client(0), cluster.client(2)
    oid = OID.from_random()
    buffer = writer.create(oid, 5)
    started = time.monotonic()
    assert reader.get_buffers([oid], timeout_ms=200) == [None]
    assert 0.15 < time.monotonic() - started < 2
    memoryview(buffer)[:] = b"later"
    writer.seal(oid)
    assert bytes(reader.get_buffer(oid, timeout_ms=5000)) == b"later"
    del buffer


def test_a_crashed_client_releases_its_references_on_other_nodes(cluster, spawn):
    owner = cluster.client(0)
    oid = owner.put(b"held remotely")
    holder = spawn(
        """
        client = shoal.Client(sys.argv[1])
        held = client.get_buffer(shoal.ObjectID.from_hex(sys.argv[2]))
        emit("holding")
        time.sleep(60)
        """,
        cluster.socket(1),
        oid.hex(),
    )
    assert holder.json() == "holding"
    assert object_refs(owner, oid) == 1
    holder.kill()
    wait_for(lambda: object_refs(owner, oid) == 0, timeout=5, message="reference released")


def test_a_dead_node_loses_its_references_after_the_lease(cluster):
    owner = cluster.client(0)
    oid = owner.put(b"leased")
    reader = cluster.client(2)
    held = reader.get_buffer(oid)
    assert object_refs(owner, oid) == 1
    cluster.kill(2)
    # Lease 2 s, heartbeats every 200 ms: reclaimed within a bounded delay.
    started = time.monotonic()
    wait_for(lambda: object_refs(owner, oid) == 0, timeout=6, message="lease expiry")
    assert time.monotonic() - started < 5
    assert "node 2" in cluster.log(0) and "lease expired" in cluster.log(0)
    del held


def test_node_death_keeps_the_rest_working_and_fails_fast(cluster):
    a, b, c = cluster.client(0), cluster.client(1), cluster.client(2)
    on_a = [a.put(f"a{i}".encode()) for i in range(20)]
    on_c = [c.put(f"c{i}".encode()) for i in range(20)]
    assert len([x for x in b.get_buffers(on_c, timeout_ms=1000) if x is not None]) == 20
    cluster.kill(2)
    started = time.monotonic()
    got = b.get_buffers(on_a + on_c, timeout_ms=500)
    elapsed = time.monotonic() - started
    assert elapsed < 5, f"a get with a dead node took {elapsed:.1f} s"
    assert [bytes(x) for x in got[:20]] == [f"a{i}".encode() for i in range(20)]
    # New objects whose home is the dead node cannot be registered: a clear error, fast.
    errors = 0
    for _ in range(30):
        try:
            b.put(b"new")
        except shoal.NodeUnavailable as err:
            assert "node 2" in str(err)
            errors += 1
    assert 0 < errors < 30  # about a third of random ids have the dead node as home
    wait_for(lambda: {s["node"]: s["state"] for s in cluster.status()} == {0: "up", 1: "up", 2: "down"})
    del got


def test_cluster_status_and_ls(cluster):
    a = cluster.client(0)
    oid = a.put(b"x" * 100)
    rows = cluster.status()
    assert [r["node"] for r in rows] == [0, 1, 2]
    assert all(r["state"] == "up" and r["access"] == "mapped" for r in rows)
    assert rows[0]["objects"] == 1 and rows[0]["capacity"] == 64 << 20
    listed = subprocess.run(
        [sys.executable, "-m", "shoal", "ls", "--cluster", "--dir", str(cluster.directory), "--json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert f'"node":0,"id":"{oid.hex()}"' in listed.stdout


def test_a_wrong_cluster_token_is_refused_and_logged(cluster, tmp_path):
    forged = tmp_path / "forged.toml"
    forged.write_text(
        "\n".join(
            'token = "not-the-token"' if line.startswith("token =") else line
            for line in cluster.file.read_text().splitlines()
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "shoal", "ls", "--cluster", "--file", str(forged)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "refused" in result.stderr or "token" in result.stderr, result.stderr
    assert "peer call refused: wrong cluster token" in cluster.log(0)
    # The real members still talk to each other.
    oid = cluster.client(0).put(b"still fine")
    assert cluster.client(1).get(oid).to_pybytes() == b"still fine"


def test_a_client_of_a_single_daemon_is_not_clustered(store):
    client = store.client()
    assert client._raw.clustered is False and client._raw.node == 0


# -- remote allocation ---------------------------------------------------------------------------


def test_create_on_another_node_writes_its_memory_in_place(mapped_cluster):
    cluster = mapped_cluster
    writer, host, reader = cluster.client(0), cluster.client(1), cluster.client(2)
    oid = OID.from_random()
    buffer = writer.create(oid, 1 << 20, b"meta", node=1)
    assert not in_region(writer, buffer.address, len(buffer)), "allocated in the writer's own region"
    np.frombuffer(buffer, np.uint8)[:] = 7
    writer.seal(oid)
    # The writer's (read-only) view and the host's are the very bytes it wrote in place:
    # a byte changed through the creator's buffer (for this test only) shows in both.
    view, local = writer.get_buffer(oid), host.get_buffer(oid)
    memoryview(buffer)[5] = 9
    assert bytes(view)[5] == 9 and bytes(local)[5] == 9
    memoryview(buffer)[5] = 7
    del buffer, view, local
    # It lives on node 1: node 1 holds it locally.
    assert host.contains(oid) and not writer.contains(oid)
    local = host.get_buffer(oid)
    assert in_region(host, local.address, len(local))
    assert bytes(local.metadata()) == b"meta"
    assert np.frombuffer(reader.get_buffer(oid), np.uint8).min() == 7
    del local


def test_writing_an_object_allocated_on_another_node_takes_no_page_faults(mapped_cluster):
    """The writable mapping of a peer's region is populated when it is made, like the client's
    own region: before, each 4 KiB page of a remote object faulted on its first write (5x
    slower than a local write, bench/table55.py)."""
    writer = mapped_cluster.client(0)
    size = 32 << 20
    for node in (0, 1):
        oid = OID.from_random()
        buffer = writer.create(oid, size, node=node)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        np.frombuffer(buffer, np.uint8)[:] = 7
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert faults < 256, f"{faults} page faults writing {size // 4096} pages on node {node}"
        writer.seal(oid)
        del buffer


def test_tables_and_arrays_built_in_another_nodes_memory(cluster):
    a, b = cluster.client(0), cluster.client(1)
    with a.create_table(pa.schema([("v", pa.float64())]), 10_000, node=2) as builder:
        builder["v"][:] = 0.5
    aid = OID.from_random()
    array = a.create_array(aid, (100, 10), np.int32, node=1)
    array[:] = 3
    a.seal(aid)
    oid = a.put(pa.table({"s": ["x", "y"]}), node=1)
    assert pc.sum(b.get(builder.id)["v"]).as_py() == 5_000
    assert b.get(oid)["s"].to_pylist() == ["x", "y"]
    assert int(b.get(aid).sum()) == 3000
    del array


def test_remote_allocation_errors_change_nothing(cluster):
    a, b = cluster.client(0), cluster.client(1)
    before = snapshot(b)
    with pytest.raises(shoal.ObjectTooLarge):
        a.create(OID.from_random(), 1 << 30, node=1)
    with pytest.raises(shoal.InvalidArgument, match="node 7"):
        a.create(OID.from_random(), 10, node=7)
    taken = b.put(b"mine")
    with pytest.raises(shoal.ObjectExists):
        a.create(taken, 10, node=1)
    assert len(b.list()) == len(before[0]) + 1
    # Abort of a remote allocation frees it on its node at once.
    oid = OID.from_random()
    buffer = a.create(oid, 4096, node=1)
    assert b.stats()["objects"] == 2
    a.abort(oid)
    del buffer
    assert b.stats()["objects"] == 1
    with pytest.raises(shoal.ObjectNotFound):
        a.seal(oid)


@pytest.mark.parametrize("fabric", ["coherent", "noncoherent", "simulated-noncoherent"])
def test_the_flush_hook_does_the_seals_write_back_once(make_cluster, fabric):
    """`_raw.flush_unsealed` (a diagnostic hook for bench/table55.py) runs the write-back a
    seal would run, once: it covers the object on a non-coherent fabric, nothing on a coherent
    one, and the seal that follows does not flush it again. On the simulated fabric only a
    flush moves the bytes to the region, so the reader's bytes show the hook did it."""
    noncoherent = fabric != "coherent"
    cluster = make_cluster(
        coherence="noncoherent" if noncoherent else "coherent", simulate_caches=fabric.startswith("sim")
    )
    writer, reader = cluster.client(0), cluster.client(2)
    for node in (0, 1):  # local and remote allocation
        oid = OID.from_random()
        buffer = writer.create(oid, 100_000, b"meta", node=node)
        np.frombuffer(buffer, np.uint8)[:] = 5
        assert writer._raw.flush_unsealed([oid]) == (100_004 if noncoherent else 0)
        assert writer._raw.flush_unsealed([oid]) == 0, "flushed twice"
        writer.seal(oid)
        del buffer
        got = reader.get_buffer(oid)
        assert np.frombuffer(got, np.uint8).min() == 5 and bytes(got.metadata()) == b"meta"
        del got
    instructions = {"clwb", "clflushopt", "clflush", "dc civac", "dcbf", "none"}
    assert shoal._internal.flush_instruction() in instructions


def test_a_crashed_writer_leaves_no_remote_allocation_behind(cluster, spawn):
    host = cluster.client(1)
    writer = spawn(
        """
        client = shoal.Client(sys.argv[1])
        buffer = client.create(shoal.ObjectID.from_random(), 1 << 20, node=1)
        emit("allocated")
        time.sleep(60)
        """,
        cluster.socket(0),
    )
    assert writer.json() == "allocated"
    assert host.stats()["objects"] == 1
    writer.kill()
    wait_for(lambda: host.stats()["objects"] == 0, timeout=5, message="remote allocation aborted")


# -- HugeTables ----------------------------------------------------------------------------------


def test_a_hugetable_assembled_from_every_nodes_memory(cluster, spawn):
    parts = 6
    writers = [
        spawn(
            """
            import pyarrow as pa, numpy as np
            client = shoal.Client(sys.argv[1])
            node = int(sys.argv[2])
            for index in (node, node + 3):   # chunk 3 + node lands on the next node's memory
                rows = np.arange(index * 1000, (index + 1) * 1000)
                batch = pa.table({"k": rows % 7, "v": rows.astype("float64"), "tag": [f"c{index}"] * 1000})
                target = None if index < 3 else (node + 1) % 3
                client.put_chunk("sales", index, batch, node=target)
            emit("done")
            """,
            cluster.socket(node),
            str(node),
        )
        for node in range(3)
    ]
    assert [w.json() for w in writers] == ["done"] * 3
    clients = [cluster.client(node) for node in range(3)]
    tables = [client.get_table("sales", parts, timeout_ms=5000) for client in clients]
    for table in tables:
        assert table.num_rows == 6000 and table.num_columns == 3 and table["v"].num_chunks == parts
        assert table["tag"].to_pylist()[::1000] == [f"c{i}" for i in range(6)]
        assert pc.sum(table["v"]).as_py() == sum(range(6000))
    # Chunk i lives in the memory of the node that holds it, not in the reader's.
    reader, table = clients[0], tables[0]
    ids = [shoal.hugetable.chunk_id("sales", i) for i in range(parts)]
    holders = [next(n for n in range(3) if clients[n].contains(oid)) for oid in ids]
    assert holders == [0, 1, 2, 1, 2, 0]
    for i, holder in enumerate(holders):
        address = table["v"].chunk(i).buffers()[1].address
        assert in_region(reader, address) == (holder == 0)
    # Engines run on it in place.
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.register("sales", table)
    assert con.sql("select count(*), sum(v) from sales where k = 3").fetchall()[0] == (
        sum(1 for r in range(6000) if r % 7 == 3), float(sum(r for r in range(6000) if r % 7 == 3)),
    )  # fmt: skip
    polars = pytest.importorskip("polars")
    frame = polars.from_arrow(table)
    assert frame.filter(polars.col("k") == 3).height == sum(1 for r in range(6000) if r % 7 == 3)
    con.close()
    reader.delete_table("sales", parts)
    del table, tables, frame, con
    gc.collect()
    for node in range(3):
        wait_for(lambda n=node: clients[n].stats()["objects"] == 0, timeout=5, message=f"node {node} empty")


def test_hugetable_errors_name_the_problem(cluster):
    a, b = cluster.client(0), cluster.client(1)
    a.put_chunk("t", 0, pa.table({"x": [1, 2]}))
    b.put_chunk("t", 2, pa.table({"x": [5]}))
    with pytest.raises(shoal.Timeout, match=r"missing chunks \[1\]"):
        b.get_table("t", 3, timeout_ms=200)
    b.put_chunk("t", 1, pa.table({"x": ["not an int"]}))
    with pytest.raises(shoal.InvalidArgument, match="chunk 1 .* schema"):
        a.get_table("t", 3, timeout_ms=1000)
    with pytest.raises(shoal.ObjectExists):
        a.put_chunk("t", 0, pa.table({"x": [9]}))
    with pytest.raises(TypeError):
        a.put_chunk("u", 0, {"x": [1]})


# -- barriers and flags --------------------------------------------------------------------------


def test_a_barrier_across_nodes_releases_everyone_together(cluster, spawn):
    parties = [
        spawn(
            """
            client = shoal.Client(sys.argv[1])
            time.sleep(float(sys.argv[2]))
            slot = shoal.barrier("phase-1", 3, timeout=20, client=client)
            emit({"slot": slot, "left": time.time()})
            """,
            cluster.socket(node),
            str(delay),
        )
        for node, delay in ((0, 0.0), (1, 0.3), (2, 0.6))
    ]
    results = [p.json() for p in parties]
    assert sorted(r["slot"] for r in results) == [0, 1, 2]
    lefts = [r["left"] for r in results]
    assert max(lefts) - min(lefts) < 1.0, "everyone leaves once the last one arrives"


def test_a_barrier_timeout_names_the_missing_parties(cluster):
    client = cluster.client(1)
    with pytest.raises(shoal.Timeout, match=r"1 of 3 parties arrived.*missing \['loader', 'trainer'\]"):
        client.barrier("named", ["loader", "reader", "trainer"], timeout=0.3, party="reader")
    with pytest.raises(shoal.Timeout, match=r"missing \['slot 1'\]"):
        client.barrier("counted", 2, timeout=0.2)
    with pytest.raises(shoal.InvalidArgument):
        client.barrier("named", ["loader", "reader", "trainer"], party="reader")  # already arrived
    with pytest.raises(shoal.InvalidArgument):
        client.barrier("x", ["a"], party="zz")


def test_flags_per_node(cluster):
    a, b = cluster.client(0), cluster.client(2)
    assert b.get_flag("state", node=0, default="none") == "none"
    a.set_flag("state", "loading")
    assert b.get_flag("state", node=0) == "loading"
    a.set_flag("state", {"phase": 2})
    b.wait_flag("state", {"phase": 2}, node=0, timeout=2)
    with pytest.raises(shoal.Timeout, match="not 'done'"):
        b.wait_flag("state", "done", node=0, timeout=0.1)
    b.set_flag("state", "remote-set", node=1)  # a flag kept in node 1's memory
    assert cluster.client(1).get_flag("state") == "remote-set"


# -- network mode --------------------------------------------------------------------------------


@pytest.fixture
def mixed_cluster(make_cluster):
    """Node 1's memory cannot be mapped by the others (access = network)."""
    return make_cluster(modes="mapped,network,mapped")


def test_network_mode_pulls_a_copy_into_local_memory(mixed_cluster):
    cluster = mixed_cluster
    local, far = cluster.client(0), cluster.client(1)
    table = pa.table({"x": np.arange(50_000), "s": [str(i) for i in range(50_000)]})
    oid = far.put(table)
    got = local.get(oid)
    assert got.equals(table)
    # A secondary copy in the reader's own region, under the same id; the primary stays.
    assert in_region(local, got["x"].chunk(0).buffers()[1].address)
    assert local.contains(oid) and far.contains(oid)
    assert [s["access"] for s in cluster.status()] == ["mapped", "network", "mapped"]
    # Large objects are pulled in parallel ranges, byte-exact.
    big = np.random.default_rng(5).integers(0, 256, 24 << 20, dtype=np.uint8)
    bid = far.put(big)
    assert np.array_equal(local.get(bid), big)
    del got


def test_network_copies_are_dropped_when_the_owner_deletes(mixed_cluster):
    cluster = mixed_cluster
    local, far = cluster.client(2), cluster.client(1)
    # Ids whose home is each of the three nodes (the reader itself included).
    ids = [far.put(f"v{i}".encode()) for i in range(12)]
    assert [local.get(i).to_pybytes() for i in ids] == [f"v{i}".encode() for i in range(12)]
    far.delete(ids)
    wait_for(lambda: not any(local.contains(i) for i in ids), timeout=3, message="copies dropped")
    oid = ids[0]
    assert local.get_buffers([oid], timeout_ms=100) == [None]
    far.put(b"version 2", oid)
    assert local.get(oid).to_pybytes() == b"version 2"
    # Deleting through the node that holds a copy deletes the object itself.
    local.delete(oid)
    assert not far.contains(oid)


def test_mapped_nodes_still_read_each_other_in_place(mixed_cluster):
    cluster = mixed_cluster
    a, c = cluster.client(0), cluster.client(2)
    oid = c.put(np.arange(1000))
    array = a.get(oid)
    assert not in_region(a, array.ctypes.data) and int(array.sum()) == 499_500
    assert not a.contains(oid)  # read in place, no copy made
    del array


# -- reference and directory bookkeeping ---------------------------------------------------------


def test_every_remote_reference_is_returned(cluster):
    owner, reader = cluster.client(0), cluster.client(1)
    oid = owner.put(b"shared")
    first, second = reader.get_buffer(oid), reader.get_buffer(oid)
    twice = reader.get_buffers([oid, oid])
    assert object_refs(owner, oid) == 4
    del first
    gc.collect()
    wait_for(lambda: object_refs(owner, oid) == 3, timeout=3)
    del second, twice
    gc.collect()
    wait_for(lambda: object_refs(owner, oid) == 0, timeout=3, message="all references returned")


def test_a_writer_that_dies_before_sealing_frees_its_ids(cluster, spawn):
    oid = OID.from_random()
    writer = spawn(
        """
        client = shoal.Client(sys.argv[1])
        buffer = client.create(shoal.ObjectID.from_hex(sys.argv[2]), 100)
        emit("created")
        time.sleep(60)
        """,
        cluster.socket(0),
        oid.hex(),
    )
    assert writer.json() == "created"
    other = cluster.client(2)
    with pytest.raises(shoal.ObjectExists):
        other.put(b"mine", oid)
    writer.kill()
    wait_for(lambda: _try_put(other, oid), timeout=5, message="id free after the writer died")
