"""Elastic capacity (issue 11): DynIMS' mixed-workload experiment (seed 003), scaled to this machine.

    python bench/elastic/mixed.py --out bench/results/elastic.md
    python bench/elastic/mixed.py --policy lfu --configs static-small,dynamic --out bench/results/el-lfu.md
    python bench/elastic/mixed.py --compare bench/results/elastic.json bench/results/el-lfu.json

Two jobs share the node, as HPCC and Spark k-means do in the paper:

  compute  an HPCC-like job (this script with --compute-job, its own process): its
           resident memory rises in 1 GiB phases (64 MiB pieces, MAP_POPULATE) to
           --burst-peak-gib, holds, falls 2 GiB a phase to 0 and idles, over and
           over, while the data job runs. It only makes its memory resident (light
           CPU): on 2 shared cores the comparison is about the store, not about two
           jobs fighting for a core.
  data     a k-means-like job (this process): mini-batch k-means passes (Sculley
           2010: every table is read, every --stride-th point assigned to the
           nearest of k = 3 centroids, centroids updated) over --data-gib of Arrow
           tables held in shoal, for --duration-s. The tables are loaded once onto
           the burst buffer (durable), and every configuration's daemon starts on
           that burst buffer with none of them in memory: a cold pass (not counted)
           restores them; later passes find in memory what the store kept. The
           stride sets the job's compute per byte read, and with it how much the
           store's hit ratio matters: a full pass (stride 1) is ~0.6 s of numpy per
           64 MiB table here, where restoring it from the burst buffer is ~40 ms.

Configurations (each a fresh daemon started here with its region in /dev/shm and
the burst buffer on the repository's disk):

  static-small        --capacity --small-gib, with the compute job;
  static-large        --capacity --large-gib (holds all the data), no compute job:
                      the upper bound;
  static-large-after  the same again after the others (in the default list): the
                      machine's speed drifts between configurations run one after
                      the other (other tenants, the disk), so the targets use the
                      passes of both runs pooled, and the report shows the drift;
  static-large+burst  the same with the compute job: the experiment's memory
                      exceeds the node budget (OOM on a node of that size);
  dynamic             --capacity --large-gib --elastic with the compute job;
  dynamic-fast        the same with --elastic-shrink-gain 1;
  dynamic-ahead       the same with --elastic-shrink-gain 1 --elastic-feed-forward.

The "node" is the memory this experiment may use, --budget-gib above what the
machine used when the configuration started (other engineers build on it): the
controller's r_0 is set to (used at start + budget) / MemTotal, so the store
must give memory back while the compute job's phase and a full store do not fit.

Safety: the experiment never holds more than large + burst-peak + ~1 GiB, and it
checks MemAvailable before each configuration and before each of the compute job's
growth steps: a step that would leave less than --floor-gib available is not taken
(counted and reported as "stopped at the floor"); a configuration that would leave
less than --floor-gib is skipped. The compute job also runs under RLIMIT_AS.

Measured: time per pass (median of the counted passes), in-memory hit ratio
(1 - bytes restored from the burst buffer / bytes read), every shrink's reaction
(compute job: from the start of its growth step, and from the moment the node
crossed the threshold, until the node is first back within 32 MiB of it, read
every 5 ms by a thread beside the populating; and from the end of the populating
until the node is back within 32 MiB: settled), controller
CPU (over the run, and in a quiet stretch after it with no shrinks), memory over
time (PNG: capacity, store resident, compute job, free).
"""

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
MiB = 2**20
GiB = 2**30
OBJECT = 64 * MiB
POINTS = OBJECT // 8  # two float32 columns
BACK_SLACK = 32 * MiB  # "back at the threshold" tolerance, as in elastic-reaction.md
STEP = GiB  # the compute job's growth step
WATCH_EVERY = 0.005  # the compute job's watcher reads the node's use this often
TOUCH = 64 * MiB  # the compute job touches its step in pieces of this size
# The dynamic configurations and their control laws.
LAWS = {
    "dynamic": " (the paper's law)",
    "dynamic-fast": " (shrink gain 1)",
    "dynamic-ahead": " (shrink gain 1, feed-forward)",
}
TARGET_SPEEDUP, TARGET_UPPER, TARGET_REACTION_MS, TARGET_CPU = 3.8, 0.10, 200.0, 0.5


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def meminfo():
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            values[key] = int(rest.split()[0]) * 1024
    return values


