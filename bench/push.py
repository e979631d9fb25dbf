"""Network-mode push beside the pull: `put(value, node=k)` to a node reached over the network
against a get that pulls an object of the same size from it.

    python bench/push.py --out bench/results/push.md      # 1 GiB, 5 rounds

Starts a 2-node emulated cluster with `--modes network` (neither node maps the other's
memory), and one client of each node in this process. Every round (the order of the two
alternates):
  push  the client of node 0 creates the object on node 1 (`create(..., node=1)`: node 1
        allocates it, a staging buffer here takes the writes), copies the payload into its
        buffer (the one local write) and seals it: the push over node 1's bulk data channel
        (sendfile here, read into the object there, 4 ranges in parallel) and the forwarded
        seal. Each phase is timed; `put` is their sum, what `put(value, node=1)` costs.
  pull  the client of node 1 puts the payload in its own memory (untimed); the client of
        node 0 times its first `get_buffer` of it: Acquire at node 1, create, the pull over
        the same channel, seal of the copy.
Both objects are checked byte for byte (untimed) and deleted before the next round.
docs/cluster.md, "Remote allocation over the network".
"""

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from cluster import checkout, cluster_up, machine_busy  # noqa: E402
from table1 import GiB, fmt, log, machine, table  # noqa: E402

import shoal  # noqa: E402
from shoal.testing import wait_for  # noqa: E402

MiB = 2**20


def push_round(writer, owner, src):
    """Times create / write / seal of an object on node 1, from node 0's client."""
    oid = shoal.ObjectID.from_random()
    t0 = time.perf_counter()
    buffer = writer.create(oid, src.nbytes, node=1)
    t1 = time.perf_counter()
    np.frombuffer(buffer, np.uint8)[:] = src
    t2 = time.perf_counter()
    writer.seal(oid, release=True)
    t3 = time.perf_counter()
    del buffer
    got = owner.get_buffer(oid)
    assert np.array_equal(np.frombuffer(got, np.uint8), src), "pushed bytes differ"
    del got
    owner.delete(oid)
    return {"create": t1 - t0, "write": t2 - t1, "seal": t3 - t2, "put": t3 - t0}


def pull_round(reader, owner, src):
    """Times node 0's first get of an object node 1 holds (the pull)."""
    oid = owner.put(src)
    t0 = time.perf_counter()
    got = reader.get_buffer(oid)
    t1 = time.perf_counter()
    assert np.array_equal(np.frombuffer(got, np.uint8), src), "pulled bytes differ"
    del got
    owner.delete(oid)
    wait_for(lambda: not reader.contains(oid), timeout=30, message="the pulled copy dropped")
    return {"get": t1 - t0}


def report(run):
    size = run["size"]
    gib = size / GiB
    rows = []
    best = {}
    for key, label in [
        ("pull.get", "pull: first get on node 0 of node 1's object"),
        ("push.seal", "push: the seal (bytes over the data channel, then Seal)"),
        ("push.put", "put(node=1): create + write + seal"),
        ("push.write", "of which the write into the staging buffer"),
        ("push.create", "of which the create (Allocate at node 1, staging buffer)"),
    ]:
        times = run["samples"][key]
        best[key] = (min(times), statistics.median(times))
        rows.append(
            [
                label,
                f"{fmt(min(times) * 1e3)} / {fmt(statistics.median(times) * 1e3)}",
                f"{fmt(gib / min(times))} / {fmt(gib / statistics.median(times))}",
            ]
        )
    pull = best["pull.get"]
    ratio = [
        ("push (seal) / pull", best["push.seal"]),
        ("put(node=1) / pull", best["push.put"]),
    ]
    lines = [
        "# Network-mode push beside the pull",
        "",
        f"Generated {run['when']} by `python bench/push.py {' '.join(run['argv'])}`.",
        "",
        f"Machine: {run['machine']['cpu']}, nproc {run['machine']['nproc']}, "
        f"{run['machine']['memory_gib']} GiB RAM, {run['machine']['kernel']}. "
        f"Load average (1 min) {run['load_before']:.2f} before the run, {run['load_after']:.2f} after; "
        f"the machine was busy {run['busy_share'] * 100:.0f} % of its CPU time during the "
        f"{run['seconds']:.0f} s run (this run's processes included).",
        "",
        f"shoal ({run['checkout']}): 2 nodes emulated on this host (`python -m shoal cluster "
        f"up --nodes 2 --modes network`), {run['capacity']} each; objects of {size / MiB:.0f} MiB, "
        f"{run['rounds']} rounds after {run['warmup']} discarded, push and pull alternating in order. "
        "Cells are best / median.",
        "",
        *table("", ["ms", "GiB/s"], rows),
        "",
        "Ratios of bandwidth (push over pull; best / median):",
        "",
        *table(
            "",
            ["ratio"],
            [[name, f"{fmt(pull[0] / t[0])} / {fmt(pull[1] / t[1])}"] for name, t in ratio],
        ),
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(BENCH, "results", "push.md"))
    args = parser.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    size = args.size_mib * MiB
    capacity = f"{args.size_mib * 3 // 2 + 64}MiB"  # one object of each kind at a time, and room
    directory = tempfile.mkdtemp(prefix="shoal-push-")
    errlog = open(os.path.join(directory, "cli.log"), "w")
    load_before, busy_before, started = os.getloadavg()[0], machine_busy(), time.monotonic()
    cluster = cluster_up(directory, errlog, nodes=2, modes="network", capacity=capacity, tiers=False)
    samples = {k: [] for k in ["pull.get", "push.seal", "push.put", "push.write", "push.create"]}
    try:
        writer = cluster.client(0)
        owner = cluster.client(1)
        src = np.random.default_rng(38).integers(0, 256, size, dtype=np.uint8)
        for r in range(args.warmup + args.rounds):
            order = [push_round, pull_round] if r % 2 == 0 else [pull_round, push_round]
            results = {}
            for fn in order:
                kind = fn.__name__.split("_")[0]
                results.update({f"{kind}.{k}": v for k, v in fn(writer, owner, src).items()})
            if r >= args.warmup:
                for k, v in results.items():
                    samples[k].append(v)
            log(f"round {r}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in sorted(results.items())))
    finally:
        cluster.down(check=False)
        errlog.close()
        shutil.rmtree(directory, ignore_errors=True)
    seconds = time.monotonic() - started
    cores = os.cpu_count()
    run = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "argv": sys.argv[1:],
        "machine": machine(),
        "checkout": checkout(),
        "size": size,
        "capacity": capacity,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "samples": samples,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "busy_share": (machine_busy() - busy_before) / (seconds * cores),
        "seconds": seconds,
    }
    text = report(run)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
