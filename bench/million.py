"""1,000,000 small objects in one store: daemon memory per object and get latency.

Starts `shoal serve` as its own process (shoal.testing.Daemon), measures its anonymous
RSS (heap: the object table, allocator and policy; the region is shared memory and not
counted) before and after storing N objects, and the latency of a batched get of 1000 ids
with 1000 vs N objects in the store. Run: python bench/million.py [--objects 1000000] [--size 100]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import shoal
from shoal.testing import Daemon


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def get_latency(client: shoal.Client, ids: list[shoal.ObjectID], reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        sample = random.sample(ids, 1000)
        started = time.perf_counter()
        buffers = client.get_buffers(sample, timeout_ms=0)
        times.append(time.perf_counter() - started)
        assert all(b is not None for b in buffers)
        del buffers
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    with tempfile.TemporaryDirectory() as tmp:
        capacity = max(256 << 20, args.objects * (args.size + 64) * 2)
        # Prefaulted, as `serve` is by default; its output goes to a log in tmp.
        daemon = Daemon(Path(tmp), str(capacity), prefault=True, connect=False, timeout=20)
        try:
            client = shoal.Client(daemon.socket)
            payload = bytes(args.size)
            small = [shoal.ObjectID.from_random() for _ in range(1000)]
            client.put_batch(small, [payload] * len(small))
            small_latency = get_latency(client, small)
            before = rss_anon_kib(daemon.pid)
            ids = list(small)
            started = time.perf_counter()
            chunk = 20_000
            while len(ids) < args.objects:
                batch = [shoal.ObjectID.from_random() for _ in range(min(chunk, args.objects - len(ids)))]
                client.put_batch(batch, [payload] * len(batch))
                ids.extend(batch)
            fill_s = time.perf_counter() - started
            after = rss_anon_kib(daemon.pid)
            stats = client.stats()
            big_latency = get_latency(client, ids)
            per_object = (after - before) * 1024 / (len(ids) - len(small))
            print(f"objects stored            {stats['objects']:,} × {args.size} B (fill {fill_s:.1f} s)")
            print(f"daemon heap per object    {per_object:.1f} B (RssAnon {before} → {after} KiB)")
            print(f"get 1000 ids, 1k objects  {small_latency * 1e6:.0f} µs")
            print(
                f"get 1000 ids, {len(ids) // 1000}k objects {big_latency * 1e6:.0f} µs "
                f"({big_latency / small_latency:.2f}× the 1k case)"
            )
            client.close()
        finally:
            daemon.teardown(check=False, timeout=30)


if __name__ == "__main__":
    main()
