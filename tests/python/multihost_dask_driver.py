"""The Dask client of test_multihost_dask.py, run on host 0 of the multi-host harness (the
test's own process cannot reach the hosts' network): `python multihost_dask_driver.py
SCHEDULER ROWS` prints one JSON object with what the test checks.

It waits for the two workers (one per host, each with its own host's shoal daemon), then:
  results   a dataframe groupby, merge and set_index, and array reductions on the cluster,
            beside the same graphs computed here by Dask's synchronous scheduler (stock);
  handoff   a table of ROWS rows (two 8-byte columns) made on host 0's worker is the
            dependency of a task on host 1's worker, handed off by the `shoal` family (only
            the id crosses Dask's socket; host 1's daemon pulls the object) and then by
            Dask's own path (the sender's threshold raised, so its next value stays private):
            per way, the bytes the sender's Dask wrote, the seconds from submit to result,
            the object ids both workers hold and whether the receiver's columns lie in its
            own store's region.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import dask
import dask_jobs
import numpy as np
import pyarrow as pa
from distributed import Client, get_worker, wait


def make_table(rows: int, seed: int) -> pa.Table:
    return pa.table({"x": np.arange(rows, dtype=np.int64) + seed, "y": np.full(rows, float(seed))})


def inspect(table: pa.Table) -> dict[str, Any]:
    """What the receiving worker sees of a table it got: its sums, and whether its large
    buffers lie in this worker's mapping of its own store."""
    here = get_worker().shoal.client
    low, high = here.region_address, here.region_address + here.region_size
    large = [b for c in table.columns for ch in c.chunks for b in ch.buffers() if b and b.size > 4096]
    return {
        "sum_x": int(table["x"].to_numpy().sum()),
        "sum_y": float(table["y"].to_numpy().sum()),
        "in_store": bool(large) and all(low <= b.address and b.address + b.size <= high for b in large),
    }


def handoff(client: Client, sender: str, receiver: str, rows: int, key: str) -> dict[str, Any]:
    table = client.submit(make_table, rows, len(key), workers=[sender], key=key, pure=False)
    wait(table)  # made on the sender; the clock covers only the hand-off
    started = time.perf_counter()
    seen = client.submit(inspect, table, workers=[receiver], key=f"inspect-{key}", pure=False).result()
    seconds = time.perf_counter() - started

    def sent(dask_worker: Any) -> int:
        return sum(e["compressed"] for e in dask_worker.transfer_outgoing_log if key in e["keys"])

    def oid(dask_worker: Any) -> str | None:
        stored = dask_worker.data.stored(key)
        return None if stored is None else stored.oid.hex()

    oids = client.run(oid, workers=[sender, receiver])
    return {
        "seconds": seconds,
        "socket_bytes": client.run(sent, workers=[sender])[sender],
        "sender_oid": oids[sender],
        "receiver_oid": oids[receiver],
        "want_sum_x": int(np.arange(rows, dtype=np.int64).sum() + rows * len(key)),
        "want_sum_y": float(rows * len(key)),
        **seen,
    }


def results_equal_stock() -> dict[str, bool]:
    _, jobs = dask_jobs.jobs(200_000, keys=500, partitions=6)
    with dask.config.set({"dataframe.shuffle.method": "tasks"}):
        got = {name: dask.compute(job)[0] for name, job in jobs().items()}
        with dask.config.set({"scheduler": "sync"}):
            want = {name: dask.compute(job)[0] for name, job in jobs().items()}
    return dask_jobs.equal(got, want)


def main() -> None:
    scheduler, rows = sys.argv[1], int(sys.argv[2])
    with Client(scheduler, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        info = client.scheduler_info()["workers"]
        by_host = sorted(info, key=lambda a: info[a]["name"])
        sender, receiver = by_host[0], by_host[1]
        out: dict[str, Any] = {
            "workers": {a: info[a]["name"] for a in by_host},
            "stores": client.run(lambda dask_worker: dask_worker.shoal.handshake()),
            "results": results_equal_stock(),
        }
        client.run(lambda dask_worker: dask_worker.data.stored_count)  # both have a store
        out["shoal"] = handoff(client, sender, receiver, rows, "table-shoal")

        def keep_private(dask_worker: Any) -> None:
            dask_worker.data.threshold = 1 << 62

        client.run(keep_private, workers=[sender])
        out["dask"] = handoff(client, sender, receiver, rows, "table-dask")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
