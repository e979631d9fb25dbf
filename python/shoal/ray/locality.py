"""Scheduling near the bytes: which Ray node reaches which shoal node, and a soft node
affinity toward the one holding most of a task's inputs.

A Ray node's shoal node is the store its workers connect to (shoal.ray.store). Ray knows
each node by its address and id, shoal each node by its number; the map between them is
made by asking every live Ray node once (a zero-CPU task pinned to it reports its store's
node number, with the Ray node's address) and kept per process, asked again when Ray's
node list changes or a shoal node is missing from it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from shoal.ray import store
from shoal.ray.ref import ShoalRef

#: Seconds the probes of the Ray nodes may take (a node starts a worker for them).
PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class RayNode:
    """A Ray node and the shoal node its workers reach."""

    ray_node: str
    address: str
    shoal_node: int


@ray.remote(num_cpus=0)
def _probe() -> int:
    return store.client().node


_lock = threading.Lock()
_known: dict[str, RayNode] = {}


def _alive() -> dict[str, str]:
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def node_map(*, refresh: bool = False) -> list[RayNode]:
    """Every live Ray node with its shoal node (probing the nodes not seen yet)."""
    alive = _alive()
    with _lock:
        for gone in set(_known) - set(alive):
            del _known[gone]
        todo = list(alive) if refresh else [n for n in alive if n not in _known]
        if todo:
            probes = [
                _probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                for n in todo
            ]
            for node, shoal_node in zip(todo, ray.get(probes, timeout=PROBE_TIMEOUT), strict=True):
                _known[node] = RayNode(node, alive[node], shoal_node)
        return sorted(_known.values(), key=lambda n: (n.shoal_node, n.address, n.ray_node))


def ray_nodes_of(shoal_node: int) -> list[RayNode]:
    """The Ray nodes whose workers reach shoal node `shoal_node` (asking Ray's nodes again
    when none is known)."""
    found = [n for n in node_map() if n.shoal_node == shoal_node]
    return found or [n for n in node_map(refresh=True) if n.shoal_node == shoal_node]


def locality(refs: ShoalRef | Iterable[ShoalRef]) -> NodeAffinitySchedulingStrategy | str:
    """A scheduling strategy for a task or actor that reads `refs`: a *soft* affinity to
    the Ray node holding most of their bytes (Ray runs it elsewhere when that node is
    full or gone), or "DEFAULT" when no ref says where its bytes are.

        task.options(scheduling_strategy=shoal.ray.locality(refs)).remote(refs)
    """
    weights: Counter[int] = Counter()
    for r in [refs] if isinstance(refs, ShoalRef) else refs:
        if r.node is not None:
            weights[r.node] += r.size
    if not weights:
        return "DEFAULT"
    shoal_node = max(weights, key=lambda n: (weights[n], -n))
    nodes = ray_nodes_of(shoal_node)
    if not nodes:
        return "DEFAULT"
    return NodeAffinitySchedulingStrategy(nodes[0].ray_node, soft=True)
