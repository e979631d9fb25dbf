"""Cluster benchmarks: remote-mapped objects beside local ones, in one run.

    python bench/cluster.py --reps 5 --out bench/results/cluster.md

Starts an emulated 3-node cluster (`python -m shoal cluster up`). This process
writes every object through a client of node 0. Two reader processes run
this file with `--reader SOCKET`: the *local* reader is a client of node 0,
the *remote* reader a client of node 1, which gets node 0's objects as
read-only views of node 0's region (mapped by path, no byte crosses a
socket). Both readers see the same objects in the same physical pages, so a
difference between them is the cost of reaching an object through another
node. Measured:
  get      one batched get of 1000 × 1 kB: the first get after the put (the
           remote node still has to look the owners up) and warm gets of the
           same ids; Plasma (pyarrow 11, bench/.venv-plasma) beside it;
  read     one sequential pass over 10 × 100 MB (numpy sum of uint64 views),
           and the same reader's limit on plain memory (thesis: 6.5 GiB/s
           local, 5.75 GiB/s remote);
  share    descriptor share (get + slice) against a full copy of the slice,
           for slices of a 1.61 GiB int64/int8/uint16 table (thesis Fig. 5.1);
  threads  a 1 GiB uint64 object read by 1, 2 and 4 threads (Fig. 5.2);
  stride   one 8-byte word of every k-th 64 B line of it (Fig. 5.3).
The cluster is stopped (`cluster down`) however the run ends. See
bench/README.md, "Cluster benchmark".
"""

import argparse
import concurrent.futures
import datetime
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from adapters import payload, timed
from table1 import (
    GiB,
    Worker,
    best_bandwidth,
    fmt,
    log,
    machine,
    shared_pages,
    socket_round_trip,
    start_plasma,
    stop,
    table,
)

MiB = 2**20
NODES = 3
GET_COUNT, GET_SIZE = 1000, 1_000  # 1000 × 1 kB
WARM_GETS = 5  # warm gets of the same ids after each first get
LINGER_S = 1.0  # `cluster up`'s default linger: how long a node keeps a loan
LAPSE_S = LINGER_S + 0.4  # past the linger and the next heartbeat tick (200 ms)
GET_FACTOR = 4  # get repetitions: GET_FACTOR × --reps (each takes a few ms)
READ_COUNT, READ_SIZE = 10, 100_000_000  # 10 × 100 MB
TABLE_ROWS = 150 * 1024 * 1024  # thesis Fig. 5.1: 157,286,400 rows
ROW_BYTES = 8 + 1 + 2  # int64, int8, uint16
SLICES = [0.01, 0.05, 0.10, 0.25, 0.50, 1.00]
SCAN_BYTES = GiB  # the thread and stride scans' object
THREADS = [1, 2, 4]
LINE = 64  # bytes per cache line on x86
STRIDES = [1, 2, 4, 8, 16, 64]  # every k-th line
SCAN_FACTOR = 3  # samples per thread count or stride: SCAN_FACTOR × --reps
LIMIT_BYTES = 100_000_000
TIMEOUT_MS = 10_000  # for gets and for creates that wait for memory
READERS = ("local", "remote")  # node 0 (the owner) and node 1


# ---------------------------------------------------------------- readers


def sum_all(buffers):
    """One sequential pass over every byte: numpy sums each buffer as uint64
    words. On this machine that runs at memory speed (about glibc memchr's,
    table1's reader). Returns the total mod 2^64, to check what was read."""
    total = 0
    for buf in buffers:
        total += int(np.frombuffer(buf, np.uint64).sum())
    return total % 2**64


def sum_threads(words, pool, n):
    """The same pass split into n contiguous slices summed by n threads
    (numpy releases the GIL inside the sum)."""
    return sum(int(s) for s in pool.map(np.sum, np.array_split(words, n))) % 2**64


