"""What a caller may rely on once a single-object call returns, on a machine whose
cores are all busy (issue 40, docs/fast-path.md "What a caller observes"): a seal does
not wait for the daemon, yet every get on the node finds the object at once; a delete
hides the object from every get on the node; and an idle client and daemon spend no CPU
after the last call."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest
from _shoal_testing import Child, Daemon

# Bounds the time of calls or counts CPU: not beside other tests (conftest.py).
pytestmark = pytest.mark.alone

ROUNDS = 300


@contextlib.contextmanager
def cpu_hogs() -> Iterator[None]:
    """One CPU-bound shell loop per core (what issue 40 measures under)."""
    hogs = [
        subprocess.Popen(["bash", "-c", "while :; do :; done"], start_new_session=True)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        time.sleep(0.1)
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


# A reader in its own process: for each id it is sent, a get with timeout 0 and a
# contains, through the fast path (`fast`) or a socket-only client; answers found/absent.
READER = """
fast = sys.argv[2] == "fast"
client = shoal.Client(sys.argv[1], fast_path=fast)
emit({"ready": True})
for line in sys.stdin:
    oid = bytes.fromhex(line.strip())
    [buffer] = client.get_buffers([oid], timeout_ms=0)
    got = None if buffer is None else bytes(memoryview(buffer)[:8]).hex()
    del buffer
    emit({"got": got, "contains": client.contains(oid)})
"""


def readers(store: Daemon) -> list[Child]:
    out = []
    for mode in ("fast", "socket"):
        child = Child(READER, str(store.socket), mode)
        assert child.json()["ready"]
        out.append(child)
    return out


def ask(children: list[Child], oid_hex: str) -> list[dict]:
    """Sends an id to every reader, then takes each one's answer."""
    for child in children:
        child.send(oid_hex)
    return [child.json() for child in children]


def test_after_seal_returns_every_get_on_the_node_finds_the_object_under_load(store: Daemon) -> None:
    """The seal publishes its record and returns; a get that misses the index asks the
    daemon, which applies published records first — from this process, another process's
    fast path and a socket-only client, with timeout 0, in a loop, with every core busy."""
    writer = store.client()
    others = readers(store)
    try:
        with cpu_hogs():
            for i in range(ROUNDS):
                oid = os.urandom(20)
                stamp = i.to_bytes(8, "little")
                if i % 2:
                    buffer = writer.create(oid, 1000)
                    memoryview(buffer)[:8] = stamp
                    writer.seal(oid)
                    del buffer
                else:
                    writer.put_batch([oid], [stamp + bytes(992)])
                [mine] = writer.get_buffers([oid], timeout_ms=0)
                assert mine is not None and bytes(memoryview(mine)[:8]) == stamp, i
                del mine
                assert writer.contains(oid), i
                for answer in ask(others, oid.hex()):
                    assert answer == {"got": stamp.hex(), "contains": True}, (i, answer)
    finally:
        for child in others:
            child.kill()


def test_after_put_returns_the_object_is_found_by_a_reader_that_never_waits(store: Daemon) -> None:
    """`put` (create in lent space, write, seal with release) from one process, then at
    once `get(timeout 0)` from another: found every time, with every core busy."""
    writer = store.client()
    others = readers(store)
    try:
        with cpu_hogs():
            for i in range(ROUNDS // 2):
                oid = writer.put(np.full(125, i, dtype=np.int64))
                for answer in ask(others, oid.binary().hex()):
                    assert answer["got"] == np.full(1, i, dtype=np.int64).tobytes().hex(), (i, answer)
                    assert answer["contains"], (i, answer)
    finally:
        for child in others:
            child.kill()


def test_after_delete_returns_no_get_on_the_node_finds_the_object_under_load(store: Daemon) -> None:
    """Another process reads the object through the fast path (so it is in its index),
    then this one deletes it: once delete returns, gets there (fast path and socket) with
    timeout 0 find nothing, and contains says no, with every core busy."""
    writer = store.client()
    others = readers(store)
    try:
        with cpu_hogs():
            for i in range(ROUNDS):
                oid = os.urandom(20)
                writer.put_batch([oid], [i.to_bytes(8, "little") + bytes(992)])
                for answer in ask(others, oid.hex()):
                    assert answer["got"] == i.to_bytes(8, "little").hex(), i
                writer.delete(oid)
                assert writer.get_buffers([oid], timeout_ms=0) == [None], i
                assert not writer.contains(oid), i
                for answer in ask(others, oid.hex()):
                    assert answer == {"got": None, "contains": False}, i
    finally:
        for child in others:
            child.kill()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (every thread), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wake_ups(pid: int) -> int:
    """Context switches of every thread of a process so far: how often its threads ran."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/status") as f:
            total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return total


def test_an_idle_client_and_daemon_spend_no_cpu_after_the_last_call(store: Daemon) -> None:
    """After a burst of every single-object call, the client's process (its release thread
    included) and the daemon (its write poller and fast-path sweeper included) sleep: under
    2% of a core over a second, measured from /proc/PID/stat; and once the daemon has been
    idle a second, its threads run at most a few times a second (the sweeper rests: it ran
    every 20 ms, ~50 wake-ups a second, for as long as the daemon lived)."""
    client = store.client()
    kept = []
    for i in range(2000):
        oid = os.urandom(20)
        buffer = client.create(oid, 1000)
        memoryview(buffer)[:8] = i.to_bytes(8, "little")
        client.seal(oid)
        del buffer
        kept.append(client.put(np.arange(125, dtype=np.int64)))
        [got] = client.get_buffers([oid], timeout_ms=0)
        del got
        assert client.contains(oid)
        assert not client.contains(os.urandom(20))
        client.delete(oid)
    time.sleep(0.2)  # let the last records be applied and the pollers give up
    me, daemon = os.getpid(), store.process.pid
    mine0, daemon0 = cpu_seconds(me), cpu_seconds(daemon)
    time.sleep(1.0)
    mine, spent = cpu_seconds(me) - mine0, cpu_seconds(daemon) - daemon0
    assert mine <= 0.02, f"the idle client spent {mine:.3f} s of CPU in 1 s"
    assert spent <= 0.02, f"the idle daemon spent {spent:.3f} s of CPU in 1 s"
    woke0 = wake_ups(daemon)
    time.sleep(2.0)
    woke = wake_ups(daemon) - woke0
    assert woke <= 20, f"the idle daemon's threads ran {woke} times in 2 s"
    assert len(kept) == 2000 and all(client.contains(oid) for oid in kept[-10:])
    # A client's call wakes the sweeper back to its busy pace: a kept object (deleted while
    # a fast-path reader holds it) is given back within moments of its release.
    oid = os.urandom(20)
    client.put(b"x" * 100, oid)
    [held] = client.get_buffers([oid], timeout_ms=0)
    client.delete(oid)
    used = client.stats()["used"]
    del held
    deadline = time.monotonic() + 0.5
    while client.stats()["used"] >= used:
        assert time.monotonic() < deadline, "a deleted object's memory did not come back"
        time.sleep(0.01)
