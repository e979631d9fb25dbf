"""The Ray actors of bench/ray/: a producer that makes a table and a consumer that gets it,
each on shoal's path and on Ray's own. Ray workers import this module by name (the
drivers put bench/ray/ on their PYTHONPATH).

The table is `COLUMNS` int64 columns; column i holds `arange(rows) + seed * 1000 + i`, so
a consumer checks what it got from a sample without the producer's copy."""

import gc
import os
import pickle
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

import shoal.ray

COLUMNS = 4
SCHEMA = pa.schema([(f"c{i}", pa.int64()) for i in range(COLUMNS)])
SAMPLE_STEP = 2**20 // 8  # the touch: one value a MiB of each column
IDLE_S = 0.05  # B's idle time before each of the gets and floors it times after the first
TINY = np.arange(4)  # the object of the floors' bare gets


def anonymous_bytes(pid="self"):
    """The process's anonymous memory (its heap and private mappings; not the store's
    or plasma's shared pages, which an RSS would count once mapped)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous line in smaps_rollup")


def fill(column, seed, i):
    column[:] = np.arange(len(column), dtype=np.int64)
    column += seed * 1000 + i


def expected_sample(rows, seed):
    idx = np.arange(0, rows, SAMPLE_STEP)
    return int(sum((idx + seed * 1000 + i).sum() for i in range(COLUMNS)))


def touch(table):
    """One value a MiB of every column, summed: the pages a reader of the whole table would
    reach, without the time of reading all of it."""
    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            total += int(chunk.to_numpy(zero_copy_only=True)[::SAMPLE_STEP].sum())
    return total


def buffer_addresses(table):
    return [chunk.buffers()[1].address for column in table.columns for chunk in column.chunks]


@ray.remote(num_cpus=0)
class Producer:
    def where(self):
        return {
            "pid": os.getpid(),
            "ray_node": ray.get_runtime_context().get_node_id(),
            "shoal_node": shoal.ray.store.client().node,
        }

    def build_shoal(self, rows, seed):
        """Builds the table in place in the store (`create_table`), then shares it: the
        producer writes each value once, where readers read it."""
        client = shoal.ray.store.client()
        anon = anonymous_bytes()
        t0 = time.perf_counter()
        with client.create_table(SCHEMA, rows) as builder:
            written = []
            for i, name in enumerate(SCHEMA.names):
                column = builder[name]
                fill(column, seed, i)
                written.append(column.ctypes.data - client.region_address)
            oid = builder.id
        ref = shoal.ray.share(oid)
        return {
            "ref": ref,
            "written_offsets": written,
            "build_s": time.perf_counter() - t0,
            "anon_growth": anonymous_bytes() - anon,
        }

    def build_ray(self, rows, seed):
        """Ray's own path: the table in this worker's heap, `ray.put` copies it into plasma.
        Returns the ref inside a list (so the caller gets the ref, not the value), the put's
        time, and whether plasma's bytes are a copy: the value a get returns here lies at
        other addresses than the heap table, with the same contents."""
        anon = anonymous_bytes()
        t0 = time.perf_counter()
        columns = []
        for i in range(COLUMNS):
            column = np.empty(rows, np.int64)
            fill(column, seed, i)
            columns.append(column)
        table = pa.table(columns, schema=SCHEMA)
        t1 = time.perf_counter()
        heap_peak = anonymous_bytes() - anon
        ref = ray.put(table)
        t2 = time.perf_counter()
        stored = ray.get(ref)
        heap, plasma = buffer_addresses(table), buffer_addresses(stored)
        copied = not set(heap) & set(plasma) and stored.equals(table)
        del table, columns, stored
        gc.collect()
        return {
            "ref": [ref],
            "build_s": t1 - t0,
            "put_s": t2 - t1,
            "copies": int(copied),
            "anon_peak": heap_peak,
            "anon_growth": anonymous_bytes() - anon,
        }

    def anonymous(self):
        return anonymous_bytes()


def idle():
    """B between two actor calls: asleep, its caches left to whatever else runs."""
    time.sleep(IDLE_S)


def timed(call):
    idle()
    s = time.perf_counter()
    call()
    return time.perf_counter() - s


def after_idle(kind, fetch, key):
    """What the first get is made of and what it is measured against, each after the same
    idle time as before the first get: the same get again (the object no longer new to
    B), a bare get of a tiny object (the path's floor), a tiny numpy call (the machine's
    floor: no store, no Ray), and pyarrow building a table of the same schema and batches
    from an IPC stream in B's own memory (the least any reader pays for this table then).
    On shoal's path also shoal.ray.get's steps one by one and one
    round trip to the daemon (`client.stats()`)."""
    if kind == "shoal":
        client = shoal.ray.store.client()
        tiny = client.put(TINY)
        bare = lambda: client.get_buffer(tiny, 0)  # noqa: E731
    else:
        tiny = ray.put(TINY)
        bare = lambda: ray.get(tiny)  # noqa: E731
    local = ipc_stream(fetch(key))
    result = {
        "again_idle_s": timed(lambda: fetch(key)),
        "tiny_get_idle_s": timed(bare),
        "numpy_idle_s": timed(lambda: np.arange(10).sum()),
        "arrow_idle_s": timed(lambda: pa.ipc.open_stream(local).read_all()),
        "arrow_cached_idle_s": timed(lambda: decode_cached(local)),
    }
    if kind == "shoal":
        result["steps_idle_s"] = shoal_get_steps(pickle.dumps(key))
        result["idle_rpc_s"] = timed(client.stats)
        client.delete(tiny)
    return result


def ipc_stream(table):
    """An IPC stream of `table`'s schema with as many record batches, one row each: the
    same decoding work as the whole table's (its buffers are not copied by a read), as
    bytes in this process's own memory."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch.slice(0, 1))
    return sink.getvalue()


