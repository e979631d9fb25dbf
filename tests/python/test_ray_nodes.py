"""shoal.ray on two Ray nodes of this host over a two-node shoal cluster in network mode
(each node reaches the other's objects by shoal's network pull, as on separate hosts).

Its own module: Ray runs one cluster per driver process, and tests/python/test_ray.py's
one-node cluster lives for that module.

Measured: each Ray node's workers reach their own shoal node (the socket in the raylet's
environment); a value put on node 1 and read on node 0 equals Ray's own path; `locality`
sends a task to the Ray node of the bytes and `node_map` pairs the nodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _shoal_testing import Cluster, short_dir

REASON = "no ray: scripts/setup-test-tools.sh installs it (pip install 'shoal[ray]')"
ray = pytest.importorskip("ray", reason=REASON)

from ray.cluster_utils import Cluster as RayCluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import shoal.ray  # noqa: E402
from shoal.ray import ShoalRef  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[str]]]:
    """A two-node shoal cluster (network mode) and a Ray cluster of two nodes, node i's
    workers on shoal node i. Yields the shoal cluster and the Ray node ids in that order."""
    shoal_cluster = Cluster(
        short_dir(tmp_path_factory.mktemp("raynodes")) / "c", nodes=2, capacity="256MiB", modes="network"
    )
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), saved]))
    common = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    ray_cluster = RayCluster(
        initialize_head=True,
        head_node_args={
            **common,
            "include_dashboard": False,
            "env_vars": {"SHOAL_SOCKET": shoal_cluster.socket(0)},
        },
    )
    second = ray_cluster.add_node(**common, env_vars={"SHOAL_SOCKET": shoal_cluster.socket(1)})
    shoal.ray.connect(shoal_cluster.socket(0))
    try:
        ray.init(address=ray_cluster.address, log_to_driver=False)
        head = ray.get_runtime_context().get_node_id()
        yield shoal_cluster, [head, second.node_id]
    finally:
        ray.shutdown()
        ray_cluster.shutdown()
        shoal.ray.store.client().close()
        shoal.ray.store._client = None
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        shoal_cluster.down()


def on(node: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node, soft=False)


@ray.remote(num_cpus=0)
class Worker:
    def where(self) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), shoal.ray.store.client().node

    def put(self, rows: int) -> ShoalRef:
        return shoal.ray.put({"x": np.arange(rows, dtype=np.int64), "y": np.ones(rows)})

    def total(self, ref: ShoalRef) -> dict[str, Any]:
        value = shoal.ray.get(ref)
        return {
            "x": int(value["x"].sum()),
            "y": float(value["y"].sum()),
            "node": shoal.ray.store.client().node,
        }


@ray.remote(num_cpus=0)
def total(value: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"x": int(value["x"].sum()), "y": float(value["y"].sum())}


@ray.remote(num_cpus=0)
def where_am_i() -> str:
    return ray.get_runtime_context().get_node_id()


def test_values_cross_ray_nodes_through_shoal_and_tasks_follow_the_bytes(
    nodes: tuple[Cluster, list[str]],
) -> None:
    _, (head, second) = nodes
    workers = [Worker.options(scheduling_strategy=on(n)).remote() for n in (head, second)]
    assert ray.get([w.where.remote() for w in workers]) == [(head, 0), (second, 1)]
    assert [(n.ray_node, n.shoal_node) for n in shoal.ray.node_map()] == [(head, 0), (second, 1)]

    ref = ray.get(workers[1].put.remote(2_000_000))  # 32 MB in node 1's store
    assert ref.node == 1
    rows = np.arange(2_000_000, dtype=np.int64)
    expected = ray.get(total.remote({"x": rows, "y": np.ones(2_000_000)}))  # Ray's own path
    read_on_head = ray.get(workers[0].total.remote(ref))
    assert read_on_head == {**expected, "node": 0}  # pulled from node 1 by node 0's store
    assert ray.get(workers[1].total.remote(ref)) == {**expected, "node": 1}

    strategy = shoal.ray.locality([ref])
    assert isinstance(strategy, NodeAffinitySchedulingStrategy) and strategy.node_id == second
    assert (
        ray.get([where_am_i.options(scheduling_strategy=strategy).remote() for _ in range(3)]) == [second] * 3
    )
    for w in workers:
        ray.kill(w)