def sum_lines(words, k):
    """Reads one 8-byte word of every k-th 64 B line: (sum mod 2^64, lines)."""
    picked = words[:: LINE // 8 * k]
    return int(picked.sum()) % 2**64, picked.size


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Reader:
    """A client of one node, answering the orchestrator's requests."""

    def __init__(self, socket):
        import pyarrow as pa

        import shoal

        self.pa, self.shoal = pa, shoal
        self.client = shoal.Client(socket)
        self.pools = {}

    def ids(self, hexes):
        return [self.shoal.ObjectID.from_hex(h) for h in hexes]

    def settle(self):
        """A round trip after buffers were dropped: the queued release goes out
        and the daemon handles it before the next (timed) request."""
        self.client.contains(self.shoal.ObjectID(bytes(20)))

    def get(self, req):
        """First batched get of freshly put ids, then warm gets of the same ids;
        each timed until the last buffer is back."""
        ids = self.ids(req["ids"])
        times = []
        for _ in range(1 + req["warm"]):
            elapsed, buffers = timed(self.client.get_buffers, ids, TIMEOUT_MS)
            times.append(elapsed)
            head = bytes.fromhex(req["head"])
            assert all(len(b) == req["size"] for b in buffers), "wrong size"
            assert all(np.frombuffer(b, np.uint8)[:16].tobytes() == head for b in buffers)
            del buffers
            self.settle()
        out = {"first_s": times[0], "warm_s": times[1:]}
        if req.get("lapse"):
            # Once the node's loans lapsed: the owner is known, one Acquire.
            time.sleep(req["lapse"])
            elapsed, buffers = timed(self.client.get_buffers, ids, TIMEOUT_MS)
            assert all(len(b) == req["size"] for b in buffers), "wrong size"
            del buffers
            self.settle()
            out["lapsed_s"] = elapsed
        return out

    def read(self, req):
        """One pass over all the objects (got untimed before), with its faults."""
        buffers = self.client.get_buffers(self.ids(req["ids"]), TIMEOUT_MS)
        before = minflt()
        elapsed, total = timed(sum_all, buffers)
        faults = minflt() - before
        assert total == req["expect"], "read the wrong bytes"
        del buffers
        self.settle()
        return {"read_s": elapsed, "minflt": faults}

    def share(self, req):
        """From request to a pyarrow slice of the table's first `rows` rows:
        descriptor share (get + slice), or with `copy` the slice's columns
        copied into fresh local memory (get + slice + copy)."""
        pa, rows = self.pa, req["rows"]
        t0 = time.perf_counter()
        part = self.client.get(self.shoal.ObjectID.from_hex(req["id"])).slice(0, rows)
        if req["copy"]:
            columns = [pa.array(c.chunk(0).to_numpy().copy()) for c in part.columns]
            part = pa.table(columns, names=part.column_names)
        elapsed = time.perf_counter() - t0
        assert part.num_rows == rows and part.column(0)[rows - 1].as_py() == rows - 1
        del part
        self.settle()
        return {"s": elapsed}

    def words(self, hexid):
        return np.frombuffer(
            self.client.get_buffer(self.shoal.ObjectID.from_hex(hexid), TIMEOUT_MS), np.uint64
        )

    def threads(self, req):
        """One pass over the object by req["threads"] threads."""
        n = req["threads"]
        if n not in self.pools:
            self.pools[n] = concurrent.futures.ThreadPoolExecutor(n)
        words = self.words(req["id"])
        elapsed, total = timed(sum_threads, words, self.pools[n], n)
        assert total == req["expect"], "read the wrong bytes"
        del words
        self.settle()
        return {"read_s": elapsed}

    def stride(self, req):
        """Every k-th line of the object, one word each."""
        words = self.words(req["id"])
        elapsed, (total, lines) = timed(sum_lines, words, req["k"])
        assert total == req["expect"], "read the wrong bytes"
        del words
        self.settle()
        return {"read_s": elapsed, "lines": lines}


def serve_worker(make):
    """Worker loop, JSON lines as in adapters.py: `make()` builds the worker (after stdout
    is kept for the replies, so anything it prints goes to stderr); each request
    `{"op": name, ...}` calls its method `name`."""
    import traceback

    out = os.fdopen(os.dup(1), "w", buffering=1)  # JSON replies only
    os.dup2(2, 1)
    worker = make()
    out.write(json.dumps({"ready": True, "version": worker.shoal.__version__}) + "\n")
    gc.disable()  # no collector pauses inside timed sections
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            reply = getattr(worker, req["op"])(req)
        except Exception:  # noqa: BLE001 - any failure goes back to the orchestrator
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")


def reader_main(socket):
    serve_worker(lambda: Reader(socket))


class ReaderProcess(Worker):
    """`python SCRIPT --reader SOCKET` (this file unless another benchmark's), spoken to
    like table1's workers."""

    def __init__(self, socket, errlog, script=__file__):
        cmd = [sys.executable, os.path.abspath(script), "--reader", socket]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, text=True, env=shoal_env()
        )
        self.hello = self._read()


# ---------------------------------------------------------------- cluster


def shoal_env():
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SHOAL_SOCKET", None)
    return env


def cluster_up(directory, errlog, **options):
    """An emulated cluster (`python -m shoal cluster up`, shoal.testing.Cluster) in
    `directory`, with the burst buffer and backing store `cluster up` gives each node unless
    `tiers=False`; other options as Cluster's; the `cluster` commands and their output go to
    errlog. A cluster that does not come up is taken down (whatever it started) before the
    error is raised. Stop it with `down(check=False)`."""
    from shoal.testing import Cluster, shoal_command

    options.setdefault("tiers", True)
    try:
        return Cluster(Path(directory), timeout=300, log=errlog, **options)
    except BaseException:
        shoal_command("cluster", "down", "--dir", str(directory), timeout=300, log=errlog)
        raise


def checkout():
    """The commit of this checkout (the installed shoal is built from it), and
    whether tracked files other than the results differ from it."""
    git = ["git", "-C", BENCH]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            [
                *git,
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":/",
                ":(exclude,top)bench/results",
            ],
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "checkout unknown"
    return f"checkout {head.stdout.strip()}" + (", with uncommitted changes" if dirty.stdout.strip() else "")


