"""The native-API side of bench/fuse/fio_matrix.py: fio's I/O pattern through the Python API.

    python bench/fuse/native.py SOCKET write|read seq|rand BLOCK PROCS SIZE

Each of PROCS processes owns one object of SIZE bytes (as fio's jobs own one file each).
write: create the object, copy one BLOCK-sized source block to every block offset (in order,
or in a random permutation), seal. read: the object is put first (not timed), then get it and
copy every block out into a private buffer. Prints JSON: aggregate MiB/s (bytes over the span
from the first start to the last end) and per-block copy latency p50/p99 in µs.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time

import numpy as np

import shoal


def worker(socket: str, rw: str, pattern: str, bs: int, size: int, start, out) -> None:
    client = shoal.Client(socket)
    blocks = size // bs
    order = np.arange(blocks)
    if pattern == "rand":
        np.random.default_rng(blocks).shuffle(order)
    src = np.frombuffer(np.random.default_rng(1).bytes(bs), dtype=np.uint8)
    lat = np.empty(blocks, dtype=np.int64)
    oid = shoal.ObjectID.from_random()
    if rw == "read":
        client.put(np.zeros(size, dtype=np.uint8).tobytes(), oid)
    start.wait()
    t0 = time.perf_counter()
    if rw == "write":
        view = np.frombuffer(client.create(oid, size), dtype=np.uint8)
        for i, b in enumerate(order):
            t = time.perf_counter_ns()
            view[b * bs : (b + 1) * bs] = src
            lat[i] = time.perf_counter_ns() - t
        del view
        client.seal(oid)
    else:
        dst = np.empty(bs, dtype=np.uint8)
        view = np.frombuffer(client.get_buffer(oid), dtype=np.uint8)
        for i, b in enumerate(order):
            t = time.perf_counter_ns()
            dst[:] = view[b * bs : (b + 1) * bs]
            lat[i] = time.perf_counter_ns() - t
        del view
    t1 = time.perf_counter()
    client.delete(oid)
    out.put((t0, t1, blocks * bs, lat.tolist()))


def main() -> None:
    socket, rw, pattern = sys.argv[1:4]
    bs, procs, size = (int(v) for v in sys.argv[4:7])
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    args = (socket, rw, pattern, bs, size, start, out)
    workers = [ctx.Process(target=worker, args=args) for _ in range(procs)]
    for w in workers:
        w.start()
    results = [out.get(timeout=300) for _ in workers]
    for w in workers:
        w.join()
    span = max(r[1] for r in results) - min(r[0] for r in results)
    lat = np.concatenate([np.asarray(r[3]) for r in results]) / 1000
    print(
        json.dumps(
            {
                "mibs": sum(r[2] for r in results) / span / (1 << 20),
                "p50_us": float(np.percentile(lat, 50)),
                "p99_us": float(np.percentile(lat, 99)),
            }
        )
    )


if __name__ == "__main__":
    main()