def decode_cached(stream):
    """A table from `stream` with its schema decoded before (shoal's own decode, `_ipc`)."""
    from shoal import _ipc

    schema, batches = _ipc.batches(stream)
    return pa.Table.from_batches(batches, schema=schema)


def shoal_get_steps(pickled_ref):
    """`shoal.ray.get` of an Arrow table (shoal.ray.ref._value, shoal._codec.decode), step by
    step after the idle time: the seconds of each step, in order. The ref's unpickling is
    Ray's, before the actor's method runs."""
    from shoal import _ipc, layout

    idle()
    t = [time.perf_counter()]
    ref = pickle.loads(pickled_ref)
    t.append(time.perf_counter())
    client = shoal.ray.store.client()
    t.append(time.perf_counter())
    buffer = client.get_buffer(ref.id, 0)
    t.append(time.perf_counter())
    metadata = bytes(buffer.metadata())
    assert not layout.is_layout(metadata)
    t.append(time.perf_counter())
    schema, batches = _ipc.batches(pa.py_buffer(buffer))
    t.append(time.perf_counter())
    pa.Table.from_batches(batches, schema=schema)
    t.append(time.perf_counter())
    return dict(zip(GET_STEPS, (b - a for a, b in zip(t, t[1:], strict=False)), strict=True))


#: shoal_get_steps's steps.
GET_STEPS = ("ref unpickle", "client lookup", "get (fast path)", "metadata", "IPC decode", "table build")


def derive(batch):
    """The Ray Data benchmark's map_batches step: reads both columns of a block."""
    return pa.table({"z": pc.add(batch["x"], batch["y"])})


@ray.remote(num_cpus=0)
class Consumer:
    def __init__(self):
        self.held = None

    def where(self):
        return {
            "pid": os.getpid(),
            "ray_node": ray.get_runtime_context().get_node_id(),
            "shoal_node": shoal.ray.store.client().node,
        }

    def anonymous(self):
        return anonymous_bytes()

    def get(self, kind, ref, reps, rows, seed):
        """Times the first get of `ref` and the touch of its pages, then
        `reps` later gets; holds the first value until `release`. On shoal's path, also the
        offsets of the column buffers in this process's mapping of the store."""
        expect = expected_sample(rows, seed)
        fetch = shoal.ray.get if kind == "shoal" else ray.get
        key = ref if kind == "shoal" else ref[0]
        t0 = time.perf_counter()
        value = fetch(key)
        t1 = time.perf_counter()
        got = touch(value)
        t2 = time.perf_counter()
        assert got == expect and value.num_rows == rows, "the table read differs from the one made"
        later = []
        for _ in range(reps):
            s = time.perf_counter()
            again = fetch(key)
            later.append(time.perf_counter() - s)
            del again
        result = {"first_get_s": t1 - t0, "touch_s": t2 - t1, "later_get_s": later}
        result.update(after_idle(kind, fetch, key))
        if kind == "shoal":
            client = shoal.ray.store.client()
            result["offsets"] = [a - client.region_address for a in buffer_addresses(value)]
            result["in_region"] = all(0 <= o < client.region_size for o in result["offsets"])
        self.held = value
        return result

    def release(self):
        self.held = None
        gc.collect()