def percpu_free():
    """Free pages on the kernel's per-CPU lists (capacity/percpu.rs: MemAvailable leaves them out)."""
    pages = 0
    with open("/proc/zoneinfo") as f:
        for line in f:
            line = line.strip()
            if line.startswith("count:"):
                pages += int(line.split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def node_used():
    """The node's memory in use as the controller's host source sees it."""
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"] - percpu_free(), m["MemTotal"], m["MemAvailable"]


def page_freeing_limit(region_dir="/dev/shm", size=GiB, reps=3):
    """The machine's own cost of giving shared memory back: CPU seconds per GiB to punch a hole
    over populated pages of a file in `region_dir` (where the regions live) mapped twice (the
    daemon's mapping and a client's), best of `reps`: what a shrink's PUNCH_HOLE costs the
    kernel, whoever asks (it frees each page and unmaps it from every mapping). With
    transparent huge pages off for shmem (/sys/kernel/mm/transparent_hugepage/shmem_enabled)
    every 4 KiB page goes one by one;
    a tmpfs mounted with huge=always frees 2 MiB pages (--region-dir)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    punch = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
    populate_read, populate_write = 22, 23  # MADV_POPULATE_READ / _WRITE (Linux 5.14)
    best = float("inf")
    fd, path = tempfile.mkstemp(prefix="shoal-punch-", dir=region_dir)
    try:
        os.unlink(path)
        os.ftruncate(fd, size)
        writer, reader = mmap.mmap(fd, size), mmap.mmap(fd, size)
        try:
            for _ in range(reps):
                writer.madvise(populate_write)
                reader.madvise(populate_read)
                started = time.thread_time()
                if libc.fallocate(fd, punch, ctypes.c_long(0), ctypes.c_long(size)) != 0:
                    raise OSError(ctypes.get_errno(), "fallocate(PUNCH_HOLE) on /dev/shm")
                best = min(best, (time.thread_time() - started) / (size / GiB))
        finally:
            writer.close()
            reader.close()
    finally:
        os.close(fd)
    return best


# -- the compute job ----------------------------------------------------------------------------


def compute_job(args):
    """HPCC-like phases; writes one JSON line per growth step (reaction) to --events."""
    import mmap

    cap = int((args.burst_peak_gib + 1) * GiB)
    resource.setrlimit(resource.RLIMIT_AS, (cap + 2 * GiB, cap + 2 * GiB))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    peak = int(args.burst_peak_gib * GiB)
    threshold = args.threshold_bytes
    held = []
    events = open(args.events, "a", buffering=1)

    def grow():
        _, _, available = node_used()
        if available - STEP < args.floor_gib * GiB:
            events.write(json.dumps({"kind": "floor", "t": time.time(), "available": available}) + "\n")
            return
        start = time.time()
        seen = {"crossed": None, "back_any": None}
        populating = threading.Event()
        populating.set()

        def watch():
            # Beside the populating (mmap releases the GIL): the first moment
            # the node is over the threshold, and the first moment after it
            # that it is back within BACK_SLACK, even while the step grows.
            while populating.is_set() and seen["back_any"] is None and not stop.is_set():
                used = node_used()[0]
                if seen["crossed"] is None and used > threshold:
                    seen["crossed"] = time.time()
                elif seen["crossed"] is not None and used <= threshold + BACK_SLACK:
                    seen["back_any"] = time.time()
                time.sleep(WATCH_EVERY)

        watcher = threading.Thread(target=watch, daemon=True) if threshold else None
        if watcher:
            watcher.start()
        piece = []
        for _ in range(STEP // TOUCH):
            # MAP_POPULATE faults the piece in within the call (resident at once,
            # ~0.4 s a GiB here, where a write per page took ~4 s under load).
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
            piece.append(mmap.mmap(-1, TOUCH, flags=flags))
        touched = time.time()
        populating.clear()
        if watcher:
            watcher.join()
        held.append(piece)
        crossed, back_any, back = seen["crossed"], seen["back_any"], None
        if threshold:
            if crossed is None and node_used()[0] > threshold:
                crossed = time.time()
            if crossed is not None:
                # Settled: back within BACK_SLACK once the step stopped growing.
                while time.time() - start < 10 and not stop.is_set():
                    if node_used()[0] <= threshold + BACK_SLACK:
                        back = time.time()
                        break
                    time.sleep(0.002)
        if crossed is not None and back_any is None:
            back_any = back
        event = {"kind": "grow", "start": start, "touched": touched, "crossed": crossed}
        events.write(json.dumps(event | {"back": back, "back_any": back_any}) + "\n")

    def free_to(level):
        while len(held) * STEP > level:
            for m in held.pop():
                m.close()

    if args.profile == "hpcc":
        # The seed's Fig. 1: HPCC holds well under half its peak for most of
        # its run and bursts to the peak in a small part of it. The burst
        # rises a step per phase, holds, and is freed at once (the test that
        # needed it ends).
        base = int(args.base_gib * GiB)
        while len(held) * STEP < base and not stop.is_set():
            grow()
        while not stop.is_set():
            stop.wait(args.idle_s)
            if not stop.is_set():
                events.write(json.dumps({"kind": "burst", "start": time.time()}) + "\n")
            while len(held) * STEP < peak and not stop.is_set():
                grow()
                stop.wait(args.phase_s)
            stop.wait(args.hold_s)
            free_to(base)
    else:
        while not stop.is_set():
            events.write(json.dumps({"kind": "burst", "start": time.time()}) + "\n")
            while len(held) * STEP < peak and not stop.is_set():
                grow()
                stop.wait(args.phase_s)
            stop.wait(args.hold_s)
            while held and not stop.is_set():
                free_to(max(0, (len(held) - 2) * STEP))
                stop.wait(args.phase_s)
            stop.wait(args.idle_s)
    events.close()


# -- the daemon ---------------------------------------------------------------------------------


class Store:
    """One configuration's store: a shoal daemon (shoal.testing.Daemon: `binary serve`, its
    socket in `work/name`, its output in `work/name.log`) with the experiment's options and
    its region at a path of ours, and what the experiment reads of it."""

    def __init__(
        self,
        binary,
        work,
        name,
        capacity,
        burst,
        elastic_threshold=None,
        shrink_gain=None,
        feed_forward=False,
        region_size=None,
        policy="lru",
        region_dir="/dev/shm",
        prefetch=None,
        urgent_ms=None,
        prefault=False,
    ):
        from shoal.testing import Daemon  # here: the compute job (this file) does not load shoal

        self.region = os.path.join(region_dir, f"shoal-mixed-{os.getpid()}-{name}")
        options = [
            "--region",
            self.region,
            "--burst",
            burst,
            "--durability",
            "local",
            "--policy",
            policy,
        ]
        if region_size:
            options += ["--region-size", str(region_size)]
        if elastic_threshold is not None:
            options += [
                "--elastic",
                "--elastic-source",
                "host",
                "--elastic-max-fraction",
                "1",
                "--elastic-threshold",
                f"{elastic_threshold:.6f}",
            ]
            if shrink_gain is not None:
                options += ["--elastic-shrink-gain", str(shrink_gain)]
            if feed_forward:
                options += ["--elastic-feed-forward"]
            if prefetch:
                options += ["--elastic-prefetch", prefetch]
            if urgent_ms is not None:
                options += ["--elastic-urgent-interval-ms", str(urgent_ms)]
        self.binary = binary
        # Without prefault, static stores fill as the cold pass restores into them; an
        # elastic one populates its region up to the target itself (and again each time
        # it grows back after a shrink).
        self.daemon = Daemon(
            Path(work) / name,
            str(capacity),
            options,
            connect=False,
            prefault=prefault,
            program=[binary],
            log=os.path.join(work, f"{name}.log"),
            timeout=30,
        )
        self.socket = self.daemon.socket

    def resident(self):
        """Bytes the region file holds in memory (tmpfs pages). The daemon unlinks the
        region's name once mapped: its file is found among the daemon's descriptors."""
        if getattr(self, "region_fd", None) is None:
            fds = f"/proc/{self.daemon.pid}/fd"
            for fd in os.listdir(fds):
                try:
                    if os.readlink(os.path.join(fds, fd)).startswith(self.region):
                        self.region_fd = os.path.join(fds, fd)
                        break
                except OSError:
                    continue
            else:
                return 0
        try:
            return os.stat(self.region_fd).st_blocks * 512
        except OSError:
            return 0

    def thread_cpu_s(self, comm):
        """CPU seconds of the daemon's threads named `comm` (as /proc shows it, 15 chars)."""
        total = 0
        task = f"/proc/{self.daemon.pid}/task"
        for tid in os.listdir(task):
            try:
                with open(f"{task}/{tid}/comm") as f:
                    if f.read().strip() != comm:
                        continue
                with open(f"{task}/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            except OSError:
                continue
        return total / os.sysconf("SC_CLK_TCK")

    def controller(self):
        out = subprocess.run(
            [self.binary, "stat", "--json", "--socket", self.socket],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return json.loads(out)["controller"]

    def trace(self):
        out = subprocess.run(
            [self.binary, "stat", "--trace", "--socket", self.socket],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = out.strip().splitlines()[1:]
        return [[float(x) for x in row.split(",")] for row in rows]

    def stop(self):
        self.daemon.teardown(check=False, timeout=30)
        if os.path.exists(self.region):
            os.unlink(self.region)


# -- the data job -------------------------------------------------------------------------------


def load(client, n_objects, seed=11):
    """n_objects Arrow tables of 2-d points around three centres, durable on the burst buffer."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-4.0, 6.0]], dtype=np.float32)
    ids = []
    for i in range(n_objects):
        which = rng.integers(0, 3, POINTS)
        pts = centres[which] + rng.standard_normal((POINTS, 2), dtype=np.float32)
        table = pa.table({"x": pts[:, 0].copy(), "y": pts[:, 1].copy()})
        ids.append(client.put(table, durability="local"))
        if i % 8 == 7:
            log(f"  loaded {i + 1}/{n_objects} tables")
    return ids


def kmeans_pass(client, ids, centroids, stride):
    """One mini-batch k-means pass (Sculley 2010): every table is read, and every
    `stride`-th point of it is assigned to its nearest centroid; returns the new centroids."""
    import numpy as np

    k = len(centroids)
    sums = np.zeros((k, 2))
    counts = np.zeros(k)
    for oid in ids:
        table = client.get(oid)
        x = table.column("x").chunk(0).to_numpy()[::stride]
        y = table.column("y").chunk(0).to_numpy()[::stride]
        dist = np.empty((k, len(x)), dtype=np.float32)
        for j, (cx, cy) in enumerate(centroids):
            dist[j] = np.square(x - np.float32(cx)) + np.square(y - np.float32(cy))
        nearest = dist.argmin(axis=0)
        for j in range(k):
            mask = nearest == j
            counts[j] += np.count_nonzero(mask)
            sums[j, 0] += float(x[mask].sum(dtype=np.float64))
            sums[j, 1] += float(y[mask].sum(dtype=np.float64))
        del table, x, y
    return [tuple(sums[j] / max(counts[j], 1)) for j in range(k)]


# -- one configuration --------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Memory over time every 100 ms: store capacity and resident bytes, compute job, free."""

    def __init__(self, daemon, client, t0):
        super().__init__(daemon=True)
        self.d, self.client, self.t0 = daemon, client, t0
        self.compute_pid = None
        self.rows = []
        self.stopping = threading.Event()

    def run(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self.stopping.is_set():
            used, total, available = node_used()
            stats = self.client.stats()
            rss = 0
            if self.compute_pid:
                try:
                    with open(f"/proc/{self.compute_pid}/statm") as f:
                        rss = int(f.read().split()[1]) * page
                except (FileNotFoundError, ProcessLookupError):
                    rss = 0
            self.rows.append(
                {
                    "t": time.time() - self.t0,
                    "capacity": stats["capacity"],
                    "used": stats["used"],
                    "resident": self.d.resident(),
                    "compute": rss,
                    "available": available,
                    "node_used": used,
                    "total": total,
                }
            )
            self.stopping.wait(0.1)


def run_config(
    args, name, capacity, with_burst, elastic, ids, burst_dir, work, shrink_gain=None, feed_forward=False
):
    import shoal

    used, total, available = node_used()
    need = capacity + (args.burst_peak_gib * GiB if with_burst else 0) + GiB
    if available - need < args.floor_gib * GiB:
        log(f"{name}: skipped, MemAvailable {available / GiB:.1f} GiB - {need / GiB:.1f} GiB < floor")
        return {"name": name, "skipped": f"MemAvailable {available / GiB:.1f} GiB at start"}
    threshold = int(used + args.budget_gib * GiB)
    r0 = threshold / total
    daemon = Store(
        args.shoal,
        work,
        name,
        capacity,
        burst_dir,
        elastic_threshold=r0 if elastic else None,
        shrink_gain=shrink_gain,
        feed_forward=feed_forward,
        policy=args.policy,
        region_dir=args.region_dir,
        prefetch=prefetch_size(args) if elastic else None,
        urgent_ms=args.urgent_interval_ms if elastic else None,
        prefault=elastic,
    )
    result = {"name": name, "capacity": capacity, "with_burst": with_burst, "elastic": elastic}
    result["data_bytes"] = len(ids) * OBJECT
    result["policy"] = args.policy
    result["prefetch"] = prefetch_size(args) if elastic else None
    result["node_used_at_start"] = used
    result["load_at_start"] = loadavg()
    result["threshold_bytes"] = threshold
    events_path = os.path.join(work, f"{name}.events")
    compute = None
    try:
        client = shoal.Client(daemon.socket)
        sampler_client = shoal.Client(daemon.socket)
        t0 = time.time()
        sampler = Sampler(daemon, sampler_client, t0)
        sampler.start()
        centroids = [(1.0, 1.0), (2.0, 2.0), (-1.0, 3.0)]
        # The first pass restores from the burst buffer (cold start, not counted).
        start = time.time()
        centroids = kmeans_pass(client, ids, centroids, args.stride)
        result["cold_pass_s"] = time.time() - start
        if with_burst:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--compute-job",
                "--events",
                events_path,
                "--burst-peak-gib",
                str(args.burst_peak_gib),
                "--floor-gib",
                str(args.floor_gib),
                "--profile",
                args.profile,
                "--base-gib",
                str(args.base_gib),
                "--phase-s",
                str(args.phase_s),
                "--hold-s",
                str(args.hold_s),
                "--idle-s",
                str(args.idle_s),
                "--threshold-bytes",
                str(threshold if elastic else 0),
            ]
            compute = subprocess.Popen(cmd)
            sampler.compute_pid = compute.pid
        controller_before = daemon.controller()
        populate_before = daemon.thread_cpu_s(POPULATE_THREAD)
        passes_start = time.time()
        passes = []
        i = 0
        while not window_over(args, passes_start, compute is not None, events_path):
            i += 1
            before = restored_bytes(client)
            start = time.time()
            centroids = kmeans_pass(client, ids, centroids, args.stride)
            took = time.time() - start
            restored = restored_bytes(client) - before
            hit = max(0.0, 1 - restored / (len(ids) * OBJECT))
            passes.append({"s": took, "hit": hit, "t_end": time.time() - t0})
            log(f"{name}: pass {i}: {took:.2f} s, hit ratio {hit:.2f}")
        run_end = time.time()
        if args.cycles and compute is not None:
            # Whole cycles: from the first burst's start on (the passes before
            # it, the compute job at its base, are not counted).
            first = min(e["start"] for e in read_events(events_path) if e.get("kind") == "burst")
            result["before_first_burst"] = [p for p in passes if p["t_end"] + t0 <= first]
            passes = [p for p in passes if p["t_end"] + t0 > first]
            passes_start = first
        result["load_at_end"] = loadavg()
        controller_after = daemon.controller()
        result["populate_cpu_s"] = daemon.thread_cpu_s(POPULATE_THREAD) - populate_before
        if compute is not None:
            if compute.poll() is not None:
                raise SystemExit(f"{name}: the compute job ended early (exit {compute.returncode})")
            compute.send_signal(signal.SIGTERM)
            compute.wait(60)
            result["compute_exit"] = compute.returncode
        # A quiet stretch: no compute job, no passes; the controller only samples.
        quiet_before = daemon.controller()
        time.sleep(args.quiet_s)
        quiet_after = daemon.controller()
        sampler.stopping.set()
        sampler.join()
        result["passes"] = passes
        result["centroids"] = centroids
        result["samples"] = sampler.rows
        result["run_s"] = run_end - t0
        if elastic:
            result["controller_run"] = cpu_share(controller_before, controller_after, run_end - passes_start)
            result["controller_quiet"] = cpu_share(quiet_before, quiet_after, args.quiet_s)
            result["released_bytes"] = controller_after["released_bytes"]
            result["trace"] = daemon.trace()
        result["events"] = read_events(events_path)
    finally:
        if compute is not None and compute.poll() is None:
            compute.kill()
            compute.wait()
        daemon.stop()
    result["oom_kills"] = oom_kills()
    return result


def window_over(args, passes_start, with_compute, events_path):
    """With --cycles N and a compute job: once its (N+1)-th burst began, so the
    passes cover N whole cycles (idle, burst, recovery) and runs with
    different pass speeds compare. Otherwise after --duration-s."""
    if args.cycles and with_compute:
        bursts = sum(1 for e in read_events(events_path) if e.get("kind") == "burst")
        return bursts > args.cycles
    return time.time() - passes_start >= args.duration_s


# The elastic daemon's thread that allocates the region back up to the target.
POPULATE_THREAD = "shoal-fill"


def restored_bytes(client):
    return client.tiers()["restored_bytes"]


def cpu_share(before, after, seconds):
    steps = after["steps"] - before["steps"]
    cpu = after["cpu_seconds"] - before["cpu_seconds"]
    # Of it, carrying shrinks out (evictions down a tier, hole punching): the
    # store's work a shrink asks for, counted apart from the law's own cost.
    release = after.get("release_cpu_seconds", 0.0) - before.get("release_cpu_seconds", 0.0)
    return {
        "steps": steps,
        "urgent_steps": after.get("urgent_steps", 0) - before.get("urgent_steps", 0),
        "cpu_s": cpu,
        "share_pct": 100 * cpu / seconds,
        "per_step_us": 1e6 * cpu / steps,
        "release_cpu_s": release,
        "control_share_pct": 100 * (cpu - release) / seconds,
        "release_share_pct": 100 * release / seconds,
    }


def read_events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def loadavg():
    """The 1-minute load average (other engineers' builds and benchmarks share the 2 cores)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def oom_kills():
    """The kernel's count of OOM kills (/proc/vmstat oom_kill), machine-wide."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return None


# -- report -------------------------------------------------------------------------------------


def pct(sorted_values, p):
    rank = max(1, min(len(sorted_values), int(-(-p * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def pct_or_nan(values, p):
    return pct(values, p) if values else float("nan")


def summarise(r):
    counted = r["passes"][args_global.warm :]
    # The mean: the job's run time per pass (slow passes while the compute job
    # peaks are what a median would hide).
    r["pass_s"] = statistics.mean(p["s"] for p in counted)
    r["pass_median_s"] = statistics.median(p["s"] for p in counted)
    r["hit"] = statistics.mean(p["hit"] for p in counted)
    grows = [e for e in r["events"] if e["kind"] == "grow"]
    # First back after the crossing, even while the step still grows (runs
    # before the watcher thread recorded only the settled "back").
    first = [(e, e.get("back_any") or e["back"]) for e in grows if e["back"] and e["crossed"]]
    from_start = sorted(1e3 * (b - e["start"]) for e, b in first)
    from_cross = sorted(1e3 * (b - e["crossed"]) for e, b in first)
    from_touched = sorted(
        1e3 * max(0.0, e["back"] - e["touched"]) for e in grows if e["back"] and e["crossed"]
    )
    r["reactions"] = {
        "grows": len(grows),
        "crossed": sum(1 for e in grows if e["crossed"]),
        "not_back": sum(1 for e in grows if e["crossed"] and not e["back"]),
        "floor_stops": sum(1 for e in r["events"] if e["kind"] == "floor"),
        "from_start_ms": from_start,
        "from_cross_ms": from_cross,
        "from_touched_ms": from_touched,
    }
    over = [s["node_used"] - r["threshold_bytes"] for s in r["samples"]]
    r["max_over_threshold"] = max(over) if over else 0
    exp = [s["resident"] + s["compute"] for s in r["samples"]]
    r["max_experiment_bytes"] = max(exp) if exp else 0


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.get("with_burst") and "samples" in r]
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2 * len(shown)), sharex=False, squeeze=False)
    for ax, r in zip(axes[:, 0], shown):
        s = r["samples"]
        t = [x["t"] for x in s]
        base = r["node_used_at_start"]
        ax.plot(t, [x["capacity"] / GiB for x in s], label="store capacity", color="tab:blue")
        ax.plot(t, [x["resident"] / GiB for x in s], label="store resident", color="tab:cyan")
        ax.plot(t, [x["compute"] / GiB for x in s], label="compute job", color="tab:red")
        free = [(r["threshold_bytes"] - x["node_used"]) / GiB for x in s]
        ax.plot(t, free, label="free below the threshold", color="tab:green")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.axhline(args_global.budget_gib, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel("GiB")
        ax.set_title(
            f"{r['name']} (node budget {args_global.budget_gib} GiB above {base / GiB:.1f} GiB in use)"
        )
        ax.legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def upper_bound(by):
    """static-large, pooled with static-large-after when the run has both."""
    before, after = by.get("static-large"), by.get("static-large-after")
    if not (before and "pass_s" in before):
        return before
    if not (after and "pass_s" in after):
        return before
    passes = [p["s"] for r in (before, after) for p in r["passes"][args_global.warm :]]
    return {
        "pass_s": statistics.mean(passes),
        "before_s": before["pass_s"],
        "after_s": after["pass_s"],
        "drift": after["pass_s"] / before["pass_s"] - 1,
    }


def mark(ok):
    return "met" if ok else "**not met**"


def squeeze_floor(d, small, upper):
    """What any store could do in the memory the node left it, on this machine: while the
    compute job holds its part of the node budget, a store of C < D bytes misses at least
    D - C of the D bytes of data per pass, each missed byte costing what it costs
    static-small in the same run ((its pass - the upper bound's) / its missed bytes per
    pass). C is the node budget (the controller's threshold) minus all the node's other
    memory, averaged over the pass: what the node left for the store, whatever the
    controller did with it. Generous to the store: the refill after a burst (every byte
    lost must be read back) is counted as free. Returns the floor's mean pass, or None."""
    data = d.get("data_bytes")
    missed_small = (1 - small["hit"]) * data if data else 0
    if not missed_small or not d.get("samples"):
        return None
    per_byte = max(0.0, small["pass_s"] - upper["pass_s"]) / missed_small
    budget = d["threshold_bytes"]
    samples = [(x["t"], budget - (x["node_used"] - x["resident"])) for x in d["samples"]]
    floors = []
    for p in d["passes"]:
        start, end = p["t_end"] - p["s"], p["t_end"]
        inside = [c for t, c in samples if start <= t <= end] or [
            min(samples, key=lambda tc: abs(tc[0] - end))[1]
        ]
        left = min(data, max(0.0, statistics.mean(inside)))
        floors.append(upper["pass_s"] + (data - left) * per_byte)
    return statistics.mean(floors)


def targets(d, small, upper, results, args):
    """The issue's targets for one dynamic configuration, as report lines."""
    speedup = small["pass_s"] / d["pass_s"]
    # The most any configuration can gain over static-small on this machine:
    # the upper bound's own speedup (every pass a hit) in the same run.
    limit = small["pass_s"] / upper["pass_s"]
    unreachable = ""
    if limit < TARGET_SPEEDUP:
        unreachable = f", below {TARGET_SPEEDUP}×: the target cannot be reached here"
    vs_upper = d["pass_s"] / upper["pass_s"] - 1
    rx = d["reactions"]
    p99_start = pct(rx["from_start_ms"], 0.99) if rx["from_start_ms"] else float("nan")
    p50_start = pct(rx["from_start_ms"], 0.5) if rx["from_start_ms"] else float("nan")
    p99_cross = pct(rx["from_cross_ms"], 0.99) if rx["from_cross_ms"] else float("nan")
    p50_cross = pct(rx["from_cross_ms"], 0.5) if rx["from_cross_ms"] else float("nan")
    cq, cr = d["controller_quiet"], d["controller_run"]
    ooms = results[-1]["oom_kills"] - args.oom_before if args.oom_before is not None else None
    return (
        [
            f"## Targets: {d['name']}" + LAWS[d["name"]],
            "",
            "| target | measured | |",
            "|---|---|---|",
            f"| {d['name']} ≥ {TARGET_SPEEDUP}× static-small | {speedup:.2f}× | "
            f"{mark(speedup >= TARGET_SPEEDUP)} |",
            f"| the same as a share of this machine's limit (static-small ÷ static-large = {limit:.2f}× "
            f"in this run{unreachable}) ≥ 0.9 | {speedup / limit:.2f} | {mark(speedup / limit >= 0.9)} |",
            f"| {d['name']} within {TARGET_UPPER:.0%} of the upper bound (static-large, no compute job) | "
            f"{vs_upper:+.1%} | {mark(vs_upper <= TARGET_UPPER)} |",
        ]
        + floor_lines(d, small, upper)
        + [
            f"| 0 OOM kills | {ooms} (kernel oom_kill count over the run) | {mark(ooms == 0)} |",
            f"| shrink reaction ≤ {TARGET_REACTION_MS:.0f} ms p99 (from the node crossing the threshold) | "
            f"p50 {p50_cross:.0f} ms, p99 {p99_cross:.0f} ms ({len(rx['from_cross_ms'])} shrinks) | "
            f"{mark(p99_cross <= TARGET_REACTION_MS)} |",
            f"| shrink reaction ≤ {TARGET_REACTION_MS:.0f} ms p99 "
            "(from the start of the compute job's growth step) | "
            f"p50 {p50_start:.0f} ms, p99 {p99_start:.0f} ms | {mark(p99_start <= TARGET_REACTION_MS)} |",
            f"| controller ≤ {TARGET_CPU} % of one core | quiet {cq['share_pct']:.3f} % "
            f"({cq['per_step_us']:.0f} µs/step); over the run, shrinks and hole punching included, "
            f"{cr['share_pct']:.3f} % ({cr['per_step_us']:.0f} µs/step, {cr['steps']} steps"
            + (
                f", {cr['urgent_steps']} urgent): the law and sampling {cr['control_share_pct']:.3f} %, "
                f"carrying shrinks out (evictions, hole punching) {cr['release_share_pct']:.3f} % | "
                f"{mark(cq['share_pct'] <= TARGET_CPU)} quiet, "
                f"{mark(cr['control_share_pct'] <= TARGET_CPU)} the law over the run, "
                f"{mark(cr['share_pct'] <= TARGET_CPU)} with the shrinks' own work |"
                if "control_share_pct" in cr
                else f") | {mark(cq['share_pct'] <= TARGET_CPU)} quiet, "
                f"{mark(cr['share_pct'] <= TARGET_CPU)} with shrinks |"
            ),
            "",
            "Settled (the node back within 32 MiB of the threshold once the compute job's step, "
            "1 GiB populated in 64 MiB pieces, stopped growing), from the end of its populating: "
            f"p50 {pct_or_nan(rx['from_touched_ms'], 0.5):.0f} ms, "
            f"p99 {pct_or_nan(rx['from_touched_ms'], 0.99):.0f} ms. Growth steps: "
            f"{rx['grows']}, {rx['crossed']} crossed the threshold, {rx['not_back']} not back within 10 s.",
            f"The controller gave {d['released_bytes'] / GiB:.1f} GiB of pages back to the kernel."
            + populate_line(d),
        ]
        + page_freeing_lines(d, args)
    )


def populate_line(d):
    if "populate_cpu_s" not in d or "controller_run" not in d:
        return ""
    cr = d["controller_run"]
    seconds = cr["cpu_s"] / (cr["share_pct"] / 100) if cr["share_pct"] else float("nan")
    return (
        f" Its populating thread allocated the region back up to the target after shrinks in "
        f"{d['populate_cpu_s']:.2f} CPU s ({100 * d['populate_cpu_s'] / seconds:.3f} % of one core "
        f"over the run; not in the controller's share above: it is the page allocation the "
        f"restores would otherwise take in their faults)."
    )


def floor_lines(d, small, upper):
    floor = squeeze_floor(d, small, upper)
    if floor is None:
        return []
    over = floor / upper["pass_s"] - 1
    beyond = d["pass_s"] / floor - 1
    share = (small["pass_s"] / d["pass_s"]) / (small["pass_s"] / floor)
    return [
        f"| the same beside this machine's floor for it (the upper bound plus the misses the "
        f"memory the node left for the store forced, at static-small's cost per missed byte: "
        f"{floor:.2f} s, {over:+.1%} over the upper bound"
        f"{', itself beyond 10 %' if over > TARGET_UPPER else ''}) ≤ +10 % | {beyond:+.1%} | "
        f"{mark(beyond <= TARGET_UPPER)} |",
        f"| the speedup over static-small as a share of the most any store could gain with the "
        f"memory the node left it (static-small ÷ that floor = "
        f"{small['pass_s'] / floor:.2f}×) ≥ 0.9 | {share:.2f} | {mark(share >= 0.9)} |",
    ]


def page_freeing_lines(d, args):
    """The controller's CPU beside the machine's limit: what the kernel alone costs to free the
    pages the run gave back (measured in the same run)."""
    per_gib = getattr(args, "page_freeing_s_per_gib", None)
    cr = d["controller_run"]
    if per_gib is None or "release_cpu_s" not in cr:
        return []
    seconds = cr["cpu_s"] / (cr["share_pct"] / 100) if cr["share_pct"] else float("nan")
    freeing = d["released_bytes"] / GiB * per_gib
    beyond = cr["cpu_s"] - freeing
    return [
        f"Machine limit: the kernel frees populated pages of the regions' file system "
        f"({regions_in(args)}) at {per_gib:.4f} CPU s per GiB here (measured in "
        f"this run), so giving "
        f"{d['released_bytes'] / GiB:.1f} GiB back costs at least {freeing:.2f} s "
        f"({100 * freeing / seconds:.3f} % of one core over the run) whoever does it. The "
        f"controller's CPU beyond that floor: {max(beyond, 0.0):.2f} s, {100 * beyond / seconds:.3f} % "
        f"of one core | {mark(100 * beyond / seconds <= TARGET_CPU)} as a ratio to the machine's limit.",
    ]


def urgent_interval(args):
    if "urgent_interval_ms" not in vars(args):
        return "none (before it existed)"
    ms = args.urgent_interval_ms
    return "the daemon's default (20 ms)" if ms is None else ("off" if ms == 0 else f"{ms} ms")


def compute_profile(args):
    if getattr(args, "profile", "sustained") == "hpcc":
        return (
            f"compute job (HPCC-like, the seed's Fig. 1) at {args.base_gib} GiB for {args.idle_s} s, then "
            f"a burst of 1 GiB steps every {args.phase_s} s up to {args.burst_peak_gib} GiB, held "
            f"{args.hold_s} s, freed at once, repeated;"
        )
    return (
        f"compute job (sustained) phases of 1 GiB up to {args.burst_peak_gib} GiB every {args.phase_s} s, "
        f"hold {args.hold_s} s, down 2 GiB per {args.phase_s} s, idle {args.idle_s} s at 0, repeated;"
    )


def regions_in(args):
    if getattr(args, "huge_tmpfs", None):
        return f"a tmpfs with huge=always ({args.huge_tmpfs:g} GiB) the run mounted"
    return getattr(args, "region_dir", "/dev/shm")


def window(args):
    cycles = getattr(args, "cycles", 0)
    if cycles:
        return (
            f"passes over {cycles} whole burst cycles with the compute job (from its first "
            f"burst's start to its {cycles + 1}th's: the passes before the first are not "
            f"counted), for {args.duration_s:.0f} s without it"
        )
    return f"passes for {args.duration_s:.0f} s"


def report(results, args, path):
    by = {r["name"]: r for r in results}
    lines = [
        "# Elastic capacity: DynIMS' mixed-workload experiment on this machine (issue 11)",
        "",
        f"`python bench/elastic/mixed.py` ({datetime.date.today()}), the shared 2-core / 24 GiB VM",
        f"({os.uname().release}) with other engineers' builds running. Data: {args.data_gib} GiB of",
        f"Arrow tables ({int(args.data_gib * GiB // OBJECT)} × 64 MiB, 2-d float32 points), durable on a",
        f"burst buffer on disk; static small store {args.small_gib} GiB, large {args.large_gib} GiB;",
        compute_profile(args),
        f"node budget {args.budget_gib} GiB above the machine's use at each configuration's start",
        f"(the controller's r_0); {window(args)} after a cold pass (not counted);",
        f"mini-batch stride {args.stride}; regions in {regions_in(args)}; "
        f"eviction policy {getattr(args, 'policy', 'lru')}, "
        f"prefetch on growth {prefetch_size(args) or 'off'}, "
        f"urgent interval {urgent_interval(args)}.",
        "",
        "| configuration | pass (mean) | pass (median) | hit ratio | max over the node budget | "
        "experiment's peak | compute steps stopped at the floor | load (1 min) start → end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped: {r['skipped']} | | | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['pass_s']:.2f} s | {r['pass_median_s']:.2f} s | {r['hit']:.2f} | "
            f"{max(0, r['max_over_threshold']) / GiB:.2f} GiB | {r['max_experiment_bytes'] / GiB:.2f} GiB | "
            f"{r['reactions']['floor_stops']} | {r['load_at_start']:.1f} → {r['load_at_end']:.1f} |"
        )
    lines.append("")
    small, upper = by.get("static-small"), upper_bound(by)
    if upper and "drift" in upper:
        lines += [
            f"Upper bound: static-large {upper['before_s']:.2f} s before the dynamic configurations, "
            f"{upper['after_s']:.2f} s after them ({upper['drift']:+.1%}: the machine's drift over "
            f"the run); the targets use both runs' passes pooled, {upper['pass_s']:.2f} s.",
            "",
        ]
    for dyn in LAWS:
        d = by.get(dyn)
        if all(x and "pass_s" in x for x in (d, small, upper)):
            lines += targets(d, small, upper, results, args) + [""]
    sl = by.get("static-large+burst")
    if sl and "pass_s" in sl:
        lines += [
            "",
            f"static-large+burst: the store kept its {args.large_gib} GiB while the compute job grew; "
            f"the node went up to {max(0, sl['max_over_threshold']) / GiB:.2f} GiB over its budget "
            "(on a node of that size: swap, or the OOM killer). This machine has the memory, so "
            "nothing was killed here; the compute job took "
            f"{sl['reactions']['floor_stops']} growth steps less because MemAvailable would have "
            f"fallen below {args.floor_gib} GiB.",
        ]
    lines += [
        "",
        "Per pass (seconds, hit ratio):",
        "",
    ]
    for r in results:
        if "passes" in r:
            cells = ", ".join(f"{p['s']:.2f}/{p['hit']:.2f}" for p in r["passes"])
            lines.append(f"- {r['name']}: cold {r['cold_pass_s']:.2f} s; {cells}")
    png, raw = (os.path.basename(x) for x in beside(path))
    lines += ["", f"Memory over time: {png} (raw samples: {raw}).", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def shrunk_passes(r, data_bytes):
    """The passes during which the store's capacity was below the data at some sample:
    where the policy decides what a shrunk store keeps (the others hit 1.00 at any policy)."""
    samples = r.get("samples", [])
    shrunk = []
    for p in r["passes"]:
        start = p["t_end"] - p["s"]
        caps = [x["capacity"] for x in samples if start <= x["t"] <= p["t_end"]]
        if caps and min(caps) < data_bytes:
            shrunk.append(p)
    return shrunk


def compare(paths):
    """A policy comparison table (markdown) over the elastic.json of several runs. The first
    run's static-small is the baseline (the LRU run), its static-large the upper bound unless
    a run has its own; a configuration is also set against the static-small of its own run,
    when it has one (the same policy and load)."""
    runs = []
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        runs.append((os.path.basename(path), saved["args"], saved["results"]))
    first = {r["name"]: r for r in runs[0][2]}
    small, upper = first["static-small"], first["static-large"]
    lines = [
        "| configuration | policy | prefetch | pass (mean) | pass (median) | hit ratio | "
        f"× static-small ({runs[0][1].get('policy', 'lru')}) | × static-small (same policy) | "
        "over the upper bound (its run's) | mean ÷ own full passes | "
        "passes shrunk below the data: n, hit, mean time | "
        "load (1 min) start → end | run |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for source, run_args, results in runs:
        by = {r["name"]: r for r in results}
        own = by.get("static-small")
        # The upper bound of the run's own time when it has one (the load moves it).
        bound = by["static-large"] if "pass_s" in by.get("static-large", {}) else upper
        for r in results:
            if "passes" not in r:
                continue
            policy = r.get("policy", run_args.get("policy", "lru"))
            same = f"{own['pass_s'] / r['pass_s']:.2f}×" if own and "pass_s" in own else "–"
            shrunk = shrunk_passes(r, int(run_args["data_gib"] * GiB // OBJECT) * OBJECT)
            # Against the same run's passes that hit everything (median): the cost of
            # shrinking without the machine's load, which moved the static rows by 35 %.
            full = [p["s"] for p in r["passes"] if p["hit"] >= 0.999]
            own_full = f"{r['pass_s'] / statistics.median(full):.2f}" if full else "–"
            in_shrunk = "–"
            if r.get("elastic") and shrunk:
                in_shrunk = (
                    f"{len(shrunk)}, {statistics.mean(p['hit'] for p in shrunk):.2f}, "
                    f"{statistics.mean(p['s'] for p in shrunk):.2f} s"
                )
            lines.append(
                f"| {r['name']} | {policy} | {r.get('prefetch') or 'off'} | {r['pass_s']:.2f} s | "
                f"{r['pass_median_s']:.2f} s | {r['hit']:.2f} | {small['pass_s'] / r['pass_s']:.2f}× | "
                f"{same} | {r['pass_s'] / bound['pass_s'] - 1:+.1%} | {own_full} | {in_shrunk} | "
                f"{r['load_at_start']:.1f} → {r['load_at_end']:.1f} | {source} |"
            )
    return "\n".join(lines)


def beside(out):
    """The PNG and the raw JSON written next to the report: elastic.md -> elastic.png, elastic.json."""
    stem = os.path.splitext(os.path.abspath(out))[0]
    return stem + ".png", stem + ".json"


args_global = None


def prefetch_size(args):
    """The dynamic configurations' --elastic-prefetch, or None when off."""
    size = getattr(args, "elastic_prefetch", None)
    return None if size in (None, "", "0", "off") else size


def main():
    global args_global
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(BENCH, "results", "elastic.md"))
    p.add_argument("--shoal", default=os.path.join(ROOT, "target", "release", "shoal"))
    p.add_argument(
        "--region-dir",
        default="/dev/shm",
        help="where the daemons' regions live: a tmpfs (default /dev/shm; one mounted with huge=always "
        "gives memory back in 2 MiB pages, see docs/elastic.md)",
    )
    p.add_argument("--data-gib", type=float, default=3.0)
    p.add_argument("--small-gib", type=float, default=0.75)
    p.add_argument("--large-gib", type=float, default=3.5)
    p.add_argument("--budget-gib", type=float, default=5.0)
    p.add_argument("--burst-peak-gib", type=float, default=4.0)
    p.add_argument("--floor-gib", type=float, default=6.0)
    p.add_argument(
        "--profile",
        default="hpcc",
        choices=["hpcc", "sustained"],
        help="the compute job's memory over time: hpcc (the seed's Fig. 1: --base-gib most of the "
        "time, a burst to the peak in a small part of it) or sustained (up to the peak, hold, down "
        "to 0, idle: the peak for a third of the run)",
    )
    p.add_argument("--base-gib", type=float, default=1.0, help="hpcc: memory held between bursts")
    p.add_argument("--phase-s", type=float, help="between growth steps [hpcc 1, sustained 2]")
    p.add_argument("--hold-s", type=float, help="at the peak [hpcc 2, sustained 4]")
    p.add_argument("--idle-s", type=float, help="between bursts [hpcc 24 at the base, sustained 6 at 0]")
    p.add_argument("--quiet-s", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=60.0, help="passes run this long")
    p.add_argument(
        "--cycles",
        type=int,
        default=0,
        help="configurations with the compute job run passes over this many whole burst cycles "
        "(idle, burst, recovery) instead of --duration-s, so runs compare",
    )
    p.add_argument(
        "--huge-tmpfs",
        metavar="GIB",
        type=float,
        help="mount a tmpfs with huge=always of this size for the regions (root; unmounted at the "
        "end) instead of --region-dir: memory is given back in 2 MiB pages (docs/elastic.md)",
    )
    p.add_argument("--stride", type=int, default=64, help="assign every STRIDE-th point (mini-batch)")
    p.add_argument("--warm", type=int, default=0, help="passes not counted")
    p.add_argument(
        "--configs",
        default="static-small,static-large,static-large+burst,dynamic,dynamic-fast,dynamic-ahead,"
        "static-large-after",
    )
    p.add_argument(
        "--policy",
        default="lru",
        choices=["lru", "lfu", "lrfu", "forecast"],
        help="eviction policy of every daemon started (shoal serve --policy)",
    )
    p.add_argument(
        "--elastic-prefetch",
        metavar="SIZE",
        default="4GiB",
        help="prefetch on growth in the dynamic configurations (--elastic-prefetch; "
        "default 4GiB, more than the data; 0: off)",
    )
    p.add_argument(
        "--urgent-interval-ms",
        type=int,
        help="the dynamic configurations' --elastic-urgent-interval-ms (default: the daemon's, 20; 0: off)",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="JSON",
        help="print a policy comparison table over several runs' JSON (the first: the baseline)",
    )
    p.add_argument(
        "--from-json", help="rewrite the report and the PNG from an elastic.json of an earlier run"
    )
    p.add_argument("--compute-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--threshold-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.compute_job:  # the compute job does not load shoal
        from shoal.testing import require_optimized_build

        require_optimized_build()  # not the test command's opt-level-1 build
    defaults = {"hpcc": (1.0, 2.0, 24.0), "sustained": (2.0, 4.0, 6.0)}[args.profile]
    for key, value in zip(("phase_s", "hold_s", "idle_s"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, value)
    args_global = args
    if args.compute_job:
        compute_job(args)
        return
    if args.compare:
        print(compare(args.compare))
        return
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        for key, value in saved["args"].items():
            if key not in ("out", "from_json"):
                setattr(args, key, value)
        if "profile" not in saved["args"]:
            # A run from before the urgent interval and the profiles.
            del args.urgent_interval_ms
            args.profile = "sustained"
        plot(saved["results"], beside(args.out)[0])
        report(saved["results"], args, args.out)
        return
    import shoal

    work = tempfile.mkdtemp(prefix=".elastic-run-", dir=os.path.dirname(os.path.abspath(__file__)))
    burst = os.path.join(work, "burst")
    huge = None
    if args.huge_tmpfs:
        huge = os.path.join(work, "huge")
        os.mkdir(huge)
        mount = ["mount", "-t", "tmpfs", "-o", f"huge=always,size={int(args.huge_tmpfs * 1024)}m"]
        subprocess.run(mount + ["shoal-huge", huge], check=True)
        args.region_dir = huge
    args.oom_before = oom_kills()
    args.page_freeing_s_per_gib = page_freeing_limit(args.region_dir)
    log(f"the kernel frees pages in {args.region_dir} at {args.page_freeing_s_per_gib:.4f} CPU s per GiB")
    n = int(args.data_gib * GiB // OBJECT)
    try:
        _, _, available = node_used()
        if available - (args.large_gib + 1) * GiB < args.floor_gib * GiB:
            raise SystemExit(f"MemAvailable {available / GiB:.1f} GiB: not enough to load the data")
        log(f"loading {n} tables onto the burst buffer ({work})")
        large = int(args.large_gib * GiB)
        loader = Store(args.shoal, work, "load", large, burst, policy=args.policy, region_dir=args.region_dir)
        try:
            ids = load(shoal.Client(loader.socket), n)
        finally:
            loader.stop()
        sizes = {
            "static-small": (int(args.small_gib * GiB), True, False),
            "static-large": (int(args.large_gib * GiB), False, False),
            "static-large-after": (int(args.large_gib * GiB), False, False),
            "static-large+burst": (int(args.large_gib * GiB), True, False),
            "dynamic": (int(args.large_gib * GiB), True, True),
            "dynamic-fast": (int(args.large_gib * GiB), True, True),
            "dynamic-ahead": (int(args.large_gib * GiB), True, True),
        }
        results = []
        for name in args.configs.split(","):
            capacity, with_burst, elastic = sizes[name]
            log(f"== {name}")
            gain = 1.0 if name in ("dynamic-fast", "dynamic-ahead") else None
            ahead = name == "dynamic-ahead"
            r = run_config(args, name, capacity, with_burst, elastic, ids, burst, work, gain, ahead)
            if "passes" in r:
                summarise(r)
            results.append(r)
        png, raw = beside(args.out)
        with open(raw, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results}, f)
        try:
            plot(results, png)
        except ImportError as e:
            log(f"no plot: {e}; pip install matplotlib")
        report(results, args, args.out)
        log(open(args.out).read())
    finally:
        if huge:
            subprocess.run(["umount", huge], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