def plan():
    """Table rows and node capacity: the thesis's full table if /dev/shm and
    memory hold 3 nodes of it plus the reader's copy, else halved until they
    do. Returns (rows, capacity bytes, note)."""
    st = os.statvfs("/dev/shm")
    shm_free = st.f_bavail * st.f_frsize
    with open("/proc/meminfo") as f:
        mem_free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    rows = TABLE_ROWS
    while True:
        # every node as big as the table (or the 1 GiB scan object), rounded up
        need = max(rows * ROW_BYTES, SCAN_BYTES, READ_COUNT * READ_SIZE) + 64 * MiB
        capacity = -(-need // (256 * MiB)) * 256 * MiB
        room = shm_free >= NODES * capacity and mem_free >= NODES * capacity + rows * ROW_BYTES + GiB
        if room or rows <= TABLE_ROWS // 64:
            break
        rows //= 2
    note = (
        f"/dev/shm had {shm_free / GiB:.1f} GiB free and {mem_free / GiB:.1f} GiB of memory was available;"
        f" {NODES} nodes × {capacity / GiB:.2f} GiB"
    )
    if rows != TABLE_ROWS:
        note += f"; the table was scaled down to {rows:,} rows (thesis: {TABLE_ROWS:,})"
    return rows, capacity, note


class Cluster:
    """The emulated cluster, this process's writer client and the two readers."""

    def __init__(self, directory, capacity, errlog):
        self.directory, self.errlog = directory, errlog
        self.readers = {}
        self.writer = None
        self.cluster = cluster_up(directory, errlog, nodes=NODES, capacity=f"{capacity // MiB}MiB")
        try:
            self.capacity = self.check_capacity(capacity)
        except BaseException:
            self.cluster.down(check=False)
            raise

    def connect(self):
        """The writer (a client of node 0 in this process) and the readers."""
        import shoal

        self.shoal = shoal
        self.writer = self.cluster.client(0)
        self.readers["local"] = ReaderProcess(self.socket(0), self.errlog)
        self.readers["remote"] = ReaderProcess(self.socket(1), self.errlog)

    def check_capacity(self, capacity):
        """Every node's store capacity, which must be what was asked for
        (builds before 799ca79 kept `serve`'s 1 GiB default)."""
        import shoal

        for node in range(NODES):
            with shoal.Client(self.socket(node)) as client:
                got = client.capacity
            if got < capacity:
                raise RuntimeError(f"node {node} has capacity {got} B, asked for {capacity} B")
        return capacity

    def socket(self, node):
        return self.cluster.socket(node)

    def daemon_cpu(self):
        return daemons_cpu(self.directory, NODES)

    def down(self):
        """Stops the readers, the writer and the cluster; returns the daemons' CPU seconds."""
        for reader in self.readers.values():
            reader.close()
        used = self.daemon_cpu()
        self.cluster.down(check=False)
        return used


# ---------------------------------------------------------------- CPU use

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy():
    """CPU seconds the whole machine has been busy (all cores, /proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def daemons_cpu(directory, nodes):
    """CPU seconds the daemons of an emulated cluster (`cluster up --dir directory`) used so
    far; they are not our children. A daemon already gone counts nothing."""
    total = 0.0
    for node in range(nodes):
        try:
            with open(os.path.join(directory, f"n{node}.pid")) as f:
                total += process_cpu(int(f.read()))
        except (OSError, ValueError):
            pass
    return total


def save_run(run, out, raw_name, plot, report):
    """Draws the plots (`plot(run, out_dir)` returns their file names; none without
    matplotlib), writes the raw samples beside the report, then the report."""
    out_dir = os.path.dirname(os.path.abspath(out))
    try:
        run["plots"] = plot(run, out_dir)
    except ImportError as e:
        run["plots"], run["plots_note"] = [], f"{e}; pip install matplotlib"
    with open(os.path.join(out_dir, raw_name), "w") as f:
        json.dump(run, f, indent=1, default=str)
    with open(out, "w") as f:
        f.write(report(run))
    log(f"wrote {out} in {run['seconds']:.0f} s")


def process_cpu(pid):
    """CPU seconds (user + system) of one live process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu():
    """CPU seconds of this process and its waited-for children (readers,
    Plasma, the `shoal` commands)."""
    return sum(
        r.ru_utime + r.ru_stime
        for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


# ---------------------------------------------------------------- limits


def measure_limits(n=10):
    """The readers' numpy reader on plain memory (a warm 100 MB numpy array,
    and a warm shared 4 kB-page mapping like a region), memcpy into fresh
    numpy memory (what a full copy costs at best), socket round trip."""
    src = payload(LIMIT_BYTES)
    shared = shared_pages(LIMIT_BYTES)
    shared[:] = src

    def read(_, buf):
        return sum_all([buf])

    def copy_fresh(_, buf):
        return buf.copy()

    return {
        "seq_read_gibs": best_bandwidth(read, None, src, n),
        "seq_read_shared_gibs": best_bandwidth(read, None, shared, n),
        "copy_fresh_gibs": best_bandwidth(copy_fresh, None, src, 5),
        "socket_rtt": socket_round_trip(),
    }


def best_limits(runs):
    best = {k: max(r[k] for r in runs) for k in runs[0] if k != "socket_rtt"}
    best["socket_rtt"] = min((r["socket_rtt"] for r in runs), key=lambda r: r["median_us"])
    return best


# ---------------------------------------------------------------- measurements


def bench_get(cl, args):
    """1. Batched get of 1000 × 1 kB put on node 0, by both readers."""
    src = payload(GET_SIZE)
    out = {r: {"first_s": [], "warm_s": [], "lapsed_s": []} for r in READERS}
    for rep in range(args.warmup + GET_FACTOR * args.reps):
        ids = [cl.shoal.ObjectID.from_random() for _ in range(GET_COUNT)]
        cl.writer.put_batch(ids, [src] * GET_COUNT)
        req = {"op": "get", "ids": [i.hex() for i in ids], "size": GET_SIZE, "warm": WARM_GETS}
        # The first --reps repetitions also time a get after the loans lapsed.
        lapse = LAPSE_S if args.warmup <= rep < args.warmup + args.reps else 0
        for name in ("remote", "local"):  # remote first: its owner cache is cold
            got = cl.readers[name].call(**req, lapse=lapse, head=src[:16].tobytes().hex())
            if rep >= args.warmup:
                out[name]["first_s"].append(got["first_s"])
                out[name]["warm_s"] += got["warm_s"]
                if "lapsed_s" in got:
                    out[name]["lapsed_s"].append(got["lapsed_s"])
        cl.writer.delete(ids)
    return out


def bench_get_plasma(args, tmp, errlog):
    """1. The same get on Plasma (local only): first get after the put, then
    warm gets, through adapters.py in the Plasma venv."""
    setup = subprocess.run(
        ["bash", os.path.join(BENCH, "setup_plasma.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    python = setup.stdout.strip().splitlines()[-1]
    sock = os.path.join(tmp, "plasma.sock")
    server = start_plasma(sock, errlog, python)
    workers = []
    try:
        workers = [Worker(python, "plasma", sock, errlog) for _ in range(2)]
        writer, getter = workers
        if "unavailable" in writer.hello:
            return {"unavailable": writer.hello["unavailable"]}
        out = {"first_s": [], "warm_s": [], "version": writer.hello["version"]}
        for rep in range(args.warmup + GET_FACTOR * args.reps):
            put = writer.call(op="put", count=GET_COUNT, size=GET_SIZE)
            req = {k: put[k] for k in ("ids", "head", "tail")}
            gets = [getter.call(op="get", size=GET_SIZE, **req)["get_s"] for _ in range(1 + WARM_GETS)]
            writer.call(op="delete")
            if rep >= args.warmup:
                out["first_s"].append(gets[0])
                out["warm_s"] += gets[1:]
        return out
    finally:
        for w in workers:
            w.close()
        stop(server)


def bench_read(cl, args):
    """2. One pass over 10 × 100 MB on node 0 by both readers; the first pass
    of each reader is kept apart (with its page faults, if the reader's
    mapping was not populated when it was made)."""
    src = payload(READ_SIZE)
    ids = [cl.shoal.ObjectID.from_random() for _ in range(READ_COUNT)]
    cl.writer.put_batch(ids, [src] * READ_COUNT, timeout_ms=TIMEOUT_MS)
    req = {"op": "read", "ids": [i.hex() for i in ids], "expect": sum_all([src] * READ_COUNT)}
    out = {r: {"read_s": [], "minflt": []} for r in READERS}
    for rep in range(1 + args.reps):  # the first pass is the warm-up
        for name in READERS:
            got = cl.readers[name].call(**req)
            if rep == 0:
                out[name]["first"] = got
            else:
                out[name]["read_s"].append(got["read_s"])
                out[name]["minflt"].append(got["minflt"])
    cl.writer.delete(ids)
    return out


def build_table(cl, rows):
    """The thesis's 3-column table (int64, int8, uint16) written in place on
    node 0 with create_table; column x is 0..rows-1 so slices can be checked."""
    import pyarrow as pa

    schema = pa.schema([("x", pa.int64()), ("y", pa.int8()), ("z", pa.uint16())])
    with cl.writer.create_table(schema, rows, timeout_ms=TIMEOUT_MS) as builder:
        x = builder["x"]
        for start in range(0, rows, 1 << 24):
            stop_ = min(rows, start + (1 << 24))
            x[start:stop_] = np.arange(start, stop_, dtype=np.int64)
        builder["y"][:] = 7
        builder["z"][:] = 65535
        del x
        nbytes = builder.nbytes
    oid = builder.id
    del builder
    return oid, nbytes


def bench_share(cl, args, rows):
    """3. Descriptor share (both readers) and full copy (remote reader) of
    slices of the table. Each repetition visits every slice, so noise falls
    on all of them alike; all shares run before the copies, whose freed
    gigabytes would otherwise disturb the next share. The first get of the
    table is kept apart."""
    oid, nbytes = build_table(cl, rows)
    base = {"op": "share", "id": oid.hex()}
    first = {n: cl.readers[n].call(**base, rows=rows, copy=False)["s"] for n in ("remote", "local")}
    out = {"nbytes": nbytes, "rows": rows, "first_s": first, "slices": []}
    parts = [max(1, round(rows * frac)) for frac in SLICES]
    samples = {key: [[] for _ in SLICES] for key in ("share_remote", "share_local", "copy_remote")}
    runs = [("share_remote", "remote", False), ("share_local", "local", False)]
    for keys in (runs, [("copy_remote", "remote", True)]):
        for rep in range(args.warmup + args.reps):
            for i, part in enumerate(parts):
                for key, reader, copy in keys:
                    got = cl.readers[reader].call(**base, rows=part, copy=copy)
                    if rep >= args.warmup:
                        samples[key][i].append(got["s"])
    for i, frac in enumerate(SLICES):
        s = {"fraction": frac, "rows": parts[i], **{key: v[i] for key, v in samples.items()}}
        out["slices"].append(s)
        log(f"  share {frac:4.0%}: {med_ms(s['share_remote'])} ms, copy {med_ms(s['copy_remote'])} ms")
    cl.writer.delete([oid])
    return out


def med_ms(samples):
    return fmt(statistics.median(samples) * 1e3)


def build_scan_object(cl):
    """A SCAN_BYTES uint64 array 0, 1, 2, ... on node 0, written in place;
    also returns the strided sums the readers must find."""
    n = SCAN_BYTES // 8
    oid = cl.shoal.ObjectID.from_random()
    words = cl.writer.create_array(oid, n, np.uint64, timeout_ms=TIMEOUT_MS)
    for start in range(0, n, 1 << 24):
        words[start : start + (1 << 24)] = np.arange(start, min(n, start + (1 << 24)), dtype=np.uint64)
    cl.writer.seal(oid)
    expect = {k: sum_lines(words, k)[0] for k in STRIDES}
    del words
    return oid, n * (n - 1) // 2 % 2**64, expect


def bench_scans(cl, args):
    """4. Threads and 5. strides over one 1 GiB object on node 0, both
    readers, and the threaded reader on a warm plain shared mapping of the
    same size in this process (the machine's limit). Passes take tens of ms,
    so each setting gets SCAN_FACTOR × reps samples; every repetition visits
    every setting, so noise falls on all of them alike."""
    plain = shared_pages(SCAN_BYTES).view(np.uint64)
    plain[:] = 1
    pools = {n: concurrent.futures.ThreadPoolExecutor(n) for n in THREADS}
    oid, total, by_stride = build_scan_object(cl)
    base = {"id": oid.hex()}
    threads = {r: {n: [] for n in THREADS} for r in ("plain", *READERS)}
    strides = {r: {k: [] for k in STRIDES} for r in READERS}
    lines = {}
    for rep in range(args.warmup + SCAN_FACTOR * args.reps):
        for n in THREADS:
            got = {"plain": timed(sum_threads, plain, pools[n], n)[0]}
            for name in READERS:
                got[name] = cl.readers[name].call(op="threads", threads=n, expect=total, **base)["read_s"]
            if rep >= args.warmup:
                for name, value in got.items():
                    threads[name][n].append(value)
        for k in STRIDES:
            for name in READERS:
                got = cl.readers[name].call(op="stride", k=k, expect=by_stride[k], **base)
                lines[k] = got["lines"]
                if rep >= args.warmup:
                    strides[name][k].append(got["read_s"])
    for n in THREADS:
        log(f"  threads {n}: " + ", ".join(f"{r} {gibs(SCAN_BYTES, threads[r][n])}" for r in threads))
    for pool in pools.values():
        pool.shutdown()
    cl.writer.delete([oid])
    return {"threads": threads, "strides": strides, "lines": lines}


def gibs(nbytes, samples):
    return f"{nbytes / statistics.median(samples) / GiB:.2f} GiB/s"


def run_cluster(args, rows, capacity, results, errlog):
    """Every cluster measurement; the cluster is stopped whatever happens."""
    directory = tempfile.mkdtemp(prefix="shoal-bench-", dir="/tmp")
    cl = None
    try:
        log(f"cluster up ({NODES} × {capacity / GiB:.2f} GiB) ...")
        cl = Cluster(directory, capacity, errlog)
        cl.connect()
        results["version"] = f"shoal {cl.shoal.__version__}"
        log("1. get 1000 × 1 kB ...")
        results["get"] = bench_get(cl, args)
        log("2. read 10 × 100 MB ...")
        results["read"] = bench_read(cl, args)
        results["limit_runs"].append(measure_limits())
        log(f"3. descriptor share vs copy, {rows:,} rows ...")
        results["share"] = bench_share(cl, args, rows)
        log("4./5. thread and stride scans ...")
        results["scans"] = bench_scans(cl, args)
    finally:
        if cl is not None:
            results["daemon_cpu_s"] = cl.down()
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------- report


def pair(samples, f):
    """(best, median) of f(sample); f maps a time to a value, where the best
    is the shortest time."""
    return f(min(samples)), f(statistics.median(samples))


def cell(p):
    return f"{fmt(p[0])} / {fmt(p[1])}"


def ratio(a, b):
    return (a[0] / b[0], a[1] / b[1])


def us_per_obj(t):
    return t * 1e6 / GET_COUNT


def get_section(res):
    """Rows of the get table and the pairs the targets need."""
    rows, pairs = [], {}
    stores = [("remote", "shoal, remote-mapped (node 1 reader)"), ("local", "shoal, local (node 0 reader)")]
    for key, _ in stores:
        for kind in ("first_s", "warm_s", "lapsed_s"):
            if res["get"][key].get(kind):
                pairs[key, kind] = pair(res["get"][key][kind], us_per_obj)
    plasma = res.get("plasma", {})
    if "first_s" in plasma:
        for kind in ("first_s", "warm_s"):
            pairs["plasma", kind] = pair(plasma[kind], us_per_obj)
        stores.append(("plasma", "Plasma (pyarrow 11), local"))

    def lapsed(num, den=None):
        if (num, "lapsed_s") not in pairs or (den and (den, "lapsed_s") not in pairs):
            return "–"
        return cell(ratio(pairs[num, "lapsed_s"], pairs[den, "lapsed_s"]) if den else pairs[num, "lapsed_s"])

    for key, label in stores:
        first, warm = pairs[key, "first_s"], pairs[key, "warm_s"]
        batch = (warm[0] * GET_COUNT / 1e3, warm[1] * GET_COUNT / 1e3)
        rows.append([label, cell(first), cell(warm), lapsed(key), cell(batch)])
    for num, den in [("remote", "local"), ("remote", "plasma"), ("local", "plasma")]:
        if (den, "warm_s") in pairs:
            rows.append(
                [
                    f"ratio {num} / {den}",
                    cell(ratio(pairs[num, "first_s"], pairs[den, "first_s"])),
                    cell(ratio(pairs[num, "warm_s"], pairs[den, "warm_s"])),
                    lapsed(num, den),
                    "",
                ]
            )
    return rows, pairs


def read_section(res, lim):
    total = READ_COUNT * READ_SIZE
    rd = res["read"]
    bw = {r: pair(rd[r]["read_s"], lambda t: total / t / GiB) for r in READERS}
    rows = []
    for key, label in [
        ("local", "shoal, local (node 0 reader)"),
        ("remote", "shoal, remote-mapped (node 1 reader)"),
    ]:
        first = rd[key]["first"]
        rows.append(
            [
                label,
                cell(bw[key]),
                f"{max(rd[key]['minflt']):.0f}",
                f"{fmt(total / first['read_s'] / GiB)} ({first['minflt']:,} faults)",
            ]
        )
    limit = lim["seq_read_shared_gibs"]
    rows.append(["ratio remote / local", cell(ratio(bw["remote"], bw["local"])), "", ""])
    rows.append(
        [
            "ratio remote / sequential-read limit (shared mapping)",
            cell(ratio(bw["remote"], (limit, limit))),
            "",
            "",
        ]
    )
    rows.append(
        [
            "ratio local / sequential-read limit (shared mapping)",
            cell(ratio(bw["local"], (limit, limit))),
            "",
            "",
        ]
    )
    return rows, bw


def share_section(res):
    sh = res["share"]
    rows = []
    for s in sh["slices"]:
        ms = {k: pair(s[k], lambda t: t * 1e3) for k in ("share_remote", "share_local", "copy_remote")}
        nbytes = s["rows"] * ROW_BYTES
        copy_gibs = pair(s["copy_remote"], lambda t, n=nbytes: n / t / GiB)
        rows.append(
            [
                f"{s['fraction']:.0%}",
                f"{s['rows']:,}",
                f"{nbytes / MiB:,.1f}",
                cell(ms["share_remote"]),
                cell(ms["share_local"]),
                cell(ms["copy_remote"]),
                cell(copy_gibs),
                cell(ratio(ms["copy_remote"], ms["share_remote"])),
            ]
        )
    return rows


def scan_sections(res):
    sc = res["scans"]
    thread_rows = []
    for n in THREADS:
        bw = {r: pair(sc["threads"][r][n], lambda t: SCAN_BYTES / t / GiB) for r in ("plain", *READERS)}
        thread_rows.append(
            [
                str(n),
                cell(bw["plain"]),
                cell(bw["local"]),
                cell(bw["remote"]),
                cell(ratio(bw["remote"], bw["local"])),
                cell(ratio(bw["remote"], bw["plain"])),
            ]
        )
    stride_rows = []
    for k in STRIDES:
        lines = sc["lines"][k]
        ns = {r: pair(sc["strides"][r][k], lambda t, n=lines: t * 1e9 / n) for r in READERS}
        bw = {r: pair(sc["strides"][r][k], lambda t, n=lines: n * LINE / t / GiB) for r in READERS}
        stride_rows.append(
            [
                f"{k} ({k * LINE} B)",
                f"{lines:,}",
                cell(ns["local"]),
                cell(ns["remote"]),
                cell(bw["local"]),
                cell(bw["remote"]),
                cell(ratio(ns["remote"], ns["local"])),
            ]
        )
    return thread_rows, stride_rows


def judge(value, goal):
    op, bound = goal.split()
    return value <= float(bound) if op == "≤" else value >= float(bound)


def _lapsed_ratio(pairs):
    if ("remote", "lapsed_s") in pairs and ("local", "lapsed_s") in pairs:
        return pairs["remote", "lapsed_s"][1] / pairs["local", "lapsed_s"][1]
    return None


def targets(pairs, read_bw, res):
    """The issue's targets, judged on medians, plus the first-get lines."""
    sh = res["share"]["slices"]
    share_medians = [statistics.median(s["share_remote"]) * 1e3 for s in sh]
    warm, first = (pairs["remote", k][1] for k in ("warm_s", "first_s"))
    checks = [
        ("get 1000 × 1 kB, warm: remote / local time", warm / pairs["local", "warm_s"][1], "≤ 2"),
        ("get 1000 × 1 kB, warm: remote µs/object", warm, "≤ 1.2"),
        ("get 1000 × 1 kB, first get: remote / local time", first / pairs["local", "first_s"][1], "≤ 2"),
        ("get 1000 × 1 kB, first get: remote µs/object", first, "≤ 1.2"),
        *(
            [("get 1000 × 1 kB, after the linger: remote / local time", lapsed, "≤ 2")]
            if (lapsed := _lapsed_ratio(pairs)) is not None
            else []
        ),
        ("read 10 × 100 MB: remote / local bandwidth", read_bw["remote"][1] / read_bw["local"][1], "≥ 0.95"),
        ("descriptor share, slowest slice (ms)", max(share_medians), "≤ 1"),
        ("descriptor share, slowest / fastest slice", max(share_medians) / min(share_medians), "≤ 1.5"),
    ]
    lines = ["| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    for label, value, goal in checks:
        lines.append(f"| {label} | {fmt(value)} | {goal} | {'yes' if judge(value, goal) else '**no**'} |")
    return lines


GET_HEADS = [
    "first get (µs/object)",
    "warm get (µs/object)",
    "after the linger (µs/object)",
    "warm get, batch (ms)",
]
SHARE_HEADS = [
    "rows",
    "MiB",
    "share, remote (ms)",
    "share, local (ms)",
    "full copy, remote (ms)",
    "full copy (GiB/s)",
    "copy / share",
]
THREAD_HEADS = [
    "plain (GiB/s)",
    "local (GiB/s)",
    "remote (GiB/s)",
    "remote / local",
    "remote / plain",
]
STRIDE_HEADS = [
    "lines",
    "local (ns/line)",
    "remote (ns/line)",
    "local (GiB/s)",
    "remote (GiB/s)",
    "remote / local time",
]


def limit_rows(lim):
    rtt = lim["socket_rtt"]
    return [
        [
            "sequential read, numpy sum of uint64, warm 100 MB numpy array",
            f"{lim['seq_read_gibs']:.2f} GiB/s",
        ],
        [
            "sequential read, same reader, warm shared mapping (4 kB pages, like a region)",
            f"{lim['seq_read_shared_gibs']:.2f} GiB/s",
        ],
        ["copy of 100 MB into a fresh numpy array (`ndarray.copy`)", f"{lim['copy_fresh_gibs']:.2f} GiB/s"],
        [
            "Unix socket round trip, 1 byte, 2 processes on 2 cores",
            f"{rtt['median_us']:.1f} µs median ({rtt['min_us']:.1f} µs min)",
        ],
    ]


INTRO = (
    "Cells are `best / median` of {reps} repetitions (after {warmup} discarded warm-up, unless said): "
    "the shortest time or highest bandwidth, then the median; ratios are taken from the best and from the "
    "median values. 1 kB = 1000 B, 1 MB = 10^6 B, MiB = 2^20 B, GiB = 2^30 B. All objects live on node 0 "
    "and are written by the orchestrator; the *local* reader is a separate process connected to node 0, "
    "the *remote* reader one connected to node 1, which maps node 0's region read-only (mapped mode; "
    "no byte crosses a socket). Both read the same physical pages. Definitions: bench/README.md, "
    '"Cluster benchmark".'
)


def report(run):
    res, lim, mach = run["results"], run["limits"], run["machine"]
    get_rows, pairs = get_section(res)
    read_rows, read_bw = read_section(res, lim)
    thread_rows, stride_rows = scan_sections(res)
    sh = res["share"]
    scan_samples = (
        f"Cells: best / median of {SCAN_FACTOR * run['reps']} samples (passes are short), every "
        "repetition visiting each setting in turn."
    )
    plasma = res.get("plasma", {})
    why = plasma.get("unavailable") or plasma.get("failed")
    plasma_note = plasma.get("version") or f"not measured ({why})"
    lines = [
        "# Cluster benchmarks: remote-mapped vs local",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        f"Machine: {mach['cpu']}, nproc {mach['nproc']}, {mach['memory_gib']} GiB RAM, {mach['kernel']};"
        f" Python {mach['python']}, numpy {mach['numpy']}, pyarrow {run['pyarrow']}. Other processes"
        f" share the {mach['nproc']} cores and move the numbers: load average (1 min) before the run"
        f" {run['load']:.2f}; during the {run['seconds']:.0f} s run they used"
        f" {run['others_cpu_s']:.1f} CPU-seconds"
        f" ({run['others_cpu_s'] / run['seconds'] / mach['nproc']:.0%} of the machine).",
        "",
        f"Cluster: {res['version']} ({run['checkout']}), {NODES} nodes emulated on this host"
        " (`python -m shoal cluster up`),"
        f" {run['capacity'] / GiB:.2f} GiB per node, mapped mode, coherent. {run['plan_note']}."
        f" Plasma: {plasma_note}.",
        "",
        INTRO.format(reps=run["reps"], warmup=run["warmup"]),
        "",
        f"## Machine limits (best of {len(res['limit_runs'])} measurements in this run)",
        "",
        *table("limit", ["value"], limit_rows(lim)),
        "",
        "## 1. Batched get, 1000 × 1 kB",
        "",
        "One `get_buffers` of all 1000 ids, timed in the reader until the last buffer is back. "
        f"*First get*: the first get of freshly put ids ({GET_FACTOR * run['reps']} samples, one "
        "put each; the remote reader goes first). Both readers use the fast path "
        "(docs/fast-path.md): the local one reads node 0's index; the remote one reads node 0's "
        'index too ("Gets of other nodes\' objects": its tables there were handed over at its '
        "first get of the run), so neither asks a daemon. "
        f"*Warm*: {WARM_GETS} more gets of the same ids after each first get "
        f"({WARM_GETS * GET_FACTOR * run['reps']} samples). *After the linger*: one more get "
        f"{LAPSE_S:g} s later ({run['reps']} samples), past the {LINGER_S:g} s a node keeps a loan "
        "(the Acquire path's references; the fast path takes none, so this measures an idle "
        "reader's first get). Plasma runs the first and warm gets.",
        "",
        *table("store", GET_HEADS, get_rows),
        "",
        "## 2. Read throughput, 10 × 100 MB",
        "",
        "One sequential pass over the ten objects (numpy sum of uint64 views), after an untimed get. "
        "The first pass of each reader is shown apart (it is the warm-up), with its minor page "
        "faults: a reader whose mapping of the region was not populated when it was made (the "
        "remote reader maps node 0's region by path on its first get) takes them there.",
        "",
        *table("reader", ["read (GiB/s)", "minor faults (max)", "first pass (GiB/s)"], read_rows),
        "",
        f"## 3. Descriptor share vs full copy (thesis Fig. 5.1), {sh['rows']:,}-row table",
        "",
        f"A table of int64, int8 and uint16 columns ({sh['rows']:,} rows, a "
        f"{sh['nbytes'] / GiB:.2f} GiB object) built in place on node 0 with `create_table`. Per slice "
        "of its first rows: *descriptor share* = `client.get(id).slice(0, rows)` in the reader, from "
        "the request to the pyarrow slice (the data is not touched); *full copy* = the same, then "
        "every column of the slice copied into fresh numpy memory of the remote reader and wrapped "
        "as a pyarrow table (a memory copy: the floor for any full transfer). First get of the "
        f"table (owner lookup, not in the rows): remote {fmt(sh['first_s']['remote'] * 1e3)} ms, "
        f"local {fmt(sh['first_s']['local'] * 1e3)} ms. Every repetition visits each slice in turn; "
        "all shares are timed before the copies.",
        "",
        *table("slice", SHARE_HEADS, share_section(res)),
        "",
        f"## 4. Threads (thesis Fig. 5.2), {SCAN_BYTES / GiB:.0f} GiB uint64 object",
        "",
        "One pass over the object split into n contiguous slices, summed by n threads (numpy "
        f"releases the GIL). The machine has {mach['nproc']} cores, so 4 threads share them. "
        "*Plain*: the same reader on a warm 1 GiB shared mapping (4 kB pages) in the orchestrator, "
        f"the machine's limit. {scan_samples}",
        "",
        *table("threads", THREAD_HEADS, thread_rows),
        "",
        f"## 5. Stride (thesis Fig. 5.3), {SCAN_BYTES / GiB:.0f} GiB uint64 object",
        "",
        "One 8-byte word of every k-th 64 B line, one thread (numpy sum over a strided view). "
        f"GiB/s counts the touched lines, 64 B each. {scan_samples}",
        "",
        *table("every k-th line", STRIDE_HEADS, stride_rows),
        "",
        "## Targets (judged on medians)",
        "",
        *targets(pairs, read_bw, res),
        "",
        "Not measured here: Table 5.5 (creating a table in another node's memory), which is "
        "bench/table55.py, and the pull of an object over the network (network mode), which is "
        "bench/network.py.",
    ]
    if run["plots"]:
        lines += ["", "Plots: " + ", ".join(f"[{p}]({p})" for p in run["plots"]) + "."]
    else:
        lines += ["", f"Plots: not drawn ({run['plots_note']})."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- plots


def plot(run, out_dir):
    """PNGs for sections 3, 4 and 5; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = run["results"]
    names = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        names.append(name)

    sh = res["share"]["slices"]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [s["fraction"] * 100 for s in sh]
    for key, label in [
        ("share_remote", "descriptor share, remote"),
        ("share_local", "descriptor share, local"),
        ("copy_remote", "full copy, remote"),
    ]:
        ax.plot(x, [statistics.median(s[key]) * 1e3 for s in sh], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="slice of the table (%)", ylabel="time, median (ms)")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_title(f"Descriptor share vs full copy ({res['share']['nbytes'] / GiB:.2f} GiB table)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    save(fig, "cluster-share.png")

    sc = res["scans"]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.27
    series = [("plain mapping" if r == "plain" else r, sc["threads"][r]) for r in ("plain", *READERS)]
    for i, (label, samples) in enumerate(series):
        vals = [SCAN_BYTES / statistics.median(samples[n]) / GiB for n in THREADS]
        ax.bar([j + (i - 1) * width for j in range(len(THREADS))], vals, width, label=label)
    ax.set_xticks(range(len(THREADS)), [str(n) for n in THREADS])
    ax.set(xlabel="threads", ylabel="read, median (GiB/s)", title="Read throughput by thread count")
    ax.legend()
    save(fig, "cluster-threads.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in READERS:
        ns = [statistics.median(sc["strides"][r][k]) * 1e9 / sc["lines"][k] for k in STRIDES]
        ax.plot([k * LINE for k in STRIDES], ns, marker="o", label=r)
    ax.set(xscale="log", xlabel="stride (bytes)", ylabel="ns per touched line, median")
    ax.set_xticks([k * LINE for k in STRIDES], [str(k * LINE) for k in STRIDES])
    ax.set_title("Strided read, one word per touched 64 B line")
    ax.legend()
    ax.grid(True, alpha=0.3)
    save(fig, "cluster-stride.png")
    return names


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="discarded repetitions per measurement")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "cluster.md"))
    ap.add_argument("--no-plasma", action="store_true", help="skip the Plasma get row")
    ap.add_argument("--reader", metavar="SOCKET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    if args.reader:
        return reader_main(args.reader)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    import pyarrow

    rows, capacity, plan_note = plan()
    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python bench/cluster.py " + " ".join(sys.argv[1:]),
        "reps": args.reps,
        "warmup": args.warmup,
        "machine": machine(),
        "pyarrow": pyarrow.__version__,
        "checkout": checkout(),
        "capacity": capacity,
        "plan_note": plan_note,
    }
    results = {"limit_runs": []}
    started, busy, own = time.monotonic(), machine_busy(), own_cpu()
    run["load"] = os.getloadavg()[0]
    with open(os.path.join(out_dir, "raw-cluster.log"), "w") as errlog:
        log("machine limits ...")
        results["limit_runs"].append(measure_limits())
        if not args.no_plasma:
            log("1. get 1000 × 1 kB on Plasma ...")
            with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
                try:
                    results["plasma"] = bench_get_plasma(args, tmp, errlog)
                except Exception as e:  # noqa: BLE001 - Plasma missing must not stop the run
                    log(f"plasma: FAILED: {e}")
                    results["plasma"] = {"failed": str(e).strip().splitlines()[-1]}
        else:
            results["plasma"] = {"unavailable": "--no-plasma"}
        run_cluster(args, rows, capacity, results, errlog)
        results["limit_runs"].append(measure_limits())
    run["results"], run["limits"] = results, best_limits(results["limit_runs"])
    run["seconds"] = time.monotonic() - started
    ours = own_cpu() - own + results.get("daemon_cpu_s", 0)
    run["others_cpu_s"] = max(0.0, machine_busy() - busy - ours)
    save_run(run, args.out, "raw-cluster.json", plot, report)


if __name__ == "__main__":
    main()
