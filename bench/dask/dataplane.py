"""Dask with shoal as its data plane (issue 42), beside stock Dask, in one run.

    .venv/bin/python bench/dask/dataplane.py --out bench/results/dask.md

Every phase runs a LocalCluster of worker processes (one thread each) twice: stock Dask
(`distributed.Nanny`, its own serialization and spilling) and shoal (`shoal.dask.Nanny` on
a fresh `shoal serve` of this run, not prefaulted, so its pages show as host memory when
they are written). Measured:

  handoff    a value made by a task on worker A is the dependency of a task on worker B:
             a --handoff-gib pyarrow.Table (8 float64 columns) and a float64 pandas frame
             of that size, and an 8-byte numpy scalar (Dask's own floor). Per value, --reps
             rounds after one discarded: the client's wall time from submitting B's task
             to its (tiny) result, the bytes A's Dask wrote to B's socket for the value
             (Dask's own transfer log, `compressed`: what went through the comm), and B's
             private memory (VmRSS - RssShmem) after the task minus before it, while B holds
             the value. Targets: time within 2 ms of the 8-byte dependency's in the same
             cluster, <= 64 KiB through the socket, < 1 MiB private growth.
  broadcast  `client.scatter(x, broadcast=True)` and `scatter` to one worker then
             `client.replicate(n=k)` of a --broadcast-gib numpy array, k = 2 and 4 workers:
             the host's memory in use (MemTotal - MemAvailable) once done minus before, with
             the client's own copy made before. Target: <= 1.05 x the value (stock: k x).
  pressure   a frame of --frame-gib (--partitions partitions; int64 key with 1000 values,
             two float64 columns, a random int64 id) made by tasks and persisted on 2
             workers of --limit memory each (the frame about 2x their total), then a
             groupby-aggregate and a set_index on it (tasks shuffle, so that both runs
             shuffle the same way; Dask's P2P shuffle writes its own disk files in both).
             Runs: stock with the limit (Dask spills by pickling), stock without memory
             pressure (limit --frame-gib x 4: the bound), shoal with the limit and a store of
             the workers' total limit above a burst buffer on the disk Dask spills to
             (spilling by tiering: workers release their older values, the daemon moves them
             down and back; `--no-burst`: the store alone, and a value the full store
             refuses stays with Dask, which spills it its own way).
             Per run: persist, groupby and set_index times, worker pauses (the workers'
             "Pausing worker" log lines) and restarts (the nannies' "Restarting worker",
             worker pids changed), bytes the run's processes wrote to disk (/proc/PID/io
             write_bytes of the workers and the daemon, over the run), checksums of both
             results (uint64 sum of pandas row hashes: equal means the same rows whatever
             their order within a partition), and host memory in use every 0.25 s (the PNG,
             groupby and set_index from the persisted frame), the CPU seconds the workers,
             the daemon and the whole machine used per job. --rounds N repeats the stock and
             shoal runs N times, alternating which goes first (a job's time moves +-20 %
             between runs here); the speed targets are judged on the median of the rounds'
             ratios, and every round is reported. Targets: shoal >= 1.3x faster than stock
             under pressure, 0 pauses or restarts, identical checksums, no more bytes
             written than stock.

The store is a build of this worktree's extension, the release one scripts/setup.sh makes
(the test command's opt-level-1 build is refused: SHOAL_BENCH_ANY_BUILD=1 overrides); the
report says which. The machine is shared: compare ratios of one run, never numbers of
different runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.dataframe as dd
import distributed
import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
from distributed import Client, LocalCluster

import shoal
import shoal.dask
from shoal.testing import Daemon, require_optimized_build

GiB = 1 << 30
MiB = 1 << 20
BENCH = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.25


# -- the machine -----------------------------------------------------------------------------


def host_used() -> int:
    """Bytes of the host's memory in use: MemTotal - MemAvailable (tmpfs pages included)."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def settled_used(seconds: float = 1.0) -> int:
    """host_used() after a pause, the lowest of a few readings (others share the machine)."""
    gc.collect()
    readings = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        readings.append(host_used())
        time.sleep(0.1)
    return min(readings)


