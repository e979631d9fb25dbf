"""Store adapters for the Table I benchmarks, run as worker subprocesses.

    python adapters.py STORE SOCKET

A worker connects to its store, prints one JSON line ({"ready": ...} or
{"unavailable": reason}) and then answers one JSON line per request line read
from stdin:

    {"op": "put", "count": N, "size": S}
        -> {"put_s", "put_minflt", "ids", "head", "tail"}
    {"op": "get", "ids": [...], "size": S, "head", "tail"}
        -> {"get_s", "read_s", "read_minflt"}
    {"op": "delete"}                      -> {}   (deletes the ids of the last put)
    {"op": "quit"}

The orchestrator (table1.py) sends put/delete to one worker (the writer) and get
to another (the getter), so gets come from a different process than puts. All
timing happens inside the workers, around the adapter call only.

This file runs under the project's python3 and under the Plasma venv's python
(pyarrow 11, numpy < 2), so it needs nothing but numpy and the store's client.
"""

import ctypes
import functools
import gc
import json
import os
import resource
import sys
import time
import traceback
import warnings

import numpy as np

ID_BYTES = 20
ABSENT = 255  # byte value the payloads never contain: the reader scans for it


def timed(fn, *args):
    """Run fn(*args) once; return (seconds, result)."""
    t0 = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t0, result


@functools.lru_cache(maxsize=2)
def payload(size):
    """Deterministic pseudo-random uint8 array, values 0..254 (never ABSENT).

    A numpy array, like the machine-limit memcpy source (numpy asks for huge
    pages for arrays of 4 MiB and more), so put and memcpy copy the same way.
    """
    rng = np.random.default_rng(size)
    return rng.integers(0, ABSENT, size, dtype=np.uint8)


def write(dst, src):
    """Copy src into the writable buffer dst (one memcpy)."""
    memoryview(dst).cast("B")[:] = src


_memchr = ctypes.CDLL(None).memchr
_memchr.restype = ctypes.c_void_p
_memchr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def read_all(buffers):
    """One sequential pass over every byte of every buffer.

    glibc's memchr (SIMD) looks for a byte the payloads never contain, so it
    reads each buffer to the end: a memory-bound reader that does not depend
    on numpy's version (numpy only hands over the address). Returns how many
    buffers did contain ABSENT, which must be 0.
    """
    found = 0
    for buf in buffers:
        a = np.frombuffer(buf, np.uint8)
        if _memchr(a.ctypes.data, ABSENT, a.size) is not None:
            found += 1
    return found


class PlasmaAdapter:
    """Apache Arrow Plasma via pyarrow.plasma (pyarrow 11, the last with it)."""

    def __init__(self, socket):
        warnings.simplefilter("ignore", DeprecationWarning)
        import pyarrow
        from pyarrow import plasma

        self.version = f"pyarrow {pyarrow.__version__}, numpy {np.__version__}"
        self.plasma = plasma
        self.client = plasma.connect(socket)

    def make_id(self, raw):
        return self.plasma.ObjectID(raw)

    def put(self, ids, src):
        for oid in ids:
            buf = self.client.create(oid, len(src))
            write(buf, src)
            self.client.seal(oid)
            del buf  # releases the object, as plasma's own put() does

    def get(self, ids):
        return self.client.get_buffers(ids, timeout_ms=1000)

    def release(self):
        # Buffers were dropped, which sent release messages; a round trip on
        # the same socket makes sure the store handled them before a delete.
        self.client.contains(self.plasma.ObjectID(bytes(ID_BYTES)))

    def delete(self, ids):
        self.client.delete(ids)


class ShmAdapter:
    """multiprocessing.shared_memory: one POSIX shm segment per object."""

    def __init__(self, socket):
        from multiprocessing import resource_tracker, shared_memory

        self.version = f"python {sys.version.split()[0]}, numpy {np.__version__}"
        self.tracker = resource_tracker
        self.SharedMemory = shared_memory.SharedMemory
        self.created = []  # writer: segments of the last put
        self.attached = []  # getter: segments of the last get
        warm = self.SharedMemory(create=True, size=1)  # starts the resource tracker
        warm.close()
        warm.unlink()

    def make_id(self, raw):
        return "sb" + raw.hex()

    def put(self, ids, src):
        for name in ids:
            shm = self.SharedMemory(name, create=True, size=len(src))
            write(shm.buf, src)
            self.created.append(shm)

    def get(self, ids):
        self.attached = [self.SharedMemory(name) for name in ids]
        return [shm.buf for shm in self.attached]

    def release(self):
        for shm in self.attached:
            shm.close()
            # Python 3.11 registers attached segments too; the writer unlinks.
            self.tracker.unregister(shm._name, "shared_memory")
        self.attached = []

    def delete(self, ids):
        for shm in self.created:
            shm.close()
            shm.unlink()
        self.created = []


