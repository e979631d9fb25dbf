"""Barriers and state flags for the processes of one job, across nodes.

Both are built on what the store already guarantees cluster-wide — an id can be created
once (ObjectExists everywhere else) and a get on any node finds an object on any other —
so they need no coordinator of their own.

A barrier is a set of arrival objects with ids derived from (barrier name, slot). With
named parties each process arrives in its own slot; with a count, arrivals claim slots
0, 1, 2, ... in turn (a claim is a create, which succeeds on exactly one process). Then
every process waits until all slots exist. A barrier name is used once; add a round
number to the name to use it again.

A flag is a small value stored under (name, node) in that node's memory.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal._ids import ObjectID, derived_id
from shoal.errors import InvalidArgument, ObjectExists, ObjectNotFound, Timeout

if TYPE_CHECKING:
    from shoal._store import ObjectStore


def _arrival(client: ObjectStore, party: str | None) -> bytes:
    return json.dumps(
        {"node": client.node, "host": socket.gethostname(), "pid": os.getpid(), "party": party}
    ).encode()


def barrier(
    client: ObjectStore,
    name: str,
    parties: int | Sequence[str],
    timeout: float | None = None,
    *,
    party: str | None = None,
) -> int:
    """Waits until every party of barrier `name` has arrived; returns this arrival's slot.

    `parties` is a count, or the names of the parties (then `party` says which one this
    process is). After `timeout` seconds (None: forever) raises Timeout naming the
    parties that did not arrive."""
    if isinstance(parties, int):
        if parties < 1:
            raise InvalidArgument(f"a barrier needs at least one party, got {parties}")
        if party is not None:
            raise InvalidArgument("party names need parties given as a list of names")
        names: list[str] | None = None
        slots = parties
    else:
        names = list(parties)
        if party not in names:
            raise InvalidArgument(f"party {party!r} is not one of the barrier's parties {names}")
        slots = len(names)
    ids = [derived_id("shoal/barrier", name, i) for i in range(slots)]
    mine = _claim(client, name, ids, names, party)
    deadline = None if timeout is None else time.monotonic() + timeout
    timeout_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
    arrived = client.get_buffers(ids, timeout_ms=timeout_ms)
    missing = [i for i, b in enumerate(arrived) if b is None]
    if missing:
        who = [names[i] for i in missing] if names else [f"slot {i}" for i in missing]
        present = [json.loads(bytes(b)) for b in arrived if b is not None]
        there = ", ".join(f"{p['party'] or 'node ' + str(p['node'])} (pid {p['pid']})" for p in present)
        raise Timeout(
            f"barrier {name!r}: {slots - len(missing)} of {slots} parties arrived within "
            f"{timeout} s; missing {who}; arrived: {there}"
        )
    return mine


def _claim(
    client: ObjectStore, name: str, ids: list[ObjectID], names: list[str] | None, party: str | None
) -> int:
    if names is not None:
        slot = names.index(party)
        try:
            client.put(_arrival(client, party), ids[slot])
        except ObjectExists:
            raise InvalidArgument(f"party {party!r} already arrived at barrier {name!r}") from None
        return slot
    for slot, oid in enumerate(ids):
        try:
            client.put(_arrival(client, None), oid)
            return slot
        except ObjectExists:
            continue
    raise InvalidArgument(f"barrier {name!r} already has all {len(ids)} parties")


def _flag_id(name: str, node: int) -> ObjectID:
    return derived_id("shoal/flag", name, node)


def set_flag(client: ObjectStore, name: str, value: Any, *, node: int | None = None) -> None:
    """Sets flag `name` of `node` (default: this client's node) to a JSON-able value."""
    node = client.node if node is None else node
    oid = _flag_id(name, node)
    data = json.dumps(value).encode()
    for _ in range(100):
        try:
            client.delete(oid)
        except ObjectNotFound:
            pass
        try:
            client.put(data, oid, node=node)
            return
        except ObjectExists:
            continue  # another process set it in between: set ours again
    raise Timeout(f"flag {name!r} of node {node} keeps changing; could not set it")


def get_flag(client: ObjectStore, name: str, *, node: int | None = None, default: Any = None) -> Any:
    """The value of flag `name` of `node`, or `default` when it was never set."""
    node = client.node if node is None else node
    buffers = client.get_buffers([_flag_id(name, node)], timeout_ms=0)
    return default if buffers[0] is None else json.loads(bytes(buffers[0]))


def wait_flag(
    client: ObjectStore, name: str, value: Any, *, node: int | None = None, timeout: float | None = None
) -> None:
    """Waits until flag `name` of `node` equals `value`; Timeout after `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while get_flag(client, name, node=node) != value:
        if deadline is not None and time.monotonic() >= deadline:
            current = get_flag(client, name, node=node)
            raise Timeout(f"flag {name!r} of node {node} is {current!r}, not {value!r}, after {timeout} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
