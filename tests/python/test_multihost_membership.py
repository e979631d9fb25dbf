"""Membership on etcd across isolated hosts (issue 41): nodes join and leave a running
cluster of emulated hosts (multihost.py), with etcd apart from them in the switch's
namespace; faults of the daemons, of etcd's members and of the link between one host and
etcd only. After each, every object a put acknowledged is read back by checksum from every
member: a view change may move homes, never lose or alter an acknowledged object.

Every host has a burst buffer and seals with durability "local", so a killed node's objects
come back with it. Bounds are loose (a loaded 2-core machine); bench/membership.py measures
the times."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
import threading
import time
from typing import Any

import pytest
from multihost import until

import shoal

TTL = 1.0  # s, the clusters' membership_ttl_ms unless a test says otherwise
VIEW_SEEN = 5.0  # s, bound for every member to adopt a view etcd holds (a join, a clean leave)


@pytest.fixture(autouse=True)
def _needs_etcd():
    if shutil.which("etcd") is None:
        pytest.skip("no etcd: scripts/setup-test-tools.sh installs Debian's etcd-server")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def members_of(hosts: Any, on: set[int] | None = None) -> dict[int, list[int] | None]:
    """The members of the last view each host's daemon adopted."""
    return {i: (hosts[i].view() or (None, None))[1] for i in sorted(on or hosts.running())}


def wait_view(hosts: Any, members: list[int], timeout: float = VIEW_SEEN) -> float:
    """Until every running member has adopted the view of exactly `members`."""
    return until(
        lambda: all(v == members for v in members_of(hosts, set(members)).values()),
        timeout,
        f"every member adopting the view {members}; last views: {members_of(hosts)}",
    )


