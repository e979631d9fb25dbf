"""shoal beside Ray: Arrow data passed between Ray actors by reference, and Ray Data
writing and reading a shoal table.

Needs the `ray` extra (`pip install 'shoal[ray]'`). Starts a store and a one-node Ray
cluster whose workers reach it (SHOAL_SOCKET, inherited by Ray's workers), and:
- an actor builds a 32 MiB table in place in the store and shares it as a ShoalRef
  (a few dozen bytes through Ray); another actor reads it and finds its columns in its
  own mapping of the store, at the offset the first one wrote;
- a task is scheduled next to the bytes (`shoal.ray.locality`);
- a value put with durability gets a name that outlives the job;
- Ray Data writes a dataset into the store as a chunked table and reads it back, with
  the column selection pushed into the read.

    python examples/ray_objects.py
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray

import shoal.ray
from shoal.testing import Daemon


@ray.remote
class Producer:
    def build(self, rows: int) -> shoal.ray.ShoalRef:
        """A table written straight into the store: the producer copies nothing."""
        client = shoal.ray.store.client()
        with client.create_table(pa.schema([("x", pa.int64()), ("y", pa.float64())]), rows) as builder:
            builder["x"][:] = np.arange(rows)
            builder["y"][:] = 0.5
            self.offset = builder["x"].ctypes.data - client.region_address
        return shoal.ray.share(builder.id)

    def written_at(self) -> int:
        return self.offset


@ray.remote
class Consumer:
    def read(self, ref: shoal.ray.ShoalRef) -> str:
        table = shoal.ray.get(ref)
        self.table = table
        offset = table.column("x").chunks[0].buffers()[1].address - shoal.ray.store.client().region_address
        total = table.column("x").to_numpy().sum()
        return f"{table.num_rows} rows, sum x {total}, column x at offset {offset:#x} of the store"


@ray.remote
def node_of_task() -> str:
    return ray.get_runtime_context().get_node_id()[:12]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-ray-") as directory:
        store = Daemon(Path(directory), capacity="1GiB", args=["--burst", f"{directory}/burst"])
        os.environ["SHOAL_SOCKET"] = store.socket  # Ray's workers inherit it
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            run()
        finally:
            ray.shutdown()
            shoal.ray.store.client().close()
            store.teardown()


def run() -> None:
    producer, consumer = Producer.remote(), Consumer.remote()
    ref = ray.get(producer.build.remote(2 << 20))
    print(f"{ref}: {len(pickle.dumps(ref))} bytes through Ray")
    print("producer wrote column x at offset", hex(ray.get(producer.written_at.remote())))
    print("consumer read", ray.get(consumer.read.remote(ref)))
    strategy = shoal.ray.locality(ref)
    ran_on = ray.get(node_of_task.options(scheduling_strategy=strategy).remote())
    print(f"locality: soft affinity to Ray node {strategy.node_id[:12]}; the task ran on {ran_on}")

    kept = shoal.ray.put({"weights": np.ones(1000)}, durability="local", name="examples/ray/weights")
    print(f"durable: {kept.name!r}, readable by any later driver with shoal.ray.ref(name)")

    tables = [pa.table({"k": np.arange(i, 100_000, 4), "v": np.full(25_000, float(i))}) for i in range(4)]
    ray.data.from_arrow(tables).write_datasink(shoal.ray.ShoalDatasink("examples/ray/table"))
    client = shoal.ray.store.client()
    print("written:", [row.name for row in client.ls("examples/ray/table.parts")][:2], "...")
    print("get_named:", client.get_named("examples/ray/table").num_rows, "rows over the chunks' memory")
    ds = ray.data.read_datasource(shoal.ray.ShoalDatasource("examples/ray/table")).select_columns(["v"])
    print("Ray Data read:", ds.count(), "rows, sum v", ds.sum("v"))
    for name in ("examples/ray/table", "examples/ray/weights"):
        client.unlink(name)
    for row in client.ls("examples/ray/table.parts"):
        client.unlink(row.name)


if __name__ == "__main__":
    main()
