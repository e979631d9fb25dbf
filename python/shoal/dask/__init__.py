"""shoal as Dask's data plane (`pip install shoal[dask]`; docs/dask.md).

    from distributed import Client, LocalCluster
    import shoal.dask

    cluster = LocalCluster(n_workers=4, worker_class=shoal.dask.Nanny)
    client = Client(cluster)

Workers on one host share one copy of every large value in a shoal store, hand values to
each other as object ids, are not charged for the store's pages, and keep a dead
worker's keys where the store still has them. Importing this module registers the
`shoal` serialization family with Dask.
"""

from __future__ import annotations

from shoal.dask import serialize
from shoal.dask.data import DEFAULT_THRESHOLD, StoreData
from shoal.dask.memory import NannyAccounting, private_memory
from shoal.dask.scheduler import SchedulerPlugin
from shoal.dask.store import Store
from shoal.dask.worker import Nanny, Worker

serialize.register()

__all__ = [
    "DEFAULT_THRESHOLD",
    "Nanny",
    "NannyAccounting",
    "SchedulerPlugin",
    "Store",
    "StoreData",
    "Worker",
    "private_memory",
]