class Sampler:
    """Host memory in use (and the run's own, `cluster_memory`) every SAMPLE_S seconds, in
    a thread, while running; and the bytes this process's children (workers, daemon:
    restarted ones too) wrote to disk."""

    def __init__(self, region: str | None) -> None:
        self.region = region
        self.samples: list[tuple[float, int]] = []
        self.own: list[int] = []
        #: pid -> (write_bytes when first seen, latest), children present at the start
        #: counted from then, later ones from 0.
        self.io: dict[int, tuple[int, int]] = {}
        self._poll_io(first=True)
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.t0, host_used()))
            self.own.append(cluster_memory(self.region))
            self._poll_io(first=False)
            self._stop.wait(SAMPLE_S)
        self._poll_io(first=False)

    def _poll_io(self, first: bool) -> None:
        for child in psutil.Process().children(recursive=True):
            now = written_bytes([child.pid])
            start = self.io.get(child.pid, (now if first else 0, 0))[0]
            self.io[child.pid] = (start, now)

    @property
    def written(self) -> int:
        return sum(latest - start for start, latest in self.io.values())

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.t0, what))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def private_of(pid: int) -> int:
    """VmRSS - RssShmem of process `pid` (0 if it is gone)."""
    try:
        return shoal.dask.private_memory(pid)
    except (OSError, psutil.Error):
        return 0


def cpu_seconds(pids: list[int]) -> float | None:
    """CPU time (user + system) processes `pids` have used so far, or None if one is gone (a
    restarted worker: its time is lost with it)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        total += times.user + times.system
    return total


def host_busy_seconds() -> float:
    """CPU time the whole machine has spent busy so far (every process and the kernel's
    threads: writeback, page reclaim)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - times.iowait


