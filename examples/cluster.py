"""shoal quick start, part two: an emulated three-node cluster on this host.

Starts three daemons (`python -m shoal cluster up`), each with its own socket and
/dev/shm region, as three nodes whose memory is shared (mapped mode). Then:
- puts an Arrow table in node 0's memory and reads it through node 1, in place:
  node 1 stores nothing, its columns are node 0's memory;
- gets 1000 small objects of node 0 through node 1: the first get asks their homes
  and node 0, repeated gets are answered by node 1 alone (its loans);
- writes a table straight into node 2's memory from a client of node 1;
- builds a HugeTable from parts written on all three nodes and queries it from node 2;
- stops the cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import shoal

NODES = 3


def shoal_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "shoal", *args], check=True, capture_output=True, timeout=120)


def in_region(client: shoal.Client, address: int) -> bool:
    return client.region_address <= address < client.region_address + client.region_size


def timed(call, *args):
    started = time.perf_counter()
    value = call(*args)
    return value, time.perf_counter() - started


def main() -> None:
    directory = tempfile.mkdtemp(prefix="shoal-quickstart-")
    name = f"quickstart{os.getpid()}"
    shoal_cli("cluster", "up", "--nodes", str(NODES), "--dir", directory, "--capacity", "256MiB",
              "--name", name)  # fmt: skip
    try:
        run([shoal.Client(os.path.join(directory, f"n{n}.sock")) for n in range(NODES)])
    finally:
        shoal_cli("cluster", "down", "--dir", directory)
        shutil.rmtree(directory, ignore_errors=True)


def run(nodes: list[shoal.Client]) -> None:
    a, b, c = nodes
    modes = ", ".join(f"node {n['node']} {n['access']}" for n in b.cluster_nodes())
    print(f"cluster: {NODES} nodes, {modes}")

    rng = np.random.default_rng(7)
    table = pa.table({"id": np.arange(1_000_000), "price": rng.random(1_000_000) * 100})
    oid = a.put(table)
    got, took = timed(b.get, oid)  # the first also maps node 0's region here
    assert got.equals(table)
    del got
    got, again = timed(b.get, oid)
    address = got["price"].chunk(0).buffers()[1].address
    print(
        f"get on node 1 of node 0's table ({table.nbytes / 2**20:.1f} MiB): first {took * 1e3:.1f} ms "
        f"(maps node 0's region), again {again * 1e3:.2f} ms; "
        f"in place: {not in_region(b, address) and b.stats()['objects'] == 0}"
    )

    ids = [shoal.ObjectID.from_random() for _ in range(1000)]
    a.put_batch(ids, [np.full(1000, i % 256, np.uint8) for i in range(1000)])
    first, first_s = timed(b.get_buffers, ids)
    assert all(bytes(x)[:1] == bytes([i % 256]) for i, x in enumerate(first))
    del first
    repeated = []
    for _ in range(5):
        buffers, took = timed(b.get_buffers, ids)
        repeated.append(took)
        del buffers
    local = min(timed(a.get_buffers, ids)[1] for _ in range(5))
    print(
        f"get on node 1 of 1000 × 1 kB on node 0: first {first_s * 1e3:.2f} ms, "
        f"repeated {min(repeated) * 1e3:.2f} ms (node 0's own client: {local * 1e3:.2f} ms)"
    )

    remote = b.put(pa.table({"x": np.arange(10)}), node=2)
    on_2 = [o.id for o in c.list()]
    print(f"put by node 1's client into node 2's memory: held by node 2: {remote in on_2}")

    for index, client in enumerate(nodes):
        part = pa.table({"node": np.full(100_000, index), "value": rng.random(100_000)})
        client.put_chunk("sales", index, part)
    sales = c.get_table("sales", parts=NODES)
    per_node = sales.group_by("node").aggregate([("value", "mean")]).sort_by("node")
    means = [round(m, 3) for m in per_node["value_mean"].to_pylist()]
    total = pc.sum(sales["value"]).as_py()
    print(
        f"HugeTable 'sales': {sales.num_rows:,} rows from {NODES} nodes' memory, queried on node 2: "
        f"mean value per node {means}, total {total:.1f}"
    )

    # Every node has a burst buffer and a backing directory below its memory (cluster up's
    # default): an object sealed at durability "local" is on disk before put returns, can leave
    # memory, and a get on any node brings it back.
    durable = a.put(table, durability="local")
    a.stage_out([durable])
    row = next(o for o in a.list() if o.id == durable)
    back, took = timed(b.get, durable)  # node 0 restores it from its burst buffer
    assert back.equals(table)
    tiers = a.tiers()
    print(
        f"tiers: node 0's table left memory (in memory: {row.resident}, on {'+'.join(row.tiers)}); "
        f"a get on node 1 restored it in {took * 1e3:.1f} ms; node 0 has "
        f"{tiers['tiers']['burst']['objects']} objects on its burst buffer, {tiers['restores']} restores"
    )
    del back
    a.delete([durable])

    del got, sales
    c.delete_table("sales", NODES)
    a.delete([oid, *ids])
    b.delete([remote])
    for client in nodes:
        client.close()
    print("done: cluster stopped")


if __name__ == "__main__":
    main()
