"""Many processes and threads on one daemon at once."""

from __future__ import annotations

import gc
import threading

import numpy as np
from _shoal_testing import wait_for

import shoal

PROCESSES = 8
OBJECTS = 200

WORKER = """
socket, me, processes, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def oid(p, i):
    return hashlib.sha1(f"{p}/{i}".encode()).digest()

def content(p, i):
    size = (p * 7919 + i * 104729) % 16384 + 1
    return hashlib.shake_128(f"content {p}/{i}".encode()).digest(size)

client = shoal.Client(socket)

# Half in batches of 25 (put_batch), half one by one (put).
half = count // 2
for start in range(0, half, 25):
    ids = [oid(me, i) for i in range(start, min(start + 25, half))]
    client.put_batch(ids, [content(me, i) for i in range(start, min(start + 25, half))],
                     metadata=[b"batch"] * len(ids), timeout_ms=5000)
for i in range(half, count):
    assert client.put(content(me, i), oid(me, i), timeout_ms=5000) == shoal.ObjectID(oid(me, i))
emit({"put": count})

# Read everybody else's objects, waiting for the ones not written yet.
verified = 0
for p in range(processes):
    if p == me:
        continue
    ids = [oid(p, i) for i in range(count)]
    buffers = client.get_buffers(ids, timeout_ms=30_000)
    missing = [i for i, b in enumerate(buffers) if b is None]
    assert not missing, f"process {me}: objects {missing[:5]} of process {p} never appeared"
    for i, buffer in enumerate(buffers):
        expected = content(p, i)
        assert hashlib.sha256(buffer).digest() == hashlib.sha256(expected).digest(), (p, i)
        assert bytes(buffer.metadata()) == (b"batch" if i < half else b"shoal/bytes")
        verified += 1
    del buffers, buffer
gc.collect()
client.stats()  # a round trip: our releases went out before it
emit({"verified": verified})

sys.stdin.readline()  # everyone has read everything: delete our own
client.delete([oid(me, i) for i in range(count)])
emit({"deleted": count})
"""


def test_eight_processes_put_and_get_each_others_objects(store, spawn):
    client = store.client()
    workers = [spawn(WORKER, store.socket, str(p), str(PROCESSES), str(OBJECTS)) for p in range(PROCESSES)]
    for worker in workers:
        assert worker.json(timeout=60) == {"put": OBJECTS}
    for worker in workers:
        assert worker.json(timeout=60) == {"verified": (PROCESSES - 1) * OBJECTS}

    stats = client.stats()
    assert stats["objects"] == stats["sealed"] == PROCESSES * OBJECTS
    assert stats["referenced"] == 0
    assert stats["evictions"] == 0
    assert stats["clients"] == PROCESSES + 1
    assert len(client.list()) == PROCESSES * OBJECTS
    assert all(o.sealed and o.ref_count == 0 for o in client.list())

    for worker in workers:
        worker.send("delete")
    for worker in workers:
        assert worker.json(timeout=30) == {"deleted": OBJECTS}
        worker.finish(timeout=30)
    stats = client.stats()
    assert (stats["objects"], stats["used"], stats["referenced"]) == (0, 0, 0)
    wait_for(lambda: client.stats()["clients"] == 1, timeout=2)


def test_threads_share_one_client(store):
    client = store.client()
    errors: list[BaseException] = []
    ids: dict[int, list] = {}

    def work(t: int) -> None:
        try:
            mine = []
            for i in range(100):
                value = np.full(100 + i, t * 1000 + i, dtype=np.int64)
                oid = client.put(value)
                mine.append((oid, value))
                got = client.get(oid, timeout_ms=5000)
                assert np.array_equal(got, value)
                del got  # released from this thread while others use the connection
            ids[t] = mine
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    gc.collect()
    stats = client.stats()
    assert stats["objects"] == 800
    assert stats["referenced"] == 0
    for mine in ids.values():
        for oid, value in mine[::10]:
            assert np.array_equal(client.get(oid), value)
    client.delete([oid for mine in ids.values() for oid, _ in mine])
    gc.collect()
    assert client.stats()["used"] == 0


def test_many_waiters_wake_on_one_seal(store):
    creator = store.client()
    oid = shoal.ObjectID.from_random()
    waiters = [store.client() for _ in range(6)]
    results: list = [None] * len(waiters)

    def wait(i: int) -> None:
        buffer = waiters[i].get_buffers([oid], timeout_ms=20_000)[0]
        results[i] = None if buffer is None else bytes(buffer)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(waiters))]
    for thread in threads:
        thread.start()
    buffer = creator.create(oid, 5)
    memoryview(buffer)[:] = b"ready"
    creator.seal(oid, release=True)
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    assert results == [b"ready"] * len(waiters)
    wait_for(lambda: creator.stats()["referenced"] == 0, timeout=2)


def test_concurrent_create_of_the_same_id_has_one_winner(store, spawn):
    code = """
    client = shoal.Client(sys.argv[1])
    emit("ready")
    sys.stdin.readline()
    won = 0
    for h in sys.argv[2:]:
        try:
            client.put(f"from {os.getpid()}".encode(), bytes.fromhex(h))
            won += 1
        except shoal.ObjectExists:
            pass
    emit(won)
    """
    client = store.client()
    oids = [shoal.ObjectID.from_random() for _ in range(150)]
    racers = [spawn(code, store.socket, *(o.hex() for o in oids)) for _ in range(4)]
    for racer in racers:
        assert racer.json() == "ready"
    for racer in racers:
        racer.send("go")
    wins = [racer.json() for racer in racers]
    assert sum(wins) == len(oids)  # each id created exactly once
    assert client.stats()["objects"] == len(oids)
    for racer in racers:
        racer.finish()