def region_of(daemon: Daemon | None) -> str | None:
    """A path to the store's region file: /proc/PID/map_files/RANGE of the daemon's mapping of
    it (the daemon unlinks its /dev/shm file once mapped), or None."""
    if daemon is None:
        return None
    with open(f"/proc/{daemon.pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[5].startswith("/dev/shm/shoal-"):
                return f"/proc/{daemon.pid}/map_files/{fields[0]}"
    return None


def cluster_memory(region: str | None) -> int:
    """Host memory this run's processes hold: the private memory of this process's children
    (workers, nannies, the daemon) and the store region's pages in memory (tmpfs blocks).
    Unlike host_used(), other work on the machine does not move it."""
    total = sum(private_of(c.pid) for c in psutil.Process().children(recursive=True))
    if region is not None:
        with contextlib.suppress(OSError):
            total += os.stat(region).st_blocks * 512
    return total


def written_bytes(pids: list[int]) -> int:
    """write_bytes of /proc/PID/io summed over `pids` that still run."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def build_profile() -> str:
    """Which cargo profile built the extension in use: the target/*/ library equal to it."""
    import filecmp

    import shoal._internal

    ext = Path(shoal._internal.__file__).resolve()
    for profile in ("release", "checks", "debug"):
        lib = BENCH.parent / "target" / profile / "lib_internal.so"
        if lib.is_file() and filecmp.cmp(lib, ext, shallow=False):
            return profile
    return "unknown"


# -- clusters ----------------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(
    kind: str,
    workers: int,
    workdir: Path,
    store_capacity: str | None = None,
    burst: bool = False,
    drain_after_ms: int = 0,
    dirty_percent: int | None = None,
    **options: Any,
) -> Iterator[tuple[Client, Daemon | None]]:
    """A LocalCluster of `workers` processes: stock Dask, or shoal's on a fresh store (with
    `burst`, a burst buffer below it in the run's directory, beside Dask's spill files,
    written ahead of need once a value is `drain_after_ms` old)."""
    daemon = None
    if kind == "shoal":
        directory = Path(tempfile.mkdtemp(prefix="sd", dir="/tmp"))
        tiers = (
            ["--burst", str(workdir / f"burst-{directory.name}"), "--drain-after-ms", str(drain_after_ms)]
            + ([] if dirty_percent is None else ["--drain-dirty-percent", str(dirty_percent)])
            if burst
            else []
        )
        daemon = Daemon(
            directory, capacity=store_capacity or "4GiB", args=tiers, log=workdir / "shoal-daemon.log"
        )
        options |= {"worker_class": shoal.dask.Nanny, "shoal_socket": daemon.socket}
    try:
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                dashboard_address=":0",
                local_directory=str(workdir / "dask"),
                **options,
            ) as lc,
            Client(lc) as client,
        ):
            yield client, daemon
    finally:
        if daemon is not None:
            daemon.teardown(check=False)


def private_memory() -> int:
    return shoal.dask.private_memory()


def make_table(nbytes: int, seed: int) -> pa.Table:
    rows = nbytes // 8 // 8
    base = np.arange(rows, dtype=np.float64)
    return pa.table({f"c{i}": base + (seed * 8 + i) for i in range(8)})


def make_frame(nbytes: int, seed: int) -> pd.DataFrame:
    rows = nbytes // 8 // 8
    block = np.empty((rows, 8), dtype=np.float64)
    for i in range(8):
        block[:, i] = np.arange(rows, dtype=np.float64) + (seed * 8 + i)
    return pd.DataFrame(block, columns=[f"c{i}" for i in range(8)], copy=False)


def make_scalar(nbytes: int, seed: int) -> np.ndarray:
    return np.array([seed], dtype=np.int64)  # 8 bytes


def consume(value: Any) -> int:
    return len(value)


MAKERS: dict[str, Callable[[int, int], Any]] = {
    "pyarrow.Table": make_table,
    "pandas.DataFrame": make_frame,
    "8-byte dependency": make_scalar,
}


# -- hand-off --------------------------------------------------------------------------------


def handoff(client: Client, what: str, nbytes: int, reps: int, tag: str) -> list[dict[str, Any]]:
    sender, receiver = sorted(client.scheduler_info()["workers"])[:2]
    rounds = []
    for r in range(reps + 1):  # round 0 warms both workers up and is discarded
        key = f"{tag}-{what.split('.')[-1].replace(' ', '')}-{r}"
        value = client.submit(MAKERS[what], nbytes, r, workers=[sender], key=key, pure=False)
        distributed.wait(value)
        time.sleep(0.2)
        before = client.run(private_memory, workers=[receiver])[receiver]
        started = time.perf_counter()
        result = client.submit(consume, value, workers=[receiver], key=f"use-{key}", pure=False)
        result.result()
        elapsed = time.perf_counter() - started
        after = client.run(private_memory, workers=[receiver])[receiver]

        def sent(dask_worker: Any, key: str = key) -> list[int]:
            return [e["compressed"] for e in dask_worker.transfer_outgoing_log if key in e["keys"]]

        wire = sum(client.run(sent, workers=[sender])[sender])
        if r:
            rounds.append({"seconds": elapsed, "socket_bytes": wire, "private_growth": after - before})
        del result, value
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
            key in keys for keys in client.run(lambda dask_worker: list(dask_worker.data)).values()
        ):
            time.sleep(0.1)
    return rounds


def run_handoff(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    nbytes = int(args.handoff_gib * GiB)
    out: dict[str, Any] = {}
    for kind in ("stock", "shoal"):
        capacity = f"{int(2.5 * nbytes) // MiB}MiB"
        with cluster(kind, 2, workdir, store_capacity=capacity, memory_limit=0) as (client, _):
            out[kind] = {
                what: handoff(client, what, nbytes, args.reps, kind)
                for what in ("8-byte dependency", "pyarrow.Table", "pandas.DataFrame")
            }
        log(f"handoff {kind}: {summary_handoff(out[kind])}")
    return out


def summary_handoff(runs: dict[str, list[dict[str, Any]]]) -> str:
    return ", ".join(f"{w} {med(r, 'seconds') * 1e3:.1f} ms" for w, r in runs.items())


def med(rounds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


# -- broadcast -------------------------------------------------------------------------------


def run_broadcast(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    nbytes = int(args.broadcast_gib * GiB)
    value = np.arange(nbytes // 8, dtype=np.float64)  # the client's copy, made before
    out: dict[str, Any] = {}
    for k in (2, 4):
        for kind in ("stock", "shoal"):
            row = {}
            for how in ("scatter(broadcast=True)", "scatter + replicate"):
                # A fresh cluster (and store) each time: the store's region keeps the pages
                # an earlier value was written to, which would hide this one's growth.
                capacity = f"{int(1.5 * nbytes) // MiB}MiB"
                with cluster(kind, k, workdir, store_capacity=capacity, memory_limit=0) as (client, daemon):
                    region = region_of(daemon)
                    own_before = cluster_memory(region)
                    before = settled_used()
                    started = time.perf_counter()
                    if how.startswith("scatter(broadcast"):
                        future = client.scatter(value, broadcast=True, hash=False)
                    else:
                        future = client.scatter(value, hash=False)
                        client.replicate([future], n=k)
                    said = len(client.who_has([future])[future.key])
                    elapsed = time.perf_counter() - started
                    growth = settled_used() - before
                    own = cluster_memory(region) - own_before
                    # Who holds it by the workers' own data (the scheduler's who_has may name
                    # workers that have dropped their replica: stock Dask at k = 4 did).
                    holding = client.run(lambda dask_worker, key=future.key: key in dask_worker.data)
                    row[how] = {
                        "growth": growth,
                        "own": own,
                        "seconds": elapsed,
                        "holders": sum(holding.values()),
                        "who_has": said,
                    }
                    del future
            out[f"{kind} k={k}"] = row
            log(f"broadcast {kind} k={k}: {json.dumps(row)}")
    return out


# -- under memory pressure -------------------------------------------------------------------


def frame_partition(index: int, rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(index)
    return pd.DataFrame({
        "k": rng.integers(0, 1000, rows),
        "v": rng.random(rows),
        "w": rng.standard_normal(rows),
        "id": rng.integers(0, 2**62, rows),
    })  # fmt: skip


def row_hash_sum(frame: pd.DataFrame) -> pd.Series:
    hashed = pd.util.hash_pandas_object(frame, index=True).to_numpy(dtype=np.uint64)
    return pd.Series([int(hashed.sum(dtype=np.uint64))], dtype=np.uint64)


def total_hash(series: pd.Series) -> int:
    return int(series.to_numpy(dtype=np.uint64).sum(dtype=np.uint64))


def tier_bytes(daemon: Daemon | None) -> dict[str, int] | None:
    """Bytes the daemon moved between its tiers so far: spilled at eviction, drained ahead of
    need, restored into memory (None without a daemon)."""
    if daemon is None:
        return None
    tiers = daemon.client().tiers()
    return {k: tiers[k] for k in ("spilled_bytes", "drained_bytes", "restored_bytes")}


def pressure_run(
    kind: str, args: argparse.Namespace, workdir: Path, limit: int, store: str | None
) -> dict[str, Any]:
    rows = int(args.frame_gib * GiB) // args.partitions // 32
    with (
        cluster(
            kind,
            2,
            workdir,
            store_capacity=store,
            burst=not args.no_burst,
            drain_after_ms=args.drain_after_ms,
            dirty_percent=args.drain_dirty_percent,
            memory_limit=limit,
            **({"shoal_young": args.young} if kind == "shoal" and args.young else {}),
        ) as (
            client,
            daemon,
        ),
        dask.config.set({"dataframe.shuffle.method": "tasks"}),
    ):
        pids = list(client.run(os.getpid).values())
        dd_frame = dd.from_map(frame_partition, range(args.partitions), rows=rows)
        out: dict[str, Any] = {"limit": limit, "store": store}
        out["checksums"] = {}
        with Sampler(region_of(daemon)) as sampler:

            def timed(job: str, work: Callable[[], Any]) -> Any:
                """Runs one job, recording its seconds, or its failure (then None)."""
                sampler.mark(job)
                moved = tier_bytes(daemon)
                daemon_pids = [] if daemon is None else [daemon.pid]
                cpu_before = (cpu_seconds(pids), cpu_seconds(daemon_pids), host_busy_seconds())
                started = time.perf_counter()
                try:
                    with distributed.get_task_stream(client) as stream:
                        value = work()
                except Exception as err:  # a KilledWorker is a result here, not a crash
                    out[job] = f"failed: {type(err).__name__}"
                    log(f"pressure {kind}: {job} failed: {err!r}"[:400])
                    return None
                out[job] = time.perf_counter() - started
                cpu_after = (cpu_seconds(pids), cpu_seconds(daemon_pids), host_busy_seconds())
                used = (None if None in (a, b) else round(b - a, 2) for a, b in zip(cpu_before, cpu_after))
                out.setdefault("cpu_s", {})[job] = dict(zip(("workers", "daemon", "host"), used))
                out.setdefault("task_stream", {})[job] = task_stream_summary(stream.data)
                if moved is not None:
                    out.setdefault("tiers_by_job", {})[job] = {
                        k: v - moved[k] for k, v in tier_bytes(daemon).items()
                    }
                return value

            def persist() -> Any:
                persisted = dd_frame.persist()
                distributed.wait(persisted)
                return persisted

            frame = timed("persist", persist)
            if frame is not None and "groupby" in args.jobs:
                grouped = timed(
                    "groupby", lambda: frame.groupby("k").agg({"v": "sum", "w": "mean"}).compute()
                )
                if grouped is not None:
                    out["checksums"]["groupby"] = total_hash(row_hash_sum(grouped.sort_index()))
                    out["groups"] = len(grouped)
            if frame is not None and "set_index" in args.jobs:
                meta = pd.Series(dtype=np.uint64)
                hashes = frame.set_index("id").map_partitions(row_hash_sum, meta=meta)
                index_hash = timed("set_index", lambda: total_hash(hashes.compute()))
                if index_hash is not None:
                    out["checksums"]["set_index"] = index_hash
            sampler.mark("end")
        out["written"] = sampler.written
        logs = [line for w in client.get_worker_logs().values() for _, line in w]
        nanny_logs = [line for w in client.get_worker_logs(nanny=True).values() for _, line in w]
        out["pauses"] = sum("Pausing worker" in line for line in logs)
        out["restarts"] = max(
            sum("Restarting worker" in line for line in nanny_logs),
            len(set(pids) - set(client.run(os.getpid).values())),
        )
        out["stored"] = out["released"] = 0
        if kind == "shoal":
            counts = client.run(
                lambda dask_worker: {
                    "stored": dask_worker.data.stored_count,
                    "released": dask_worker.data.released_count,
                    "room_waits": dask_worker.data.store.room_waits,
                    "room_wait_s": dask_worker.data.store.room_wait_s,
                    "rooms_made": dask_worker.data.rooms_made,
                    "room_making_s": dask_worker.data.room_making_s,
                }
            )
            for count in ("stored", "released", "room_waits", "room_wait_s", "rooms_made", "room_making_s"):
                out[count] = round(sum(worker[count] for worker in counts.values()), 2)
        if daemon is not None:
            out["tiers"] = tier_bytes(daemon)
        out["samples"] = sampler.samples
        out["own"] = sampler.own
        out["marks"] = sampler.marks
    return out


def task_stream_summary(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds of each kind of work (compute, transfer, disk-read, ...) per task prefix, summed
    over workers, and each worker's seconds of compute: where a job's time went."""
    by_prefix: dict[str, dict[str, float]] = {}
    compute: dict[str, float] = {}
    for task in tasks:
        prefix = dask.utils.key_split(task["key"])
        for span in task["startstops"]:
            seconds = span["stop"] - span["start"]
            row = by_prefix.setdefault(prefix, {"tasks": 0})
            row[span["action"]] = round(row.get(span["action"], 0.0) + seconds, 3)
            if span["action"] == "compute":
                row["tasks"] += 1
                compute[task["worker"]] = round(compute.get(task["worker"], 0.0) + seconds, 3)
    return {"by_prefix": by_prefix, "compute_by_worker": compute}


def run_pressure(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """--rounds rounds of the pressure runs; the bound (stock with no pressure) in the first
    only. Later rounds alternate which of stock and shoal goes first: a job's time moves
    +-20 % between runs on this machine, and the order must not pick the winner."""
    limit = int(args.limit_gib * GiB)
    store = f"{2 * limit // MiB}MiB"
    plan = (
        ("stock", "stock", limit, None),
        ("stock, no pressure", "stock", int(args.frame_gib * 4 * GiB), None),
        ("shoal", "shoal", limit, store),
    )
    rounds = []
    for number in range(args.rounds):
        order = [p for p in plan if number == 0 or p[0] != "stock, no pressure"]
        if number % 2:
            order.reverse()
        runs = {}
        for name, kind, run_limit, run_store in order:
            if name not in args.runs:
                continue
            runs[name] = pressure_run(kind, args, workdir, run_limit, run_store)
            brief = {k: v for k, v in runs[name].items() if k not in ("samples", "marks")}
            log(f"pressure round {number + 1} {name}: {json.dumps(brief)}")
        rounds.append(runs)
    return rounds


# -- report ----------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def secs(run: dict[str, Any], job: str) -> str:
    """A job's seconds, or how it failed."""
    value = run.get(job, "not run")
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def cpu(seconds: dict[str, float | None], who: str) -> str:
    """A CPU-seconds cell: '-' where it was not measured (or a process was restarted)."""
    value = seconds.get(who)
    return "-" if value is None else f"{value:.1f}"


def comparable(runs: dict[str, Any], job: str) -> bool:
    """Whether stock and shoal both finished `job` in this round."""
    return all(isinstance(runs.get(name, {}).get(job), float) for name in ("stock", "shoal"))


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def report(results: dict[str, Any], args: argparse.Namespace, out: Path) -> str:
    lines = [
        "# Dask with shoal as its data plane, beside stock Dask (issue 42)",
        "",
        f"Run {results['when']} on {results['machine']}; dask/distributed {dask.__version__}; "
        f"shoal extension built with the `{results['profile']}` profile. Command: "
        f"`{results['command']}`. Each phase ran stock Dask and shoal's workers in the same "
        "run; the machine is shared with other work, so only ratios within this run compare.",
        "",
    ]
    if "handoff" in results:
        h = results["handoff"]
        lines += [
            f"## Hand-off between two worker processes ({args.handoff_gib:g} GiB values)",
            "",
            f"Median of {args.reps} rounds (best in brackets): client wall time from submitting the "
            "receiver's task to its result; bytes the sender's Dask wrote for the value; the "
            "receiver's private memory (VmRSS - RssShmem) growth while it holds the value.",
            "",
            "| value | run | time (ms) | through the socket | receiver private growth |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for what in ("8-byte dependency", "pyarrow.Table", "pandas.DataFrame"):
            for kind in ("stock", "shoal"):
                rounds = h[kind][what]
                best = min(r["seconds"] for r in rounds)
                lines.append(
                    f"| {what} | {kind} | {med(rounds, 'seconds') * 1e3:.1f} ({best * 1e3:.1f}) "
                    f"| {fmt_bytes(med(rounds, 'socket_bytes'))} "
                    f"| {fmt_bytes(med(rounds, 'private_growth'))} |"
                )
        lines += ["", "| target (shoal) | value | measured | |", "| --- | --- | --- | --- |"]
        floor = med(h["shoal"]["8-byte dependency"], "seconds")
        for what in ("pyarrow.Table", "pandas.DataFrame"):
            rounds = h["shoal"][what]
            over = (med(rounds, "seconds") - floor) * 1e3
            stock = med(h["stock"][what], "seconds") / med(rounds, "seconds")
            wire = max(r["socket_bytes"] for r in rounds)
            growth = max(r["private_growth"] for r in rounds)
            lines += [
                f"| within 2 ms of the 8-byte dependency | {what} "
                f"| {over:+.1f} ms (stock {stock:.0f}x shoal's time) | {mark(over <= 2)} |",
                f"| <= 64 KiB through the socket | {what} "
                f"| {fmt_bytes(wire)} (largest round) | {mark(wire <= 64 * 1024)} |",
                f"| < 1 MiB private growth | {what} "
                f"| {fmt_bytes(growth)} (largest round) | {mark(growth < MiB)} |",
            ]
        lines.append("")
    if "broadcast" in results:
        b = results["broadcast"]
        size = args.broadcast_gib * GiB
        lines += [
            f"## Broadcast of a {args.broadcast_gib:g} GiB numpy array",
            "",
            "Growth of the memory the run's processes hold (the workers' and nannies' private "
            "memory and the store region's pages in memory: `cluster_memory`) and of the host's "
            "memory in use (MemTotal - MemAvailable, lowest of 1 s of readings; other work on the "
            "machine moves it), after minus before, the client's copy made before; in units of the "
            "value's size. The target is judged on the first. Holders: workers that have the key "
            "in their data after the measurement (the scheduler's `who_has` said k in every row).",
            "",
            "| workers | how | stock | shoal | host: stock, shoal | shoal time / stock time "
            "| target <= 1.05x |",
            "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for k in (2, 4):
            for how in ("scatter(broadcast=True)", "scatter + replicate"):
                s, o = b[f"stock k={k}"][how], b[f"shoal k={k}"][how]
                lines.append(
                    f"| {k} | {how} | {s['own'] / size:.2f}x ({s['holders']} holders) "
                    f"| {o['own'] / size:.2f}x ({o['holders']} holders) "
                    f"| {s['growth'] / size:.2f}x, {o['growth'] / size:.2f}x "
                    f"| {o['seconds'] / s['seconds']:.2f} | {mark(o['own'] <= 1.05 * size)} |"
                )
        lines.append("")
    if "pressure" not in results:
        lines += [
            "## groupby-aggregate and set_index under memory pressure",
            "",
            "Measured in a run of its own (`--phases pressure`): `dask-pressure.md`.",
            "",
        ]
    if "pressure" in results:
        p = results["pressure"]
        lines += [
            f"## groupby-aggregate and set_index on a {args.frame_gib:g} GiB frame, 2 workers of "
            f"{args.limit_gib:g} GiB",
            "",
            f"{args.partitions} partitions, persisted first (the frame is about "
            f"{args.frame_gib / (2 * args.limit_gib):.1f}x the workers' total limit), then a "
            "groupby-aggregate and a set_index (tasks shuffle) computed from it. shoal's store "
            f"holds {fmt_bytes(2 * args.limit_gib * GiB)} (the workers' total limit)"
            + (
                "; a value the full store refuses stays with Dask, which spills it its own way. "
                if args.no_burst
                else ", above a burst buffer on the disk Dask spills to: workers keep their most "
                "recently used values mapped (an eighth of the store each) and release the others, "
                "which the daemon moves down to the burst buffer as memory runs short and back by "
                "id when read (spilling by tiering). "
            )
            + "Disk: write_bytes of the workers (and the daemon) "
            "over the run. Peak memory: the highest reading during the run of the memory the run's "
            "processes hold (private memory and the store's pages) and, beside it, of the host's "
            "memory in use minus its first reading.",
            "",
            "| run | persist (s) | groupby (s) | set_index (s) | pauses | restarts | written to disk "
            "| peak memory (host) | values in the store | groupby checksum | set_index checksum |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        ]
        for name, r in p.items():
            used = [u for _, u in r["samples"]]
            peak = max(used) - used[0] if used else 0
            own = max(r["own"], default=0)
            sums = r["checksums"]
            lines.append(
                f"| {name} | {secs(r, 'persist')} | {secs(r, 'groupby')} | {secs(r, 'set_index')} "
                f"| {r['pauses']} "
                f"| {r['restarts']} | {fmt_bytes(r['written'])} | {fmt_bytes(own)} ({fmt_bytes(peak)}) "
                f"| {r['stored']} "
                f"| {sums.get('groupby', 0):016x} | {sums.get('set_index', 0):016x} |"
            )
        stock, bound, ours = p["stock"], p["stock, no pressure"], p["shoal"]
        rounds = [p, *results.get("pressure_later", [])]
        if "tiers" in ours:
            t = ours["tiers"]
            percent = args.drain_dirty_percent
            share = "" if percent is None else f" `--drain-dirty-percent {percent}`"
            lines += [
                "",
                f"shoal's workers released {ours['released']} values to the tiers; the daemon "
                f"wrote {fmt_bytes(t['drained_bytes'])} to the burst buffer ahead of need "
                f"(write-behind, `--drain-after-ms {args.drain_after_ms}`{share}) and "
                f"{fmt_bytes(t['spilled_bytes'])} at eviction, and read "
                f"{fmt_bytes(t['restored_bytes'])} back.",
            ]
        jobs = ("groupby", "set_index")
        ratios = {j: [r["stock"][j] / r["shoal"][j] for r in rounds if comparable(r, j)] for j in jobs}
        lines += [
            "",
            f"{len(rounds)} round(s): the table above is the first; later rounds ran stock and shoal "
            "only, taking turns to go first. Ratio: stock's time / shoal's. CPU: seconds the "
            "workers and the daemon used during the job (none for workers that were restarted: "
            "their time went with them), and the whole machine's busy seconds (of "
            f"{os.cpu_count()} per second).",
            "",
            "| round | first | job | stock (s) | shoal (s) | ratio | CPU stock: workers, host "
            "| CPU shoal: workers + daemon, host |",
            "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for number, r in enumerate(rounds, 1):
            for job in jobs:
                ratio = f"{r['stock'][job] / r['shoal'][job]:.2f}x" if comparable(r, job) else "-"
                sc = r["stock"].get("cpu_s", {}).get(job, {})
                oc = r["shoal"].get("cpu_s", {}).get(job, {})
                lines.append(
                    f"| {number} | {next(iter(r))} | {job} | {secs(r['stock'], job)} "
                    f"| {secs(r['shoal'], job)} | {ratio} | {cpu(sc, 'workers')}, {cpu(sc, 'host')} "
                    f"| {cpu(oc, 'workers')} + {cpu(oc, 'daemon')}, {cpu(oc, 'host')} |"
                )
        same = all(
            run["checksums"].get(j) == stock["checksums"].get(j) is not None
            for r in rounds
            for run in r.values()
            for j in jobs
        )
        pauses = sum(r["shoal"]["pauses"] for r in rounds)
        restarts = sum(r["shoal"]["restarts"] for r in rounds)
        written = max(r["shoal"]["written"] / r["stock"]["written"] for r in rounds)
        lines += ["", "| target (shoal) | measured | |", "| --- | --- | --- |"]
        for job in jobs:
            if ratios[job] and isinstance(bound[job], float):
                speed = statistics.median(ratios[job])
                each = ", ".join(f"{x:.2f}" for x in ratios[job])
                lines.append(
                    f"| {job} >= 1.3x faster than stock spilling | {speed:.3f}x, the median of "
                    f"{len(ratios[job])} round(s) ({each}; the bound, stock with no pressure, in round 1: "
                    f"{stock[job] / bound[job]:.2f}x) | {mark(speed >= 1.3)} |"
                )
            else:
                lines.append(
                    f"| {job} >= 1.3x faster than stock spilling | stock {secs(stock, job)}, "
                    f"no pressure {secs(bound, job)}, shoal {secs(ours, job)} | not comparable |"
                )
        lines += [
            f"| 0 pauses, 0 restarts | {pauses} pauses, {restarts} restarts in all rounds (stock: "
            f"{sum(r['stock']['pauses'] for r in rounds)}, {sum(r['stock']['restarts'] for r in rounds)}) "
            f"| {mark(pauses == 0 and restarts == 0)} |",
            f"| identical checksums | {'equal in every run' if same else 'differ'} | {mark(same)} |",
            f"| no more bytes written to disk than stock | at most {written:.2f}x stock's in a round "
            f"(round 1: {fmt_bytes(ours['written'])} vs {fmt_bytes(stock['written'])}) "
            f"| {mark(written <= 1)} |",
            "",
            f"![host memory over time]({out.with_suffix('.png').name})",
            "",
        ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["pressure"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, r in runs.items():
        start = dict((what, t) for t, what in r["marks"])["groupby"]
        base = r["samples"][0][1]
        xs = [t - start for t, _ in r["samples"]]
        ys = [(u - base) / GiB for _, u in r["samples"]]
        (line,) = ax.plot(xs, ys, label=f"{name}: host")
        ax.plot(xs, [u / GiB for u in r["own"]], color=line.get_color(), linestyle="--", label=f"{name}: own")
        for t, what in r["marks"]:
            if what != "groupby":
                ax.axvline(t - start, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("seconds from the groupby's start (persist before 0; dotted: set_index start, end)")
    ax.set_ylabel("GiB: host in use above the run's start; own (dashed)")
    ax.set_title("groupby-aggregate then set_index on a persisted frame ~2x the workers' limit")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(BENCH / "results" / "dask.md"))
    ap.add_argument("--phases", default="handoff,broadcast,pressure")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of the pressure phase's stock and shoal runs (the bound in the first only); "
        "its targets are judged on the median of the rounds' ratios",
    )
    ap.add_argument("--handoff-gib", type=float, default=1.0)
    ap.add_argument("--broadcast-gib", type=float, default=1.0)
    ap.add_argument("--frame-gib", type=float, default=4.0)
    ap.add_argument("--limit-gib", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument(
        "--runs",
        type=lambda text: text.split(","),
        default=["stock", "stock, no pressure", "shoal"],
        help="the pressure phase's runs, comma-separated (default all three; a report needs all)",
    )
    ap.add_argument(
        "--jobs",
        type=lambda text: text.split(","),
        default=["groupby", "set_index"],
        help="the pressure phase's jobs after the persist, comma-separated (default both; a report "
        "needs both)",
    )
    ap.add_argument(
        "--young",
        type=int,
        default=0,
        help="shoal's workers keep this many bytes of new values private until shared or kept "
        "(shoal_young; default 0, the worker's default)",
    )
    ap.add_argument("--no-burst", action="store_true", help="no burst buffer below the pressure run's store")
    ap.add_argument(
        "--drain-after-ms",
        type=int,
        default=30_000,
        help="the pressure run's daemon writes a value to the burst buffer ahead of need once it is this old "
        "(or once dirty values pass --drain-dirty-percent of the store); 0: at once",
    )
    ap.add_argument(
        "--drain-dirty-percent",
        type=int,
        default=None,
        help="the share of the store dirty values may hold while they wait (default: the daemon's, 25)",
    )
    args = ap.parse_args()
    require_optimized_build()
    out = Path(args.out)
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs, "
        f"{fmt_bytes(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))} RAM, {platform.release()}",
        "profile": build_profile(),
        "command": " ".join(["python", *sys.argv]),
    }
    with tempfile.TemporaryDirectory(prefix="dask-bench-") as tmp:
        workdir = Path(tmp)
        phases = args.phases.split(",")
        if "handoff" in phases:
            results["handoff"] = run_handoff(args, workdir)
        if "broadcast" in phases:
            results["broadcast"] = run_broadcast(args, workdir)
        if "pressure" in phases:
            rounds = run_pressure(args, workdir)
            results["pressure"], results["pressure_later"] = rounds[0], rounds[1:]
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    if "pressure" in results:
        plot(results, out.with_suffix(".png"))
    out.write_text(report(results, args, out) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
