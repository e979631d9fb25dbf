"""Network partitions: each daemon of a 3-node cluster in a network namespace of its own.

Node i's daemon runs in its own network namespace with address 10.201.i.2 on a veth pair
whose other end is in a private "router" namespace, which forwards between the nodes. A
partition is a pair of `ip rule ... blackhole` rules in the router: packets between the two
sides vanish without an answer, as when a link or a switch fails, while every node keeps its
address and its links. Only namespaces this test creates are touched, never the host's
network; they live as long as the `cat` processes holding them (which exit when this process
does).

Unix sockets and /dev/shm regions are file-system objects, so this process (in the host's
namespace) is a client of every node and maps every region: the data plane (shared memory)
stays up while the control plane (peer RPC) is cut. Skipped where namespaces cannot be made.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from _shoal_testing import Cluster, hold_namespaces, home_of, ids_homed_at, shoal_ok, short_dir, wait_for

import shoal

# Bounds the time of calls or counts CPU: not beside other tests (conftest.py).
pytestmark = pytest.mark.alone

OID = shoal.ObjectID
LEASE = 2.0  # s, the cluster file's lease_ms (heartbeats every 200 ms)
RPC_TIMEOUT = 2.0  # s, a peer call that gets no answer fails after this
FAST = 0.5  # s, bound for a call that must not wait for any timeout


def homed_at(node: int, nodes: int = 3) -> shoal.ObjectID:
    """A random id whose home is `node` (so it can be created on that side of a partition)."""
    return ids_homed_at(node, 1, nodes)[0]


@functools.cache
def namespaces_unavailable() -> str | None:
    """Why network namespaces with veth pairs and blackhole rules cannot be made here, if so."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    probe = "ip link add probe0 type veth peer name probe1 && ip rule add from 10.201.0.0/24 blackhole"
    try:
        result = subprocess.run(
            ["unshare", "-Urn", "sh", "-c", probe], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare failed: {err}"
    if result.returncode != 0:
        return f"cannot make a network namespace with a veth pair here: {result.stderr.strip()}"
    return None


class Network:
    """A router namespace and one namespace per node (in a user namespace of our own, so no
    privilege is needed), wired as described in the module docstring."""

    def __init__(self, nodes: int) -> None:
        self._holders: list[subprocess.Popen] = []
        self._known = {os.readlink("/proc/self/ns/net")}
        self._cuts: set[tuple[int, int]] = set()  # (from, to) pairs whose packets vanish
        try:
            self.router = self._hold(["unshare", "-Urn", "cat"])
            self.nodes = [
                self._hold([*self.enter(self.router), "unshare", "-n", "cat"]) for _ in range(nodes)
            ]
            self._wire()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def address(node: int) -> str:
        return f"10.201.{node}.2"

    def enter(self, holder: int) -> list[str]:
        """The command prefix that runs a program in `holder`'s namespace."""
        return ["nsenter", "-t", str(holder), "-U", "-n"]

    def run(self, holder: int, *command: str) -> None:
        result = subprocess.run([*self.enter(holder), *command], capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: {result.stderr.strip()}")

    def _hold(self, command: list[str]) -> int:
        """Starts a process that keeps new namespaces alive; returns its pid once it is in them."""
        return hold_namespaces(command, self._holders, self._known)

    def _wire(self) -> None:
        self.run(self.router, "ip", "link", "set", "lo", "up")
        self.run(self.router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
        for i, node in enumerate(self.nodes):
            veth = ["ip", "link", "add", f"r{i}", "type", "veth", "peer", "name", "eth0", "netns", str(node)]
            self.run(self.router, *veth)
            self.run(self.router, "ip", "addr", "add", f"10.201.{i}.1/24", "dev", f"r{i}")
            self.run(self.router, "ip", "link", "set", f"r{i}", "up")
            self.run(node, "ip", "link", "set", "lo", "up")
            self.run(node, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            self.run(node, "ip", "link", "set", "eth0", "up")
            self.run(node, "ip", "route", "add", "default", "via", f"10.201.{i}.1")

    def _rule(self, verb: str, src: int, dst: int) -> None:
        rule = ["from", f"10.201.{src}.0/24", "to", f"10.201.{dst}.0/24", "blackhole"]
        self.run(self.router, "ip", "rule", verb, *rule)

    def cut(self, a: int, b: int) -> None:
        """Drops every packet between nodes a and b, both ways, silently."""
        for src, dst in ((a, b), (b, a)):
            self.drop(src, dst)

    def drop(self, src: int, dst: int) -> None:
        """Drops every packet from node src to node dst (one way: dst's calls reach src, and
        src applies them, but its answers never come back)."""
        if (src, dst) not in self._cuts:
            self._rule("add", src, dst)
            self._cuts.add((src, dst))

    def isolate(self, node: int) -> None:
        for other in range(len(self.nodes)):
            if other != node:
                self.cut(node, other)

    def heal(self) -> None:
        for src, dst in sorted(self._cuts):
            self._rule("del", src, dst)
        self._cuts.clear()

    def close(self) -> None:
        for holder in self._holders:
            if holder.poll() is None:
                holder.kill()
            holder.wait(10)
            for stream in (holder.stdin, holder.stderr):
                if stream is not None:
                    stream.close()


class NetnsCluster(Cluster):
    """Three daemons, each in its node's namespace, with a cluster file whose `rpc` addresses
    are the namespaces' addresses. Clients, logs and regions as for `Cluster`."""

    def __init__(self, directory: Path, network: Network, nodes: int = 3) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.network = network
        self.name = f"p{os.getpid()}x{directory.name}"[-24:]
        self.nodes = nodes
        self._clients: list[shoal.Client] = []
        self._daemons: list[subprocess.Popen] = []
        self.file = directory / "cluster.toml"
        # Addresses other namespaces reach: peer traffic over TLS, a CA made here and one
        # certificate per node (a file without per-node keys: bound to the node id alone).
        ca = directory / "ca"
        shoal_ok("cluster", "ca", "--out", str(ca))
        text = [
            f'[cluster]\nname = "{self.name}"\ntoken = "{secrets.token_hex(16)}"\n'
            f'heartbeat_ms = 200\nlease_ms = {int(LEASE * 1000)}\ntls_ca = "{ca / "ca.crt"}"\n'
        ]
        for i in range(nodes):
            cert = directory / f"n{i}"
            shoal_ok("cluster", "cert", "--ca", str(ca), "--node", str(i), "--out", str(cert))
            text.append(
                f'[[node]]\nid = {i}\nrpc = "{network.address(i)}:7700"\nsocket = "{self.socket(i)}"\n'
                f'region = "/dev/shm/shoal-{os.getuid()}-{self.name}-n{i}"\nregion_size = "64MiB"\n'
                f'tls_cert = "{cert}.crt"\ntls_key = "{cert}.tls"\n'
            )
        self.file.write_text("\n".join(text))
        self.file.chmod(0o600)
        try:
            self._start()
        except BaseException:
            try:
                self.down()
            except AssertionError:
                pass  # the start's error says more
            raise

    def _start(self) -> None:
        env = dict(os.environ, NO_COLOR="1")
        env.pop("SHOAL_SOCKET", None)
        for i in range(self.nodes):
            with open(self.directory / f"n{i}.log", "wb") as log:
                daemon = subprocess.Popen(
                    [*self.network.enter(self.network.nodes[i]), sys.executable, "-m", "shoal", "serve",
                     "--cluster", str(self.file), "--node", str(i)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
                )  # fmt: skip
            self._daemons.append(daemon)
            (self.directory / f"n{i}.pid").write_text(str(daemon.pid))
        for i in range(self.nodes):
            wait_for(lambda i=i: self._serving(i), timeout=15, message=f"node {i} serving")
        # Every node has heard every other one: the cluster is whole before the test cuts it.
        everyone = set(range(self.nodes))
        wait_for(lambda: all(self.sees(i) == everyone for i in range(self.nodes)), timeout=10)

    def _serving(self, node: int) -> bool:
        if self._daemons[node].poll() is not None:
            raise AssertionError(
                f"node {node} exited with {self._daemons[node].returncode}:\n{self.log(node)}"
            )
        try:
            shoal.Client(self.socket(node)).close()
            return True
        except shoal.Disconnected:
            return False

    def sees(self, node: int) -> set[int]:
        """The nodes `node`'s daemon counts as alive (answering its heartbeats), itself included."""
        client = shoal.Client(self.socket(node))
        try:
            return {n["node"] for n in client.cluster_nodes() if n["alive"]}
        finally:
            client.close()

    def status_from(self, node: int) -> dict[int, str]:
        """`shoal cluster status` run from inside `node`'s network namespace: node -> up/down."""
        result = subprocess.run(
            [*self.network.enter(self.network.nodes[node]), sys.executable, "-m", "shoal",
             "cluster", "status", "--file", str(self.file), "--json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return {row["node"]: row["state"] for row in map(json.loads, result.stdout.splitlines())}

    def down(self) -> None:
        """Stops every daemon (SIGTERM; each must exit with 0: no panic during the test)."""
        for client in self._clients:
            client.close()
        failures = []
        for i, daemon in enumerate(self._daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
            try:
                code = daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                code = daemon.wait(10)
            if code != 0:
                failures.append(f"node {i} exited with {code}:\n{self.log(i)}")
        for path in self.regions():  # left behind only by a daemon that had to be killed
            os.unlink(path)
        assert not failures, "\n".join(failures)


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    """A 3-node cluster whose nodes can be partitioned: `.network.isolate(2)`, `.network.heal()`."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    network = Network(3)
    cluster = None
    try:
        cluster = NetnsCluster(short_dir(tmp_path) / "c0", network)
        yield cluster
    finally:
        gc.collect()
        try:
            if cluster is not None:
                cluster.down()
        finally:
            network.close()


def object_refs(client: shoal.Client, oid: shoal.ObjectID) -> int:
    return next(o.ref_count for o in client.list() if o.id == oid)


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        value = call()
    except shoal.ShoalError as err:
        value = err
    return value, time.monotonic() - started


def logged_at(log: str, message: str) -> float:
    """When a daemon logged `message` first (its log lines start with an RFC 3339 UTC time)."""
    line = next(line for line in log.splitlines() if message in line)
    return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()


def found(buffers: list) -> int:
    return sum(b is not None for b in buffers)


def test_a_partitioned_node_is_cut_off_then_rejoins(netns_cluster):
    cluster = netns_cluster
    c = [cluster.client(i) for i in range(3)]
    on = {k: [c[k].put(f"n{k}-{j}".encode()) for j in range(24)] for k in range(3)}
    everything = on[0] + on[1] + on[2]
    for reader in c:  # each reader caches the owner of every id
        assert found(reader.get_buffers(everything, timeout_ms=5000)) == 72
    unread = [c[1].put(f"u{j}".encode()) for j in range(24)]  # owners not cached on node 0
    doomed = [c[1].put(b"doomed", homed_at(home)) for home in (0, 1, 2, 2)]
    far = [c[2].put(b"far", homed_at(home)) for home in (0, 2)]
    assert found(c[0].get_buffers(doomed + far)) == 6  # node 0 caches their owners
    # The loans these reads took lapse (docs/cluster.md, "Loans"), so the references
    # counted below are the ones taken next.
    wait_for(lambda: object_refs(c[0], on[0][0]) == 0 and object_refs(c[2], on[2][0]) == 0, timeout=3)
    lent = c[0].put(b"lent to node 2")
    held_by_2 = c[2].get_buffers([lent, *on[0][:4]])  # node 2 holds references at node 0 ...
    held_by_0 = c[0].get_buffers(on[2][:4])  # ... and node 0 at node 2
    assert object_refs(c[0], lent) == 1 and object_refs(c[2], on[2][0]) == 1

    cluster.network.isolate(2)
    cut, cut_at = time.monotonic(), time.time()

    # Before heartbeats notice, a call to node 2 waits for the RPC timeout, never longer
    # (a get of an uncached id asks its home, then its owner: two calls at most).
    early: dict[str, tuple[object, float]] = {}
    calls = {"on 1": lambda: c[0].get_buffers(on[1] + unread, timeout_ms=0),
             "on 2": lambda: c[0].get_buffers(on[2][4:], timeout_ms=100)}  # fmt: skip
    early_calls = threading.Thread(target=lambda: early.update((k, timed(f)) for k, f in calls.items()))
    early_calls.start()
    # Nodes 0 and 1 see node 2 go within half a lease plus a heartbeat; node 2 sees both go.
    expected = [{0, 1}, {0, 1}, {2}]
    wait_for(lambda: [cluster.sees(i) for i in range(3)] == expected, timeout=2 * LEASE)
    assert time.monotonic() - cut < LEASE / 2 + 1
    early_calls.join(4 * RPC_TIMEOUT)
    assert found(early["on 1"][0]) == 48 and early["on 1"][1] < 2 * RPC_TIMEOUT + 1, early["on 1"][1]
    # Node 0's client reads node 2's objects through node 2's index, in node 2's memory,
    # which the cut does not reach (docs/fast-path.md "Gets of other nodes' objects"):
    # found at once until node 0 knows node 2 is down; then as (b) below.
    assert found(early["on 2"][0]) == 20 and early["on 2"][1] < FAST, early["on 2"][1]
    early.clear()
    assert cluster.status_from(0) == {0: "up", 1: "up", 2: "down"}
    assert cluster.status_from(2) == {0: "down", 1: "down", 2: "up"}

    # (a) Nodes 0 and 1 keep working among themselves, without waiting for node 2.
    for reader in c[:2]:
        got, took = timed(lambda r=reader: r.get_buffers(on[0] + on[1] + unread, timeout_ms=0))
        assert found(got) == 72 and took < FAST, f"{took:.2f} s"
        assert bytes(got[30]) == b"n1-6"
        del got
    c[0].delete(doomed)  # homed anywhere: their owner is cached
    assert not any(c[1].contains(oid) for oid in doomed)
    # (b) What needs node 2 fails at once, with NodeUnavailable naming it.
    got, took = timed(lambda: c[0].get_buffers(on[2][4:], timeout_ms=0))
    assert found(got) == 0 and took < FAST, f"{took:.2f} s"
    # A single get says why it found nothing: the node it needs is unreachable.
    err, took = timed(lambda: c[0].get(on[2][5], timeout_ms=100))
    assert isinstance(err, shoal.NodeUnavailable) and "node 2" in str(err) and took < FAST, (err, took)
    for oid in far:  # whether its home answers or not, its owner does not
        err, took = timed(lambda oid=oid: c[0].delete(oid))
        assert isinstance(err, shoal.NodeUnavailable) and took < FAST, (err, took)
    err, took = timed(lambda: c[0].create(OID.from_random(), 100, node=2))
    assert isinstance(err, shoal.NodeUnavailable) and "node 2" in str(err) and took < FAST, (err, took)
    for _ in range(30):  # a caller-chosen id needs its home: exactly the ids homed at node 2 fail
        oid = OID.from_random()
        err, took = timed(lambda oid=oid: c[1].put(b"new", oid))
        assert took < FAST, f"{took:.2f} s"
        if home_of(oid, 3) == 2:
            assert isinstance(err, shoal.HomeUnavailable) and "node 2" in str(err), err
        else:
            assert not isinstance(err, shoal.ShoalError), err
    # A put that chooses its id never depends on node 2: all succeed, none homed there.
    chosen = [timed(lambda: c[1].put(b"any")) for _ in range(30)]
    assert all(isinstance(oid, OID) and took < FAST for oid, took in chosen), chosen
    assert all(home_of(oid, 3) != 2 for oid, _ in chosen)
    # (d) Node 2's clients keep working on node 2's objects, and still read the memory of
    # node 0 they had mapped (the data plane is shared memory, not the network).
    got, took = timed(lambda: c[2].get_buffers(on[2], timeout_ms=0))
    assert found(got) == 24 and took < FAST and bytes(got[7]) == b"n2-7"
    del got
    assert [bytes(b) for b in held_by_2[1:]] == [f"n0-{j}".encode() for j in range(4)]
    for _ in range(30):
        oid = OID.from_random()
        err, _ = timed(lambda oid=oid: c[2].put(b"mine", oid))
        assert isinstance(err, shoal.ShoalError) == (home_of(oid, 3) != 2), err
    got, _ = timed(lambda: c[2].get_buffers(on[0][4:], timeout_ms=0))
    assert found(got) == 0

    # (c) After the lease each side fences the other (docs/cluster.md, "Fencing"): what
    # the other held is quarantined, not freed, since its clients may still map it.
    for node, lost in ((0, 2), (1, 2), (2, 0), (2, 1)):
        fenced = f"fenced node {lost} (its lease expired)"
        wait_for(lambda node=node, fenced=fenced: fenced in cluster.log(node), timeout=2 * LEASE)
        delay = logged_at(cluster.log(node), fenced) - cut_at
        assert LEASE - 0.5 < delay < LEASE + 1, f"node {node} fenced {delay:.1f} s after the cut"
    assert object_refs(c[0], lent) == 1 and object_refs(c[2], on[2][0]) == 1, "quarantined"
    used = c[0].stats()["used"]
    c[0].delete(lent)  # node 2's clients may still read it: kept until node 2 confirms
    assert c[0].stats()["used"] == used

    # A get without a timeout waits through the partition and returns once it heals.
    waiting_client = cluster.client(0)
    waited: list = []
    waiter = threading.Thread(target=lambda: waited.append(waiting_client.get(on[2][9])), daemon=True)
    waiter.start()

    # (e) Healed: the nodes see each other again within a few heartbeats, whatever the
    # partition's length, and everything works across nodes again.
    time.sleep(max(0.0, cut + 8 - time.monotonic()))  # partitioned for 8 s at least
    cluster.network.heal()
    healed = time.monotonic()
    wait_for(lambda: all(cluster.sees(i) == {0, 1, 2} for i in range(3)), timeout=15)
    took = time.monotonic() - healed
    assert took < 3, f"nodes saw each other {took:.1f} s after the heal"
    waiter.join(5)
    assert [v.to_pybytes() for v in waited] == [b"n2-9"], "the waiting get did not return"
    for reader in c:
        got, took = timed(lambda r=reader: r.get_buffers(everything + unread, timeout_ms=0))
        assert found(got) == 96 and took < FAST, f"{took:.2f} s"
        del got
    for client in c:
        for _ in range(10):
            client.put(b"after")
    assert cluster.status_from(0) == {0: "up", 1: "up", 2: "up"}
    for node in (0, 1):
        assert "peer is up node=2" in cluster.log(node).split("fenced node 2")[-1]
    # Once their clients let go, both sides confirm their fences and the quarantines go.
    del held_by_0, held_by_2
    gc.collect()
    for node, lost in ((0, 2), (2, 0)):
        freed = f"freed what node {lost} held in quarantine: it confirmed its fence"
        wait_for(
            lambda node=node, freed=freed: freed in cluster.log(node),
            timeout=5,
            message=f"node {node} freeing node {lost}'s quarantine",
        )


def test_ids_freed_during_a_partition_can_be_created_again_after_it(netns_cluster):
    """A delete (or eviction) unregisters the id at its home; a home that is cut off is told
    when the partition heals, so the id does not stay claimed by an object that is gone."""
    cluster = netns_cluster
    c0, c1 = cluster.client(0), cluster.client(1)
    ids = [c0.put(f"v{i}".encode()) for i in range(60)]
    cut_off = [oid for oid in ids if home_of(oid, 3) == 2]
    kept = [oid for oid in ids if home_of(oid, 3) != 2]
    evicted = kept[-5:]
    assert len(cut_off) >= 5 and len(kept) >= 15
    cluster.network.isolate(2)
    wait_for(lambda: cluster.sees(0) == {0, 1}, timeout=2 * LEASE)
    c0.delete(cut_off[:-5] + kept[:10])
    assert c0.evict(10**9) > 0  # every object left goes: unregistered at their homes too
    assert not any(c0.contains(oid) for oid in ids)
    # Ids homed at the live nodes are free again (at once after a delete, soon after an
    # eviction), the others cannot be claimed yet.
    c1.put_batch(kept[:10], [b"again"] * 10)
    wait_for(lambda: _claims(c1, evicted), timeout=LEASE, message="evicted ids freed")
    with pytest.raises(shoal.NodeUnavailable, match="node 2"):
        c1.put(b"again", cut_off[0])
    cluster.network.heal()
    wait_for(lambda: all(cluster.sees(i) == {0, 1, 2} for i in range(3)), timeout=15)
    assert c1.get_buffers(cut_off, timeout_ms=0) == [None] * len(cut_off)
    # Node 2 has been told: every id is free (a retry would see ObjectExists otherwise).
    wait_for(lambda: _claims(c1, cut_off), timeout=LEASE, message="ids homed at node 2 freed")
    again = cluster.client(2).get_buffers(cut_off, timeout_ms=1000)
    assert [bytes(b) for b in again] == [b"again"] * len(cut_off)
    del again


def _claims(client: shoal.Client, ids: list) -> bool:
    try:
        client.put_batch(ids, [b"again"] * len(ids))
        return True
    except shoal.ObjectExists:
        return False


def test_no_memory_is_reused_under_a_node_cut_off_past_its_lease(netns_cluster):
    """Fencing (docs/cluster.md): an owner fences a node cut off past its lease, and keeps what
    that node held quarantined until it confirms. A reader on the cut-off node keeps reading
    the bytes it got (never memory reused for another object), a writer's late writes land in
    its own quarantined block (never in another object), and a release sent from before the
    fence never drops a reference taken after the heal."""
    cluster = netns_cluster
    c0, c2, other2 = cluster.client(0), cluster.client(2), cluster.client(2)
    size = 4096
    read, again = c0.put(b"r" * size), c0.put(b"a" * size)
    held = c2.get_buffers([read, again])  # a reader on node 2 of node 0's memory
    writing = c0.create(OID.from_random(), size, node=2)  # a writer on node 0 in node 2's memory
    cluster.network.isolate(2)
    wait_for(
        lambda: (
            "fenced node 2 (its lease expired)" in cluster.log(0)
            and "fenced node 0 (its lease expired)" in cluster.log(2)
        ),
        timeout=3 * LEASE,
    )
    c0.delete(read)
    c0.put(b"n" * size, homed_at(0))  # best fit: the block `read` had
    replacement = c2.put(b"s" * size, homed_at(2))  # best fit: the aborted allocation's block
    memoryview(writing)[:4] = b"late"
    violations = {
        "a reader read reused memory": bytes(held[0])[:1] != b"r",
        "a writer overwrote another object": bytes(c2.get_buffer(replacement))[:4] == b"late",
    }
    cluster.network.heal()
    wait_for(lambda: all(cluster.sees(i) == {0, 1, 2} for i in range(3)), timeout=15)
    taken = other2.get_buffer(again)  # a reference node 2 takes after the heal ...
    del held  # ... and the stale ones it returns
    gc.collect()
    time.sleep(0.5)
    violations["a stale release dropped a newer reference"] = object_refs(c0, again) == 0
    del taken, writing
    assert not any(violations.values()), violations
    wait_for(
        lambda: "freed what node 2 held in quarantine: it confirmed its fence" in cluster.log(0),
        timeout=5,
        message="node 2 confirmed its fence once its reader let go",
    )


def test_calls_whose_answers_were_lost_are_reconciled(netns_cluster):
    """Issue 15 item 10: node 1's Acquire and Register reach node 0 and take effect there, but
    every answer of node 0 to node 1 is lost, so node 1 times out and tells its clients the
    calls failed. Node 0 still hears node 1's heartbeats (no lease runs out): before, it kept
    the reference (the object pinned) and the claim (the id refused to every creator) for as
    long as node 1 lived. Now node 1 undoes the acquire by its number and unregisters the claim
    as soon as node 0 answers again."""
    cluster = netns_cluster
    c0, c2 = cluster.client(0), cluster.client(2)
    owned = c0.put(b"owned by node 0, homed at node 2", homed_at(2))
    claimed = homed_at(0)
    cluster.network.drop(0, 1)
    # Node 1 counts node 0 reachable for up to half a lease after it last heard from it, so
    # both calls go out now (two threads: each waits for the RPC timeout).
    outcomes: dict[str, object] = {}

    def get() -> None:
        client = cluster.client(1, fast_path=False)  # through node 1's Acquire
        outcomes["get"] = timed(lambda: client.get_buffers([owned], timeout_ms=0))

    def create() -> None:
        client = cluster.client(1)
        outcomes["put"] = timed(lambda: client.put(b"claimed by node 1", claimed))

    threads = [threading.Thread(target=get), threading.Thread(target=create)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(4 * RPC_TIMEOUT)
    (got, _), (put, _) = outcomes["get"], outcomes["put"]
    assert got == [None], got
    assert isinstance(put, shoal.ShoalError), put
    # Both took effect at node 0: the reference, and the claim (node 2 is refused it).
    assert object_refs(c0, owned) == 1
    with pytest.raises(shoal.ObjectExists):
        c2.put(b"claimed by node 2", claimed)
    cluster.network.heal()
    wait_for(lambda: object_refs(c0, owned) == 0, timeout=3 * LEASE, message="the acquire undone")
    wait_for(lambda: _claims(c2, [claimed]), timeout=3 * LEASE, message="the claim given up")
    assert bytes(c2.get_buffers([claimed], timeout_ms=1000)[0]) == b"again"
    assert bytes(cluster.client(1).get_buffers([owned], timeout_ms=1000)[0]) == (
        b"owned by node 0, homed at node 2"
    )
    # Nobody was fenced: node 0 heard node 1 all along.
    assert "fenced node" not in cluster.log(0)