class Load:
    """Puts and gets on some hosts from a thread of the test until `stop()`: what each put
    acknowledged (id -> sha256 of its bytes) and every call that failed."""

    def __init__(self, hosts: Any, on: list[int], size: int = 2048) -> None:
        self.hosts, self.on, self.size = hosts, on, size
        self.acked: dict[shoal.ObjectID, str] = {}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            host = self.hosts[self.on[n % len(self.on)]]
            data = n.to_bytes(8, "little") * (self.size // 8)
            oid, _ = host.timed("put", data)
            if isinstance(oid, Exception):
                self.failures.append(f"put on host {host.index}: {oid!r}")
            else:
                self.acked[oid] = sha(data)
            if self.acked:  # and a get of an earlier object, put on this host or another
                earlier = list(self.acked)[(n * 7919) % len(self.acked)]
                try:
                    [got] = host.checksums([earlier])
                except shoal.ShoalError as err:
                    got = repr(err)
                if got != self.acked[earlier]:
                    self.failures.append(f"get of {earlier} on host {host.index}: {got}")
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the load's thread did not stop"
        assert self.acked, "the load acknowledged no put"


def put_some(
    host: Any, count: int, tag: str, durability: str | None = None, size: int | None = None
) -> dict[shoal.ObjectID, str]:
    """`count` objects put on `host` (each its stem 200 times, or about `size` bytes), sealed
    with `durability` (None: the node's default); id -> sha256."""
    made = {}
    for i in range(count):
        stem = f"{tag}-{i}-".encode()
        data = stem * (size // len(stem) if size else 200)
        made[host.client.put(data, durability=durability)] = sha(data)
    return made


def all_readable(hosts: Any, expected: dict[shoal.ObjectID, str], on: list[int]) -> None:
    """Every object of `expected` read by checksum from every host of `on`, waiting up to a
    few seconds for homes that are still being rebuilt; fails naming what differs."""
    ids = list(expected)
    want = [expected[oid] for oid in ids]
    for i in on:
        deadline = time.monotonic() + 10
        while (got := hosts[i].checksums(ids, timeout_ms=200)) != want:
            if time.monotonic() > deadline:
                wrong = [(str(oid), g) for oid, g, w in zip(ids, got, want, strict=True) if g != w]
                raise AssertionError(f"host {i}: {len(wrong)} of {len(ids)} differ: {wrong[:5]}")
            time.sleep(0.2)


def cluster_status(hosts: Any, on: int) -> list[dict[str, Any]]:
    """`shoal cluster status --json` run on host `on` with its own cluster file: a row per node."""
    done = hosts[on].run(
        sys.executable, "-m", "shoal", "cluster", "status", "--file", hosts.cluster_file, "--json"
    )  # fmt: skip
    assert done["returncode"] == 0, done["stderr"]
    return [json.loads(line) for line in done["stdout"].splitlines()]


def views_adopted(host: Any) -> list[list[int]]:
    """The members of every view the host's daemon adopted, in order, over all its runs."""
    return [members for _, members in host.views()]


@pytest.mark.parametrize("own_files", [False, True], ids=["one-file", "own-files"])
def test_a_fourth_host_joins_under_load_and_takes_puts_and_homes(make_hosts, own_files):
    """A fourth host joins under puts and gets. With `own_files`, each host's cluster file
    lists its own node alone (its own key, no peer's address): the members learn each other
    from the records in etcd (docs/cluster.md, "Nodes absent from the file"). Either way
    `shoal cluster status` on any host lists every member, and after a kill -9 of the
    newcomer the others stay whole."""
    hosts = make_hosts(4, etcd=1, own_files=own_files, burst=range(4), durability="local", start=False)
    for i in range(3):
        hosts.start(i, wait=False)
    hosts.wait_whole()
    wait_view(hosts, [0, 1, 2])
    before = put_some(hosts[2], 40, "before")

    load = Load(hosts, on=[0, 1])
    time.sleep(0.5)
    hosts.start(3)
    wait_view(hosts, [0, 1, 2, 3])
    time.sleep(1.0)
    load.stop()
    assert not load.failures, "\n".join(load.failures[:20])

    # The new member takes puts, and holds homes: every daemon counts its entries.
    joined = put_some(hosts[3], 40, "joined")
    expected = before | load.acked | joined
    all_readable(hosts, expected, on=[0, 1, 2, 3])
    assert hosts[3].metric("shoal_view_members") == 4
    assert hosts[3].metric("shoal_membership_in_touch") == 1
    epochs = {hosts[i].view()[0] for i in range(4)}
    assert len(epochs) == 1, f"members on different views: {epochs}"
    rows = cluster_status(hosts, 1)
    assert [(r["node"], r["state"]) for r in rows] == [(i, "up") for i in range(4)], rows
    assert all(r["view_members"] == [0, 1, 2, 3] for r in rows), rows

    hosts.kill(3)
    wait_view(hosts, [0, 1, 2])
    survivors = {oid: digest for oid, digest in expected.items() if oid not in joined}
    all_readable(hosts, survivors, on=[0, 1, 2])


def test_a_clean_leave_and_a_kill_leave_the_view_and_come_back_with_their_durable_objects(make_hosts):
    hosts = make_hosts(4, etcd=1, burst=range(4), durability="local")
    wait_view(hosts, [0, 1, 2, 3])
    made = {i: put_some(hosts[i], 30, f"host{i}") for i in range(4)}

    # A clean stop leaves at once: no lease to wait out.
    assert hosts.terminate(3, timeout=15) == 0
    left = wait_view(hosts, [0, 1, 2], timeout=3.0)
    all_readable(hosts, made[0] | made[1] | made[2], on=[0, 1, 2])

    # A kill -9 is removed when its lease ends.
    time.sleep(3 * hosts.heartbeat)  # its witnesses hear of the ids it homes within a heartbeat
    hosts.kill(2)
    removed = wait_view(hosts, [0, 1], timeout=TTL + 2.0)
    all_readable(hosts, made[0] | made[1], on=[0, 1])

    # Both come back with what they sealed to their burst buffers; puts made meanwhile on
    # the others are there for them too.
    meanwhile = put_some(hosts[0], 20, "meanwhile")
    hosts.start(2)
    hosts.start(3)
    wait_view(hosts, [0, 1, 2, 3])
    expected = made[0] | made[1] | made[2] | made[3] | meanwhile
    all_readable(hosts, expected, on=[0, 1, 2, 3])
    print(f"clean leave seen in {left:.2f} s, kill -9 removed in {removed:.2f} s (TTL {TTL} s)")


def test_etcd_members_killed_in_turn_remove_nobody(make_hosts):
    # TTL 2 s: an election (500 ms timeout) must not end a lease whose holder is alive.
    hosts = make_hosts(3, etcd=3, burst=range(3), durability="local", membership_ttl_ms=2000)
    wait_view(hosts, [0, 1, 2])
    etcd = hosts.etcd
    load = Load(hosts, on=[0, 1, 2])
    leader = etcd.leader()
    assert leader is not None
    for member in [leader, *(m for m in range(3) if m != leader)]:
        etcd.kill(member)
        time.sleep(2 * 2.0)  # two TTLs without that member (and, first, without the leader)
        etcd.start(member)
        until(lambda: etcd.leader() is not None, 10, "etcd has a leader again")
        time.sleep(0.5)
    load.stop()
    assert not load.failures, "\n".join(load.failures[:20])
    for i in range(3):
        views = views_adopted(hosts[i])
        whole = views.index([0, 1, 2])  # the views before are the start's, one join at a time
        assert all(v == [0, 1, 2] for v in views[whole:]), f"host {i} removed a live member: {views}"
        until(lambda i=i: hosts[i].metric("shoal_membership_in_touch") == 1, 5, f"host {i} in touch")
    all_readable(hosts, load.acked, on=[0, 1, 2])


def test_a_host_cut_from_etcd_only_leaves_the_view_and_rejoins_at_the_heal(make_hosts):
    hosts = make_hosts(3, etcd=1, burst=range(3), durability="local")
    wait_view(hosts, [0, 1, 2])
    made = {i: put_some(hosts[i], 30, f"host{i}") for i in range(3)}

    hosts.network.cut_from_switch(2)
    # Its lease lapses: the others remove it; it knows it is out of touch (it still hears
    # its peers, and they say they are in touch), so it stops acting as a home.
    wait_view(hosts, [0, 1], timeout=TTL + 3.0)
    until(lambda: hosts[2].metric("shoal_membership_in_touch") == 0, TTL + 3.0, "host 2 out of touch")
    # `shoal cluster status` from a member shows the view and the cut-off host (the members
    # that took its homes are `rebuilding` until the owners restored there, within a lease).
    rows: dict[int, dict[str, Any]] = {}

    def status_settled() -> bool:
        nonlocal rows
        rows = {row["node"]: row for row in cluster_status(hosts, 0)}
        return [rows[n]["state"] for n in range(3)] == ["up", "up", "out of touch"]

    until(status_settled, hosts.lease + 3, "cluster status settling", interval=0.2)
    assert rows[0]["view_members"] == rows[1]["view_members"] == [0, 1], rows
    during = put_some(hosts[0], 20, "during")
    during1 = put_some(hosts[1], 20, "during1")
    all_readable(hosts, made[0] | made[1] | during | during1, on=[0, 1])

    # Host 2 registers nothing meanwhile: its view may be stale. Each put fails, typed and
    # about the node (not an id's home: `put` would try 32 ids), once it waited a lease
    # (the cluster file's, 2 s) for the service to come back.
    on_cut: dict[shoal.ObjectID, str] = {}
    for i in range(3):
        data = f"cut-{i}-".encode() * 200
        oid, took = hosts[2].timed("put", data)
        if isinstance(oid, Exception):
            assert isinstance(oid, shoal.NodeUnavailable) and "membership" in str(oid), oid
            assert took < 2 * hosts.lease + 1, f"a put on a cut-off host failed after {took:.1f} s"
        else:
            on_cut[oid] = sha(data)

    hosts.network.heal_from_switch(2)
    wait_view(hosts, [0, 1, 2], timeout=TTL + VIEW_SEEN)
    until(lambda: hosts[2].metric("shoal_membership_in_touch") == 1, VIEW_SEEN, "host 2 in touch")
    parts = [made[0], made[1], made[2], during, during1, on_cut]
    expected = {oid: digest for part in parts for oid, digest in part.items()}
    assert len(expected) == sum(map(len, parts)), "an id was created twice"
    all_readable(hosts, expected, on=[0, 1, 2])


def test_a_host_lost_for_good_has_its_backing_objects_adopted_and_the_rest_reported_lost(make_hosts):
    # Backing stores of 2 MiB: the 3 MiB objects below never reach them (they stay on the
    # burst buffer or in memory, as objects the write-behind drain had not taken yet would).
    hosts = make_hosts(3, etcd=1, shared_backing=True, backing_capacity="2MiB")
    wait_view(hosts, [0, 1, 2])
    made = put_some(hosts[0], 20, "host0") | put_some(hosts[1], 20, "host1")
    durable = put_some(hosts[2], 200, "durable", "backing", size=2000)
    deleted = list(durable)[::7]  # acknowledged deletes: they must stay deleted
    hosts[2].client.delete(deleted)
    for oid in deleted:
        del durable[oid]
    lost = put_some(hosts[2], 4, "burst", "local", 3 << 20) | put_some(
        hosts[2], 4, "memory", "memory", 3 << 20
    )
    all_readable(hosts, made | durable | lost, on=[0, 1, 2])

    # Host 2 is destroyed: its lease ends, a survivor adopts its backing store (on the
    # shared file system) and serves what reached it; the rest is reported lost by id.
    hosts.kill(2)
    removed = wait_view(hosts, [0, 1], timeout=TTL + 2.0)
    ids, want = list(durable), list(durable.values())
    readable = until(lambda: hosts[1].checksums(ids) == want, 10, "host 2's backing objects readable")
    all_readable(hosts, made | durable, on=[0, 1])
    gone = deleted + list(lost)
    for i in (0, 1):
        assert hosts[i].checksums(gone) == [None] * len(gone), f"host {i} serves a deleted or lost id"
    rows = cluster_status(hosts, 0)
    assert sum(row["adopted_objects"] for row in rows) == len(durable), rows
    listed = {shoal.ObjectID(bytes.fromhex(h)) for row in rows for h in row["lost_ids"]}
    # Every lost id is listed: by its home, or (whose home was host 2 itself) by the member
    # that witnessed it (docs/cluster.md, "Adoption").
    assert listed == set(lost), f"lost ids listed {len(listed)}, expected {len(lost)}"
    assert sum(row["lost_objects"] for row in rows) == len(lost)

    # Host 2, started again on the same stores, is refused: its store is its adopter's now.
    done = hosts[2].run(
        sys.executable, "-m", "shoal", "serve", "--cluster", hosts.cluster_file, "--node", "2"
    )
    assert done["returncode"] != 0 and "was adopted by node" in done["stderr"], done
    print(
        f"removed in {removed:.2f} s; {len(durable)} backing objects readable {readable:.2f} s later; "
        f"{len(listed)} of {len(lost)} lost ones listed"
    )
