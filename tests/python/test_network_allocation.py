"""Remote allocation on nodes reached over the network (`access = "network"`).

`create(..., node=k)` (and `put`, `put_chunk`, `set_flag`, `create_array`, `create_table`
with `node=`) on a node whose memory cannot be mapped here: the object is allocated in k's
memory, the client writes a staging buffer in its own node's memory, and the seal pushes the
bytes over k's bulk data channel (docs/cluster.md, "Remote allocation over the network").
"""

from __future__ import annotations

import gc
import hashlib
import socket
import struct
import tomllib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _shoal_testing import ids_homed_at, in_region, peer_credential, wait_for

import shoal

OID = shoal.ObjectID


@pytest.fixture(params=["coherent", "simulated-noncoherent"])
def network_cluster(request, make_cluster):
    """Three nodes none of which can map another's memory, on both fabrics (on the simulated
    non-coherent one a client's writes reach its own region only through the seal's flush)."""
    if request.param == "coherent":
        return make_cluster(modes="network")
    return make_cluster(modes="network", coherence="noncoherent", simulate_caches=True)


def objects(client: shoal.Client) -> int:
    return client.stats()["objects"]


def unsealed(client: shoal.Client) -> int:
    """Objects being written on the client's node: staging buffers and allocations."""
    return sum(not o.sealed for o in client.list())


def settled(client: shoal.Client) -> None:
    """Waits until no staging buffer is left on the client's node (a buffer sealed without
    release goes when the client's release of it reaches its daemon)."""
    gc.collect()
    wait_for(lambda: unsealed(client) == 0, timeout=5, message="no staging buffer left")


def try_put(client: shoal.Client, oid: shoal.ObjectID, node: int) -> bool:
    try:
        client.put(b"again", oid, node=node)
        return True
    except shoal.ObjectExists:
        return False


def test_every_kind_of_put_lands_in_the_named_nodes_memory(network_cluster):
    cluster = network_cluster
    writer, one, two = cluster.client(0), cluster.client(1), cluster.client(2)
    assert [n["access"] for n in writer.cluster_nodes()] == ["network"] * 3

    oid = writer.put(b"pushed to node 1", node=1)
    assert one.contains(oid) and not writer.contains(oid) and not two.contains(oid)
    assert [o.id for o in one.list()] == [oid]
    settled(writer)  # the staging buffer went with the seal
    for reader in (one, two, writer):
        assert reader.get(oid) == b"pushed to node 1"

    # create: the buffer the client writes is in its own node's memory (a staging buffer);
    # the object is allocated on node 2 (unsealed there) from the start.
    cid = OID.from_random()
    buffer = writer.create(cid, 100_000, b"meta", node=2)
    # (On the simulated fabric a process writes through a private copy of its region.)
    assert in_region(writer, buffer.address, len(buffer)) != cluster.simulate_caches
    assert [o.sealed for o in two.list() if o.id == cid] == [False]
    np.frombuffer(buffer, np.uint8)[:] = 7
    writer.seal(cid)
    assert two.contains(cid) and not writer.contains(cid)
    assert bytes(buffer)[:3] == b"\x07\x07\x07", "the creator's buffer stays readable until released"
    assert unsealed(writer) == 1
    del buffer
    settled(writer)  # released: the staging buffer went
    for reader in (one, two):
        got = reader.get_buffer(cid)
        assert np.frombuffer(got, np.uint8).min() == 7 and bytes(got.metadata()) == b"meta"
        del got

    # put_chunk (HugeTables), flags, arrays, tables.
    table = pa.table({"x": np.arange(10_000), "s": [str(i) for i in range(10_000)]})
    writer.put_chunk("t", 0, table.slice(0, 5000), node=1)
    writer.put_chunk("t", 1, table.slice(5000), node=2)
    assert two.get_table("t", 2).equals(table)
    assert one.contains(shoal.hugetable.chunk_id("t", 0))
    writer.set_flag("state", "ready", node=2)
    assert two.get_flag("state") == "ready" and one.get_flag("state", node=2) == "ready"
    writer.set_flag("state", {"phase": 2}, node=2)
    one.wait_flag("state", {"phase": 2}, node=2, timeout=2)
    aid = OID.from_random()
    array = writer.create_array(aid, (100, 10), np.int32, node=1)
    array[:] = 3
    writer.seal(aid)
    del array
    with writer.create_table(pa.schema([("v", pa.float64())]), 1000, node=2) as builder:
        builder["v"][:] = 0.5
    assert int(two.get(aid).sum()) == 3000
    assert pc.sum(one.get(builder.id)["v"]).as_py() == 500
    del builder


def test_a_mixed_cluster_pushes_only_to_the_nodes_it_cannot_map(make_cluster):
    cluster = make_cluster(modes="mapped,network,mapped")
    writer, far = cluster.client(0), cluster.client(1)
    pushed = writer.create(OID.from_random(), 4096, node=1)  # network: staged here
    assert in_region(writer, pushed.address, len(pushed))
    in_place = far.create(OID.from_random(), 4096, node=2)  # mapped: written in place
    assert not in_region(far, in_place.address, len(in_place))
    del pushed, in_place


