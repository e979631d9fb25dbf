"""shoal beside Ray (`pip install shoal[ray]`; docs/ray.md): references travel through
Ray, bytes through shoal.

    import ray, shoal.ray

    ref = shoal.ray.put(table)                 # a ShoalRef: id, size, node (Ray inlines it)
    @ray.remote
    def work(ref): return shoal.ray.get(ref).num_rows     # store memory, no copy
    ray.get(work.options(scheduling_strategy=shoal.ray.locality(ref)).remote(ref))

    ds = shoal.ray.read("tables/events")      # read_datasource(ShoalDatasource), a block a chunk
    ds.write_datasink(shoal.ray.ShoalDatasink("tables/out"))

Objects are named under their Ray job and deleted when it ends, unless put with
`durability=`: those outlive the job and the driver. The Ray Data classes import
ray.data on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal import _lazy
from shoal.ray.locality import locality, node_map
from shoal.ray.ref import ShoalRef, delete, get, put, ref, share
from shoal.ray.store import connect

if TYPE_CHECKING:
    from shoal.ray.datasink import ShoalDatasink
    from shoal.ray.datasource import ShoalDatasource, read

_LAZY = {
    "ShoalDatasource": "shoal.ray.datasource",
    "ShoalDatasink": "shoal.ray.datasink",
    "read": "shoal.ray.datasource",
}


def __getattr__(name: str) -> Any:
    return _lazy.resolve(globals(), _LAZY, name, __name__)


__all__ = [
    "ShoalDatasink",
    "ShoalDatasource",
    "ShoalRef",
    "connect",
    "delete",
    "get",
    "locality",
    "node_map",
    "put",
    "read",
    "ref",
    "share",
]