class ShoalAdapter:
    """shoal, batched: put_batch / get_buffers."""

    def __init__(self, socket):
        import shoal

        version = getattr(shoal, "__version__", "?")
        self.version = f"shoal {version}, numpy {np.__version__}"
        self.shoal = shoal
        self.client = shoal.connect(socket)

    def make_id(self, raw):
        return self.shoal.ObjectID(raw)

    def put(self, ids, src):
        self.client.put_batch(ids, [src] * len(ids))

    def get(self, ids):
        return self.client.get_buffers(ids, timeout_ms=1000)

    def release(self):
        pass

    def delete(self, ids):
        self.client.delete(ids)


class ShoalEachAdapter(ShoalAdapter):
    """shoal, one object at a time: create / write / seal."""

    def put(self, ids, src):
        for oid in ids:
            buf = self.client.create(oid, len(src))
            write(buf, src)
            self.client.seal(oid)
            del buf


ADAPTERS = {
    "plasma": PlasmaAdapter,
    "shm": ShmAdapter,
    "shoal": ShoalAdapter,
    "shoal-each": ShoalEachAdapter,
}


def check(buffers, req):
    """Outside timing: every object is there, has the right size and bytes."""
    assert len(buffers) == len(req["ids"]), "wrong number of buffers"
    head, tail = bytes.fromhex(req["head"]), bytes.fromhex(req["tail"])
    for buf in buffers:
        assert buf is not None, "object missing"
        view = memoryview(buf).cast("B")
        assert view.nbytes == req["size"], f"size {view.nbytes} != {req['size']}"
        assert view[: len(head)] == head and view[-len(tail) :] == tail, "bad bytes"


def handle(adapter, state, req):
    op = req["op"]
    if op == "put":
        raw = [os.urandom(ID_BYTES) for _ in range(req["count"])]
        ids = [adapter.make_id(r) for r in raw]
        src = payload(req["size"])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        put_s, _ = timed(adapter.put, ids, src)
        put_minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        if req.get("ballast"):
            # Untimed, never got: the same memory traffic before a small get as before a large one.
            ballast = [adapter.make_id(os.urandom(ID_BYTES))]
            adapter.put(ballast, payload(req["ballast"]))
            ids = ids + ballast
        state["live"] = ids
        return {
            "put_s": put_s,
            "put_minflt": put_minflt,
            "ids": [r.hex() for r in raw],
            "head": src[:16].tobytes().hex(),
            "tail": src[-16:].tobytes().hex(),
        }
    if op == "get":
        ids = [adapter.make_id(bytes.fromhex(h)) for h in req["ids"]]
        get_s, buffers = timed(adapter.get, ids)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        read_s, found = timed(read_all, buffers)
        read_minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert found == 0, "reader stopped early"
        check(buffers, req)
        del buffers
        adapter.release()
        return {"get_s": get_s, "read_s": read_s, "read_minflt": read_minflt}
    if op == "delete":
        adapter.delete(state.pop("live", []))
        return {}
    raise ValueError(f"unknown op {op!r}")


def main():
    store, socket = sys.argv[1:3]
    out = os.fdopen(os.dup(1), "w", buffering=1)  # JSON replies only
    os.dup2(2, 1)  # anything a library prints goes to stderr

    def reply(obj):
        out.write(json.dumps(obj) + "\n")

    try:
        adapter = ADAPTERS[store](socket)
    except ImportError as e:
        reply({"unavailable": f"{type(e).__name__}: {e}"})
        return
    reply({"ready": True, "version": adapter.version})
    gc.disable()  # no collector pauses inside timed sections
    state = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            reply(handle(adapter, state, req))
        except Exception:  # noqa: BLE001 - any failure goes back to the orchestrator
            reply({"error": traceback.format_exc()})


if __name__ == "__main__":
    main()
