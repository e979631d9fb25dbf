"""shoal as Dask's data plane: four Dask worker processes on this host sharing one store.

Needs the `dask` extra (`pip install 'shoal[dask]'`). Starts a store, then a LocalCluster
of `shoal.dask.Nanny` workers on it, and:
- builds a 64 MiB Arrow table on one worker and reads it on another: the receiver's
  columns are the sender's pages, and Dask's transfer log shows how few bytes crossed
  the socket;
- runs a groupby and a set_index on a dataframe and checks them against pandas;
- lists the store's objects by name (`Client.ls("dask")`): key and worker of each;
- stops everything (released keys' objects are deleted by the scheduler plugin).

    python examples/dask_workers.py
"""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa
from distributed import Client, LocalCluster, get_worker

import shoal.dask
from shoal.testing import Daemon


def make_table(rows: int) -> pa.Table:
    return pa.table({"x": np.arange(rows, dtype=np.int64), "y": np.ones(rows)})


def where(table: pa.Table) -> str:
    """Where the receiving worker finds the table's largest column."""
    buffer = table.column("x").chunks[0].buffers()[1]
    here = get_worker().shoal.client
    inside = here.region_address <= buffer.address < here.region_address + here.region_size
    return f"column x at {buffer.address:#x}, {'inside' if inside else 'outside'} the store's mapping"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-dask-") as directory:
        from pathlib import Path

        store = Daemon(Path(directory), capacity="1GiB")
        try:
            run(store.socket)
        finally:
            store.teardown()


def run(socket: str) -> None:
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, worker_class=shoal.dask.Nanny, shoal_socket=socket
        ) as cluster,
        Client(cluster) as client,
    ):
        sender, receiver = sorted(client.scheduler_info()["workers"])[:2]
        table = client.submit(make_table, 4 << 20, workers=[sender], key="example-table")
        print("receiver:", client.submit(where, table, workers=[receiver]).result())
        log = client.run(lambda dask_worker: list(dask_worker.transfer_outgoing_log), workers=[sender])
        for entry in log[sender]:
            print(f"sent {entry['total'] / 2**20:.0f} MiB of values in {entry['compressed']} bytes")

        import dask.dataframe as dd

        frame = pd.DataFrame(
            {"k": np.arange(1_000_000) % 97, "v": np.random.default_rng(1).random(1_000_000)}
        )
        ddf = dd.from_pandas(frame, npartitions=8).persist()
        sums = ddf.groupby("k").v.sum().compute()
        pd.testing.assert_series_equal(sums.sort_index(), frame.groupby("k").v.sum())
        print("groupby: equal to pandas;", "set_index: sum", round(ddf.set_index("v").k.sum().compute()))

        names = [row.name for row in shoal.connect(socket).ls("dask")]
        print(f"{len(names)} objects in the store, e.g. {names[0]}")
        del table, ddf


if __name__ == "__main__":
    main()
