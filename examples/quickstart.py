"""shoal quick start: an embedded local store, Arrow tables in and out, no copies.

Starts (or joins) the per-user embedded store, puts Arrow tables and numpy arrays,
reads them back from this process and from a second process, and shows that the
data never moved: the columns returned live inside the store's shared memory.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import shoal

ROWS = 2_000_000


def in_region(client: shoal.Client, address: int) -> bool:
    return client.region_address <= address < client.region_address + client.region_size


def main() -> None:
    client = shoal.connect()
    stats = client.stats()
    print(f"store: {client.socket}  capacity {stats['capacity'] / 2**30:.2f} GiB")

    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "id": pa.array(np.arange(ROWS, dtype=np.int64)),
            "price": pa.array(rng.random(ROWS) * 100),
            "venue": pa.array(rng.choice(["XNAS", "XNYS", "BATS"], ROWS)).dictionary_encode(),
            "note": pa.array([None if i % 7 else f"row {i}" for i in range(ROWS)], pa.string()),
        }
    )
    size = table.nbytes

    started = time.perf_counter()
    oid = client.put(table)
    put_s = time.perf_counter() - started
    print(f"put   {ROWS:,} rows ({size / 2**20:.1f} MiB) as {oid.hex()[:12]}…  {put_s * 1e3:7.2f} ms")

    started = time.perf_counter()
    back = client.get(oid)
    get_s = time.perf_counter() - started
    address = back.column("price").chunk(0).buffers()[1].address
    print(f"get   same process             {get_s * 1e3:7.3f} ms  zero-copy: {in_region(client, address)}")
    assert back.equals(table)

    mean = pc.mean(back["price"]).as_py()
    counts = pc.value_counts(back["venue"].combine_chunks().dictionary_decode())
    print(f"query mean(price) = {mean:.4f}; venues = {counts.to_pylist()}")

    code = f"""
import time, shoal
c = shoal.connect({client.socket!r})
t0 = time.perf_counter(); t = c.get(shoal.ObjectID.from_hex({oid.hex()!r})); dt = time.perf_counter() - t0
a = t.column("price").chunk(0).buffers()[1].address
print(f"{{dt*1e3:.3f}} {{t.num_rows}} {{c.region_address <= a < c.region_address + c.region_size}}")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    ms, rows, zero_copy = out.stdout.split()
    print(f"get   second process           {float(ms):7.3f} ms  {int(rows):,} rows, zero-copy: {zero_copy}")

    ids = [shoal.ObjectID.from_random() for _ in range(1000)]
    payloads = [np.full(1000, i % 256, np.uint8) for i in range(1000)]
    started = time.perf_counter()
    client.put_batch(ids, payloads)
    batch_s = time.perf_counter() - started
    started = time.perf_counter()
    buffers = client.get_buffers(ids)
    getb_s = time.perf_counter() - started
    assert all(bytes(b)[:1] == bytes([i % 256]) for i, b in enumerate(buffers))
    per_put, per_get = batch_s * 1e6 / 1000, getb_s * 1e6 / 1000
    print(f"batch 1000 × 1 kB put {per_put:6.2f} µs/object, get {per_get:6.2f} µs/object")

    array = client.create_array(shoal.ObjectID.from_random(), (1000, 1000), np.float32)
    array[:] = 1.5  # written in place, in store memory
    print(
        f"array built in place: {array.nbytes / 2**20:.1f} MiB, zero-copy: "
        f"{in_region(client, array.__array_interface__['data'][0])}"
    )

    del back, buffers, array
    client.delete([oid, *ids])
    print(f"done: {client.stats()['objects']} objects left (the unsealed array is aborted on exit)")
    client.close()


if __name__ == "__main__":
    main()