def test_large_objects_arrive_intact(make_cluster):
    cluster = make_cluster(modes="network", capacity="160MiB")
    writer, owner, reader = cluster.client(0), cluster.client(1), cluster.client(2)
    data = np.random.default_rng(38).integers(0, 256, 64 << 20, dtype=np.uint8)
    digest = hashlib.sha256(data).hexdigest()
    oid = writer.put(data, node=1)
    assert owner.contains(oid)
    settled(writer)
    for client in (owner, reader):
        got = client.get(oid)
        assert hashlib.sha256(got).hexdigest() == digest
        del got
    # An odd size, data and metadata, pushed in parallel ranges.
    cid = OID.from_random()
    buffer = writer.create(cid, (40 << 20) + 13, b"tail", node=2)
    np.frombuffer(buffer, np.uint8)[:] = data[: len(buffer)]
    writer.seal(cid, release=True)
    del buffer
    got = reader.get_buffer(cid)
    assert bytes(got.metadata()) == b"tail"
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data[: (40 << 20) + 13]).hexdigest()
    del got


def test_abort_and_a_writer_that_dies_leave_nothing_anywhere(network_cluster, spawn):
    cluster = network_cluster
    writer, owner = cluster.client(0), cluster.client(1)
    oid = OID.from_random()
    buffer = writer.create(oid, 1 << 20, node=1)
    assert (objects(writer), objects(owner)) == (1, 1), "a staging buffer here, the object there"
    writer.abort(oid)
    del buffer
    assert (objects(writer), objects(owner)) == (0, 0)
    with pytest.raises(shoal.ObjectNotFound):
        writer.seal(oid)
    # The abort unregistered the id (its home hears it soon after).
    wait_for(lambda: try_put(writer, oid, node=1), timeout=5, message="id free after the abort")
    assert owner.get(oid) == b"again"

    child = spawn(
        """
        client = shoal.Client(sys.argv[1])
        buffer = client.create(shoal.ObjectID.from_random(), 8 << 20, node=1)
        emit("allocated")
        time.sleep(60)
        """,
        cluster.socket(0),
    )
    assert child.json() == "allocated"
    assert (objects(writer), objects(owner)) == (1, 2)
    child.kill()
    wait_for(lambda: (objects(writer), objects(owner)) == (0, 1), timeout=5, message="all aborted")


def test_an_unreachable_node_is_node_unavailable_and_a_failed_push_aborts(network_cluster):
    cluster = network_cluster
    writer, other = cluster.client(0), cluster.client(2)
    # Ids homed at the live nodes: the failure is the allocation's (or the push's), not the
    # home's.
    early, late = ids_homed_at(0, 2)
    buffer = writer.create(early, 1 << 20, node=1)
    cluster.kill(1)
    with pytest.raises(shoal.NodeUnavailable, match="node 1"):
        writer.seal(early)  # the push cannot reach node 1
    del buffer
    settled(writer)  # the staging buffer went
    with pytest.raises(shoal.ObjectNotFound):
        writer.abort(early)  # nothing left to abort here
    with pytest.raises(shoal.NodeUnavailable, match="node 1"):
        writer.put(b"x", late, node=1)
    wait_for(lambda: not writer.cluster_nodes()[1]["alive"], timeout=5, message="node 1 seen down")
    with pytest.raises(shoal.NodeUnavailable, match="node 1"):
        writer.create(OID.from_random(), 10, node=1)
    settled(writer)
    assert other.get(other.put(b"the rest works", ids_homed_at(2, 1)[0], node=0)) == b"the rest works"


def push_request(address: str, sender: int, credential: str, oid: shoal.ObjectID, offset: int, data: bytes):
    """One push on a node's data channel: (0, b"") once the bytes landed, else (error kind,
    message)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        t = credential.encode()
        s.sendall(b"SHP1" + struct.pack("<IH", sender, len(t)) + t + oid.binary())
        s.sendall(struct.pack("<QQ", offset, len(data)))
        f = s.makefile("rb")

        def answer() -> tuple[int, bytes]:
            status = f.read(1)[0]
            if status:
                (n,) = struct.unpack("<H", f.read(2))
                return status, f.read(n)
            return 0, b""

        status, message = answer()
        if status:
            return status, message
        s.sendall(data)
        return answer()


def test_the_data_channel_takes_pushes_only_from_the_allocating_node(make_cluster):
    cluster = make_cluster(modes="network")
    config = tomllib.loads(cluster.file.read_text())
    token, data = config["cluster"]["token"], [n["data"] for n in config["node"]]
    writer, owner = cluster.client(0), cluster.client(1)
    oid = OID.from_random()
    buffer = writer.create(oid, 4096, node=1)  # node 0 allocated it on node 1
    theirs = owner.put(b"sealed at node 1")
    as_node = {n: peer_credential(cluster.file, n, 1) for n in (0, 2)}
    for sender, credential, target, offset, kind, why in [
        (0, "forged", oid, 0, 9, "wrong cluster token"),
        (0, token, oid, 0, 9, "wrong cluster token"),  # the bare token admits no member
        (2, as_node[0], oid, 0, 9, "wrong cluster token"),  # node 0's credential, claiming 2
        (9, token, oid, 0, 9, "not a peer"),
        (2, as_node[2], oid, 0, 5, "not writing"),  # a member, but not the allocating node
        (0, as_node[0], theirs, 0, 4, "not writing"),  # sealed, and not node 0's
        (0, as_node[0], OID.from_random(), 0, 1, "not writing"),
        (0, as_node[0], oid, 4090, 9, "outside"),
    ]:
        status, message = push_request(data[1], sender, credential, target, offset, b"12345678")
        assert (status, why in message.decode()) == (kind, True), (sender, message)
    assert "data channel request refused" in cluster.log(1)
    # A checked push lands; the seal then pushes the writer's own bytes over it.
    assert push_request(data[1], 0, as_node[0], oid, 8, b"12345678") == (0, b"")
    np.frombuffer(buffer, np.uint8)[:] = 1
    writer.seal(oid)
    del buffer
    assert np.frombuffer(owner.get_buffer(oid), np.uint8).max() == 1
    assert owner.get(theirs) == b"sealed at node 1"
