"""Tiers below memory from Python: eviction goes down a tier and gets restore objects
zero-copy, durability levels survive kill -9, staging, the CLI's view of the tiers, and a
cluster node whose objects left memory still serves them to other nodes."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest
from _shoal_testing import Daemon, shoal_command

import shoal

MIB = 1 << 20


def tier_args(directory, *extra: str) -> list[str]:
    return ["--burst", str(directory / "burst"), "--backing", str(directory / "backing"), *extra]


def table(i: int, rows: int = 50_000) -> pa.Table:
    return pa.table({"i": np.arange(rows, dtype=np.int64) + i, "x": np.full(rows, float(i))})


def test_more_data_than_memory_comes_back_zero_copy(make_store, tmp_path):
    store = make_store(capacity="8MiB", args=tier_args(tmp_path))
    client = store.client()
    ids = [client.put(table(i)) for i in range(40)]  # ~32 MB through 8 MiB of memory
    assert client.stats()["evictions"] > 0
    rows = {o.id: o for o in client.list()}
    assert set(rows) == set(ids)
    assert any(not o.resident and o.tiers for o in rows.values())
    for i, oid in enumerate(ids):
        got = client.get(oid)
        assert got.equals(table(i))
        # Restored into store memory and read in place: no copy.
        address = got.column("i").chunks[0].buffers()[1].address
        base = client.region_address
        assert base <= address < base + client.region_size
        del got
    assert client.tiers()["restores"] > 0


def test_a_local_seal_survives_kill_9(make_store, tmp_path):
    args = tier_args(tmp_path)
    store = make_store(capacity="16MiB", args=args, name="a")
    client = store.client()
    durable = client.put(table(1), durability="local")
    backed = client.put(b"x" * 100_000, durability="backing")
    later = client.put(np.arange(1000))
    client.wait_durable([later], "local", timeout=10)
    client.close()
    store.kill()
    store = Daemon(store.directory, capacity="16MiB", args=args)
    try:
        client = shoal.Client(store.socket)
        assert client.get(durable).equals(table(1))
        assert bytes(client.get(backed)) == b"x" * 100_000
        assert (client.get(later) == np.arange(1000)).all()
        client.close()
    finally:
        store.teardown()


def test_durability_errors_are_typed(make_store, tmp_path):
    memory_only = make_store(capacity="4MiB", name="m").client()
    with pytest.raises(shoal.InvalidArgument):
        memory_only.put(b"abc", durability="local")
    with pytest.raises(shoal.InvalidArgument):
        memory_only.put(b"abc", durability="disk")
    burst_only = make_store(capacity="4MiB", args=["--burst", str(tmp_path / "burst-b")], name="b").client()
    oid = burst_only.put(b"abc", durability="local")
    with pytest.raises(shoal.InvalidArgument):
        burst_only.wait_durable([oid], "backing", timeout=1)
    with pytest.raises(shoal.ObjectNotFound):
        burst_only.wait_durable([shoal.ObjectID.from_random()], "local", timeout=1)


def test_stage_out_and_in(make_store, tmp_path):
    store = make_store(capacity="16MiB", args=tier_args(tmp_path))
    client = store.client()
    ids = [client.put(table(i, 10_000)) for i in range(5)]
    client.stage_out(ids)
    assert all(not o.resident and "backing" in o.tiers for o in client.list())
    assert client.stats()["used"] == 0
    tiers = client.tiers()
    assert tiers["tiers"]["backing"]["objects"] == 5
    client.stage_in(ids[:2])
    resident = {o.id for o in client.list() if o.resident}
    assert resident == set(ids[:2])
    # A referenced object cannot leave memory; it is durable anyway.
    held = client.get(ids[0])
    with pytest.raises(shoal.ObjectInUse):
        client.stage_out([ids[0]])
    del held


def test_cooled_objects_leave_memory_first_and_a_read_warms_them(make_store, tmp_path):
    store = make_store(capacity="8MiB", args=tier_args(tmp_path))
    client = store.client()
    blob = b"x" * MIB
    ids = [client.put(blob) for _ in range(6)]  # 6 of the 7 objects memory holds
    # The drain pins an object while it copies it down, and a pinned object cannot
    # leave: let the copies finish so that the order below is the cooling's alone.
    client.wait_durable(ids, "backing", timeout=10)
    client.cool([ids[4], ids[1]])
    client.cool(ids[3])
    client.get(ids[3])  # read again: warm
    client.put(blob)
    client.put(blob)
    resident = {o.id for o in client.list() if o.resident}
    assert ids[1] not in resident and ids[4] in resident, "the last cooled left first"
    assert {ids[0], ids[2], ids[3], ids[5]} <= resident
    with pytest.raises(shoal.ObjectNotFound):
        client.cool([ids[1]])  # on a tier only: nothing in memory to cool
    with pytest.raises(shoal.ObjectNotFound):
        client.cool(shoal.ObjectID.from_random())
    assert bytes(client.get_buffer(ids[1], timeout_ms=0)) == blob  # back by id


def test_the_cli_shows_and_moves_tiers(make_store, tmp_path):
    store = make_store(capacity="16MiB", args=tier_args(tmp_path))
    client = store.client()
    ids = [client.put(b"%d" % i * 10_000) for i in range(4)]
    client.wait_durable(ids, "backing", timeout=10)
    out = shoal_command("stage-out", "--all", "--socket", store.socket)
    assert out.returncode == 0, out.stderr
    assert "staged out 4 of 4 objects" in out.stdout
    listing = shoal_command("ls", "--socket", store.socket)
    assert listing.stdout.count("burst+backing") == 4, listing.stdout
    out = shoal_command("stage-in", ids[0].binary().hex(), "--socket", store.socket)
    assert out.returncode == 0, out.stderr
    rows = [
        json.loads(line)
        for line in shoal_command("ls", "--json", "--socket", store.socket).stdout.splitlines()
    ]
    assert {r["id"] for r in rows if r["resident"]} == {ids[0].binary().hex()}
    stat = shoal_command("stat", "--socket", store.socket).stdout
    assert re.search(r"backing\s+\S+ \S+ of unbounded used, 4 objects", stat), stat
    stat_json = json.loads(shoal_command("stat", "--json", "--socket", store.socket).stdout)
    assert stat_json["tiers"]["durable_objects"] == 4
    bad = shoal_command("stage-in", "nothex", "--socket", store.socket)
    assert bad.returncode != 0 and "not an object id" in bad.stderr


def test_a_node_serves_objects_that_left_its_memory_to_other_nodes(make_cluster):
    cluster = make_cluster(capacity="16MiB", tiers=True)
    owner, reader = cluster.client(0), cluster.client(1)
    ids = [owner.put(table(i, 20_000)) for i in range(4)]
    owner.wait_durable(ids, "local", timeout=10)
    owner.stage_out(ids)
    assert not any(o.resident for o in owner.list())
    for i, oid in enumerate(ids):
        assert reader.get(oid, timeout_ms=10_000).equals(table(i, 20_000))
    assert owner.tiers()["restores"] == len(ids)


def test_the_plasma_shim_restores_evicted_objects(make_store, tmp_path):
    from shoal import plasma

    store = make_store(capacity="4MiB", args=tier_args(tmp_path))
    client = plasma.connect(store.socket)
    ids = [plasma.ObjectID.from_random() for _ in range(12)]
    for i, oid in enumerate(ids):
        client.put(np.full(100_000, i, dtype=np.int64), oid)  # 800 kB each, 9.6 MB in all
    for i, oid in enumerate(ids):
        assert (client.get(oid) == i).all()
