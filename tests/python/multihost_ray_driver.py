"""The Ray driver of test_multihost_ray.py, run on host 0 of the multi-host harness (the
test's own process cannot reach the hosts' network): `python multihost_ray_driver.py
GCS_ADDRESS SOCKET ROWS` prints one JSON object with what the test checks.

It connects to the Ray cluster whose head runs on host 0 (this host's shoal daemon at
SOCKET) and waits for the second Ray node, on host 1. Then:
  where      each Ray node's host name and the shoal node its workers reach;
  node_map   shoal.ray's pairing of Ray nodes and shoal nodes;
  handoff    an actor on host 1 makes a table of ROWS rows (two 8-byte columns) and both
             `shoal.ray.put`s it and `ray.put`s it; a task on host 0 reads both and reports
             whether they are equal, their sums, the seconds of each get, and whether the
             shoal value's columns lie in host 0's store (pulled by host 0's daemon);
  durable    a value put with durability on host 1, read by name on host 0;
  locality   the hosts where tasks scheduled by `shoal.ray.locality(ref)` ran.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

ADDRESS, SOCKET, ROWS = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.environ["SHOAL_SOCKET"] = SOCKET  # before Ray: the driver's store is host 0's
os.environ["RAY_AUTH_MODE"] = "disabled"  # as the test's `ray start`s (test_multihost_ray.py)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import shoal.ray  # noqa: E402

DURABLE_NAME = "results/multihost"


def make_table(rows: int) -> pa.Table:
    return pa.table({"x": np.arange(rows, dtype=np.int64), "y": np.arange(rows) * 0.5})


@ray.remote(num_cpus=0)
def where() -> dict[str, Any]:
    return {
        "ray_node": ray.get_runtime_context().get_node_id(),
        "host": socket.gethostname(),
        "shoal_node": shoal.ray.store.client().node,
    }


@ray.remote(num_cpus=0)
class Producer:
    def make(self, rows: int) -> dict[str, Any]:
        table = make_table(rows)
        return {
            "shoal": shoal.ray.put(table),
            "ray": [ray.put(table)],  # in a list: the caller gets the ref, not the value
            "durable": shoal.ray.put(table.slice(0, 1000), durability="memory", name=DURABLE_NAME),
        }


@ray.remote(num_cpus=0)
def read(ours: shoal.ray.ShoalRef, theirs: list[ray.ObjectRef]) -> dict[str, Any]:
    t0 = time.perf_counter()
    mine = shoal.ray.get(ours)
    t1 = time.perf_counter()
    stock = ray.get(theirs[0])
    t2 = time.perf_counter()
    client = shoal.ray.store.client()
    low, high = client.region_address, client.region_address + client.region_size
    columns = [chunk.buffers()[1] for column in mine.columns for chunk in column.chunks]
    durable = shoal.ray.get(shoal.ray.ref(DURABLE_NAME))
    return {
        "host": socket.gethostname(),
        "equal": mine.equals(stock),
        "sums": [
            [int(mine["x"].to_numpy().sum()), float(mine["y"].to_numpy().sum())],
            [int(stock["x"].to_numpy().sum()), float(stock["y"].to_numpy().sum())],
        ],  # fmt: skip
        "in_store": all(low <= b.address and b.address + b.size <= high for b in columns),
        "shoal_get_s": t1 - t0,
        "ray_get_s": t2 - t1,
        "durable_equal": durable.equals(make_table(ROWS).slice(0, 1000)),
    }


@ray.remote(num_cpus=0)
def host() -> str:
    return socket.gethostname()


def main() -> None:
    ray.init(address=ADDRESS, log_to_driver=False)
    head = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + 120
    while len(alive := [n["NodeID"] for n in ray.nodes() if n["Alive"]]) < 2:
        assert time.monotonic() < deadline, f"host 1's Ray node did not join: {ray.nodes()}"
        time.sleep(0.5)
    (other,) = [n for n in alive if n != head]

    def on(node: str) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node, soft=False)

    out: dict[str, Any] = {
        "where": ray.get([where.options(scheduling_strategy=on(n)).remote() for n in (head, other)]),
        "node_map": [[n.ray_node == head, n.shoal_node] for n in shoal.ray.node_map()],
    }
    producer = Producer.options(scheduling_strategy=on(other)).remote()
    made = ray.get(producer.make.remote(ROWS))
    out["ref_node"] = made["shoal"].node
    out["handoff"] = ray.get(read.options(scheduling_strategy=on(head)).remote(made["shoal"], made["ray"]))
    out["expected_sums"] = [int(np.arange(ROWS).sum()), float((np.arange(ROWS) * 0.5).sum())]
    strategy = shoal.ray.locality([made["shoal"]])
    out["locality_node_is_host1"] = getattr(strategy, "node_id", None) == other
    out["locality_hosts"] = ray.get([host.options(scheduling_strategy=strategy).remote() for _ in range(3)])
    shoal.ray.delete(made["durable"])
    ray.kill(producer)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
