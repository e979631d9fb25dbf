"""Seed 002's IOR-style matrix (IME-FUSE) with fio, through `shoal mount` and beside the
native API, tmpfs and the burst buffer's file system, in one run.

    python bench/fuse/fio_matrix.py --out bench/results/fuse.md [--quick]

Matrix: {write, read} x {sequential, random} x block {16K, 100K, 1M, 10M} x {1, 2, 4, 8}
processes (fio `numjobs`, one file each, psync, `--size` per process). Each cell runs
`--repeat` rounds (default 3) of every target (each mount beside its ceiling, which goes
first alternating by round; the burst directory last), and keeps each target's best run,
as the machine is shared (all runs are kept in the .json). Every run starts once the
drain has written down what earlier runs left queued (before session 24, only a mount's
run waited). Targets:
  mount    a `shoal mount` of a daemon with a burst buffer (DIR/burst) and a backing
           directory (DIR/backing): writes land in the mount's buffers and become objects at
           close; reads of the files the write pass sealed (fio's default invalidate=1 drops
           the page cache of each file first, so reads go through the mount);
  mount-wb a second mount of the same daemon with `--writeback-cache` (the kernel caches
           writes and hands them over in 1 MiB batches);
  warm     (reads only) the mount again with fio's invalidate=0 after one warming pass: a
           sealed file's page cache is kept (FOPEN_KEEP_CACHE), so this is what rereads cost.
           Held to tmpfs read the same way (`tmpfs-warm`): both time-based (WARM_SECONDS,
           as 64 MiB from the page cache takes a few ms, below fio's clock), in paired
           rounds. A file's page-cache speed is set when its pages are allocated: on this VM
           the same cell moved 0.6-1.8x between file instances (tmpfs's as much as the
           mount's) while staying within 5 % across rounds of one instance (NOTES, session 24);
  native   the same I/O pattern through the Python API (`bench/fuse/native.py`, one process
           per fio job): write = create an object of the file's size, copy each block to its
           offset, seal; read = get the object and copy each block out;
  ceiling, ceiling-wb
           the FUSE transport's ceiling on this kernel (crates/shoal-fuse/src/ceiling.rs, its
           example `fuse_ceiling`): a FUSE file system with the mount's session threads and
           kernel settings that copies each write once into warm memory and replies to reads
           from it, keeping nothing else. No FUSE file system that holds its files in memory
           can do less, so where the issue's targets (ratios to tmpfs) exceed what the
           ceiling reaches, this machine's limit for them is the ceiling;
  tmpfs    /dev/shm;
  burst    DIR/plain, a directory on the file system the burst buffer lives on (the page
           cache absorbs the writes: no fsync anywhere, as on tmpfs and the mount).
Per cell: bandwidth (MiB/s) and fio's completion-latency percentiles (p50, p99; the native
driver's per-block copy times). Report: ratios mount/tmpfs and mount/native, latency
tables, and a PNG of throughput per block size (sequential, 1 and 4 processes).

Drain case (the issue's "16 KiB random writes ... while the drain runs"): fio random 16 KiB
writes for `--drain-seconds` (time-based) on each mount and on tmpfs, once idle and once
right after `--backlog` bytes of objects were put through the API (the daemon drains them
to the burst buffer meanwhile; the drain queue is sampled before and after to show it ran).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BLOCKS = {"16K": 16 << 10, "100K": 100 << 10, "1M": 1 << 20, "10M": 10 << 20}
PROCS = [1, 2, 4, 8]
OPS = [("write", "seq"), ("write", "rand"), ("read", "seq"), ("read", "rand")]
TARGETS = ["mount", "mount-wb", "ceiling", "ceiling-wb", "native", "tmpfs", "burst"]
MOUNTS = {"mount": [], "mount-wb": ["--writeback-cache"]}
CEILINGS = {"ceiling": [], "ceiling-wb": ["--writeback-cache"]}
# Rereads with the page cache kept, through the mount and on tmpfs (read cells only).
WARM = ["warm", "tmpfs-warm"]
# Each mount and the ceiling it is held to.
CEILING_OF = {"mount": "ceiling", "mount-wb": "ceiling-wb"}
# Seconds of quiet before each run (after a sync), and after a run on the burst directory.
PAUSE = 0.3
# Page-cache reads (warm, tmpfs-warm) run for this long: 64 MiB at 10-30 GB/s is 2-6 ms.
WARM_SECONDS = 1.0
AFTER_BURST = 1.0


def ceiling_binary() -> Path:
    """Builds the ceiling's example (release, like the daemon) and returns its path."""
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "shoal-fuse", "--example", "fuse_ceiling"],
        cwd=REPO,
        check=True,
    )
    return REPO / "target" / "release" / "examples" / "fuse_ceiling"


class Ceilings:
    """The FUSE ceiling mounted once per kernel setting, for the run."""

    def __init__(self, root: Path, names: list[str]) -> None:
        binary = ceiling_binary()
        self.mounts: dict[str, tuple[Path, subprocess.Popen]] = {}
        for name in names:
            mnt = root / name
            mnt.mkdir()
            log = open(root / f"{name}.log", "ab")
            proc = subprocess.Popen([str(binary), str(mnt), *CEILINGS[name]], stdout=log, stderr=log)
            deadline = time.monotonic() + 30
            while not mounted(mnt):
                assert proc.poll() is None and time.monotonic() < deadline, (root / f"{name}.log").read_text()
                time.sleep(0.05)
            self.mounts[name] = (mnt, proc)

    def stop(self) -> None:
        for _, proc in self.mounts.values():
            proc.terminate()
            proc.wait(10)


def shoal_cmd() -> list[str]:
    """The release build of this tree if there is one, else the installed package's CLI."""
    built = REPO / "target" / "release" / "shoal"
    return [str(built)] if built.exists() else [sys.executable, "-m", "shoal"]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split(" ")[4] == str(path) for line in table)


class Shoal:
    """A daemon (with tiers unless `tiers` is false) and its mounts, for the run."""

    def __init__(self, root: Path, capacity: str, tiers: bool = True) -> None:
        from shoal.testing import Daemon

        self.root = root
        below = ["--burst", str(root / "burst"), "--backing", str(root / "backing")] if tiers else []
        # Prefaulted (the daemon's default): store memory is warm, as the ceiling's is.
        self.daemon = Daemon(
            root, capacity, below, prefault=True, program=shoal_cmd(), log=root / "daemon.log", timeout=30
        )
        self.socket = self.daemon.socket
        self.mounts: dict[str, tuple[Path, subprocess.Popen]] = {}
        for name, extra in MOUNTS.items():
            mnt = root / name
            mnt.mkdir()
            mlog = open(root / f"{name}.log", "ab")
            proc = subprocess.Popen(
                [*shoal_cmd(), "mount", "-s", self.socket, str(mnt), *extra], stdout=mlog, stderr=mlog
            )
            while not mounted(mnt):
                assert proc.poll() is None, (root / f"{name}.log").read_text()
                time.sleep(0.05)
            self.mounts[name] = (mnt, proc)

    def clear(self) -> None:
        import shoal

        client = shoal.Client(self.socket)
        for info in client.ls():
            client.unlink(info.name)
        client.close()

    def backlog(self, nbytes: int) -> None:
        """Puts `nbytes` of 8 MiB objects through the API: the drain writes them down."""
        import shoal

        client = shoal.Client(self.socket)
        block = 8 << 20
        payload = os.urandom(block)
        n = max(nbytes // block, 1)
        client.put_batch([shoal.ObjectID.from_random() for _ in range(n)], [payload] * n)
        client.close()

    def queue_depth(self) -> int:
        import shoal

        client = shoal.Client(self.socket)
        depth = client.tiers().get("queue_depth", 0)
        client.close()
        return depth

    def settle(self, limit: float = 60.0) -> None:
        """Waits (at most `limit` s) until the drain has written down everything
        queued: a run then pays for its own write-behind, not for the runs
        before it (the drain case below measures writes beside a drain)."""
        import shoal

        client = shoal.Client(self.socket)
        deadline = time.monotonic() + limit
        while client.tiers().get("queue_depth", 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        for _, proc in self.mounts.values():
            proc.terminate()
            proc.wait(10)
        self.daemon.teardown(check=False, timeout=30)


def fio(
    directory: Path,
    rw: str,
    pattern: str,
    bs: int,
    procs: int,
    size: int,
    seconds: float = 0,
    invalidate: bool = True,
) -> dict:
    """One fio job of `procs` processes (`seconds` > 0: time-based); returns MiB/s and clat
    percentiles (µs)."""
    mode = {"write": {"seq": "write", "rand": "randwrite"}, "read": {"seq": "read", "rand": "randread"}}
    command = [
        "fio",
        "--name=cell",
        f"--directory={directory}",
        f"--rw={mode[rw][pattern]}",
        f"--bs={bs}",
        f"--size={size}",
        f"--numjobs={procs}",
        "--ioengine=psync",
        "--group_reporting",
        "--output-format=json",
        "--clat_percentiles=1",
        "--percentile_list=50:99",
    ]
    if seconds:
        command += ["--time_based", f"--runtime={seconds}"]
    if not invalidate:
        command.append("--invalidate=0")
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0][rw]
    pct = job["clat_ns"].get("percentile", {})
    return {
        "mibs": job["bw_bytes"] / (1 << 20),
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
    }


def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda r: r["mibs"])


def rounds_summary(runs: list[dict]) -> dict:
    """A target's rounds in a cell: its best run, with every round's MiB/s in order."""
    return dict(best(runs), runs=[round(r["mibs"]) for r in runs])


def native(socket: str, rw: str, pattern: str, bs: int, procs: int, size: int) -> dict:
    """The native driver's cell; a driver that dies is tried once more, then recorded as a
    failed cell (0 MiB/s, with the reason) rather than ending the run."""
    command = [sys.executable, str(HERE / "native.py"), socket, rw, pattern, str(bs), str(procs), str(size)]
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return json.loads(done.stdout)
    print(f"native driver failed ({done.returncode}): {done.stderr[-500:]}", file=sys.stderr, flush=True)
    return {"mibs": 0.0, "p50_us": 0.0, "p99_us": 0.0, "failed": done.returncode}


def clean(directory: Path) -> None:
    for f in directory.iterdir():
        f.unlink()


def drain_case(args: argparse.Namespace, store: Shoal, tmpfs: Path) -> list[dict]:
    """16 KiB random writes, idle and while the drain runs (see the module's doc)."""
    rows = []
    size = 64 << 20
    for procs in (1, 4):
        for target in ["mount", "mount-wb", "tmpfs"]:
            if target not in args.targets:
                continue
            directory = tmpfs if target == "tmpfs" else store.mounts[target][0]
            row: dict = {"target": target, "procs": procs}
            for phase in ("idle", "drain"):
                store.clear()
                clean(directory)
                if phase == "drain":
                    store.backlog(args.backlog)
                    row["queue_before"] = store.queue_depth()
                row[phase] = fio(directory, "write", "rand", 16 << 10, procs, size, args.drain_seconds)
                if phase == "drain":
                    row["queue_after"] = store.queue_depth()
            rows.append(row)
            print(json.dumps(row), flush=True)
    store.clear()
    return rows


def warm_reads(store: Shoal, tmpfs: Path, repeat: int, pattern: str, bs: int, procs: int, size: int) -> dict:
    """Rereads with the page cache kept: the mount's sealed files (`warm`) and tmpfs's
    (`tmpfs-warm`), each warmed by one pass, then `repeat` time-based rounds, the order
    alternating."""
    directories = {"warm": store.mounts["mount"][0], "tmpfs-warm": tmpfs}
    store.settle()
    for directory in directories.values():
        fio(directory, "read", pattern, bs, procs, size, invalidate=False)
    runs: dict[str, list[dict]] = {t: [] for t in directories}
    for r in range(repeat):
        for target in list(directories)[:: 1 if r % 2 == 0 else -1]:
            os.sync()
            time.sleep(PAUSE)
            one = fio(directories[target], "read", pattern, bs, procs, size, WARM_SECONDS, invalidate=False)
            runs[target].append(one)
    return {target: rounds_summary(done) for target, done in runs.items()}


def warm_ratio(cell: dict) -> float | None:
    """warm over tmpfs: the median of paired rounds (runs since session 24), else the old
    single short run over tmpfs's best (earlier runs' .json)."""
    if "warm" not in cell:
        return None
    if "tmpfs-warm" in cell:
        return paired(cell, "warm", "tmpfs-warm")
    return cell["warm"]["mibs"] / cell["tmpfs"]["mibs"] if "tmpfs" in cell else None


def round_order(targets: list[str], r: int) -> list[str]:
    """The order of round `r`: each mount beside its ceiling, which of the two goes first
    alternating by round, then the other targets, the burst directory last. Reading the burst
    directory's files from the disk slowed whatever ran next by up to 40 % even after a sync
    and a pause (a second of rest cures it: AFTER_BURST); a rotated order had put the mount
    after it in two rounds of three."""
    fuse: list[str] = []
    for mount, ceiling in CEILING_OF.items():
        pair = (mount, ceiling) if r % 2 == 0 else (ceiling, mount)
        fuse += [t for t in pair if t in targets]
    rest = sorted((t for t in targets if t not in fuse), key=lambda t: t == "burst")
    return fuse + rest


def run_target(
    store: Shoal,
    ceilings: Ceilings,
    tmpfs: Path,
    burst: Path,
    target: str,
    rw: str,
    pattern: str,
    bs: int,
    procs: int,
    size: int,
) -> dict:
    """One fio run (or native driver run) of a cell on `target`; a write starts from an
    empty directory, and every run from a drain queue that is empty."""
    # Every target waits for the drain: a ceiling (or tmpfs) run right after a mount's
    # write run would otherwise share the machine with that run's write-behind. (Before
    # session 24 only the mounts waited; over three runs the mount-first rounds' write
    # ratios were 1.000 and the ceiling-first rounds' 0.982, medians of paired rounds.)
    store.settle()
    if target == "native":
        return native(store.socket, rw, pattern, bs, procs, size)
    if target in MOUNTS:
        directory = store.mounts[target][0]
    elif target in CEILINGS:
        directory = ceilings.mounts[target][0]
    else:
        directory = tmpfs if target == "tmpfs" else burst
    if rw == "write":
        if target in MOUNTS:
            store.clear()
        else:
            clean(directory)
    # What the run before left to the kernel (dirty pages, freed page cache, exiting
    # processes) slowed whichever target came next by up to 40 %.
    os.sync()
    time.sleep(PAUSE)
    return fio(directory, rw, pattern, bs, procs, size)


def run(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="fuse-bench-", dir=args.dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="shoal-fuse-bench-", dir="/dev/shm"))
    burst = root / "plain"
    burst.mkdir()
    blocks = {k: v for k, v in BLOCKS.items() if not args.quick or k in ("16K", "1M")}
    procs = [1, 4] if args.quick else PROCS
    if args.blocks:
        blocks = {k: BLOCKS[k] for k in args.blocks.split(",")}
    if args.procs:
        procs = [int(n) for n in args.procs.split(",")]
    ops = [op for op in OPS if not args.ops or op[0] in args.ops.split(",")]
    res: dict = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "cells": []}
    res["load_before"] = loadavg()
    res["size_per_proc"] = args.size
    res["repeat"] = args.repeat
    res["drain_seconds"] = args.drain_seconds
    res["backlog"] = args.backlog
    res["settle"] = "every run"
    res["tiers"] = not args.no_tiers
    store = Shoal(root, args.capacity, tiers=not args.no_tiers)
    ceilings = Ceilings(root, [t for t in CEILINGS if t in args.targets])
    try:
        for name, bs in blocks.items():
            size = max(args.size // bs, 2) * bs
            for n in procs:
                for rw, pattern in ops:
                    cell = {"rw": rw, "pattern": pattern, "block": name, "procs": n}
                    runs: dict[str, list[dict]] = {t: [] for t in args.targets}
                    # Rounds of every target: a slow spell of the shared machine
                    # falls on all targets alike, not on whichever ran then.
                    for r in range(args.repeat):
                        for target in round_order(args.targets, r):
                            one = run_target(store, ceilings, tmpfs, burst, target, rw, pattern, bs, n, size)
                            runs[target].append(one)
                            if target == "burst":
                                time.sleep(AFTER_BURST)
                    for target in args.targets:
                        cell[target] = rounds_summary(runs[target])
                    if "mount" in args.targets and "tmpfs" in args.targets and rw == "read":
                        cell.update(warm_reads(store, tmpfs, args.repeat, pattern, bs, n, size))
                    res["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
        if args.drain_seconds and not args.no_tiers:
            res["drain"] = drain_case(args, store, tmpfs)
    finally:
        ceilings.stop()
        store.stop()
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    res["load_after"] = loadavg()
    return res


def pool(results: list[dict]) -> dict:
    """Several full runs as one: per cell and target the best run of all of them (its
    latency percentiles with it) and every round's MiB/s, in run order (so a mount's and
    its ceiling's rounds stay paired); the drain case of each run. One run's best of 3 on
    this shared machine still moves a cell by 10-20 % from run to run, for the ceiling as
    much as for the mount; the best of all rounds of several runs converges on what each
    target can do when nothing else interferes."""
    first = results[0]
    pooled = {
        "started": ", ".join(r["started"] for r in results),
        "pooled": len(results),
        "size_per_proc": first["size_per_proc"],
        "repeat": sum(r.get("repeat", 1) for r in results),
        "drain_seconds": first.get("drain_seconds"),
        "backlog": first.get("backlog"),
        "tiers": first.get("tiers", True),
        "settle": first.get("settle") if len({r.get("settle") for r in results}) == 1 else None,
        "load_before": "; ".join(r["load_before"] for r in results),
        "load_after": "; ".join(r["load_after"] for r in results),
        "cells": [],
        "drain": [dict(d, run=r["started"]) for r in results for d in r.get("drain") or []],
    }
    for r in results[1:]:
        assert r["size_per_proc"] == first["size_per_proc"], "runs of different sizes"
    key = ("rw", "pattern", "block", "procs")
    for cell in first["cells"]:
        same = [c for r in results for c in r["cells"] if all(c[k] == cell[k] for k in key)]
        merged = {k: cell[k] for k in key}
        # Warm rounds paired with tmpfs-warm (since session 24) are not pooled with the
        # earlier single short warm runs.
        paired_warm = [c for c in same if "tmpfs-warm" in c] or same
        for target in TARGETS + WARM:
            among = paired_warm if target in WARM else same
            entries = [c[target] for c in among if target in c]
            if len(entries) != len(among):
                continue
            merged[target] = dict(max(entries, key=lambda e: e["mibs"]))
            merged[target]["runs"] = [x for e in entries for x in e.get("runs", [round(e["mibs"])])]
        pooled["cells"].append(merged)
    return pooled


def paired(cell: dict, target: str, versus: str) -> float | None:
    """The median over rounds of `target`'s MiB/s over `versus`'s in the same round (they
    run back to back: a mount and its ceiling, warm and tmpfs-warm), or None without both
    rounds' figures."""
    a, b = cell[target].get("runs"), cell[versus].get("runs")
    if not a or not b or len(a) != len(b) or not all(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def targets_met(res: dict) -> list[str]:
    """The issue's targets, per mount: how many cells meet each."""
    cells = res["cells"]
    lines = ["| target | cells | " + " | ".join(m for m in MOUNTS if m in cells[0]) + " |"]
    lines.append("|---|---:|" + "---:|" * sum(m in cells[0] for m in MOUNTS))

    def row(title: str, chosen: list[dict], versus: str, floor: float) -> None:
        chosen = [c for c in chosen if versus in c and c[versus]["mibs"] > 0]
        if not chosen:
            return
        counts = []
        for m in MOUNTS:
            if m in cells[0]:
                ok = sum(c[m]["mibs"] >= floor * c[versus]["mibs"] for c in chosen)
                worst = min(c[m]["mibs"] / c[versus]["mibs"] for c in chosen)
                counts.append(f"{ok} met (worst {worst:.2f})")
        lines.append(f"| {title} | {len(chosen)} | " + " | ".join(counts) + " |")

    big = ("1M", "10M")
    seq_writes = [c for c in cells if (c["rw"], c["pattern"]) == ("write", "seq") and c["block"] in big]
    row("sequential writes >= 0.8x tmpfs, 1M/10M", seq_writes, "tmpfs", 0.8)
    reads = [c for c in cells if c["rw"] == "read"]
    row("reads of sealed files >= 0.9x tmpfs", reads, "tmpfs", 0.9)
    warm = [r for r in map(warm_ratio, reads) if r is not None]
    if warm:  # a subset run without tmpfs has nothing to hold them to
        ok = sum(r >= 0.9 for r in warm)
        how = "paired rounds" if all("tmpfs-warm" in c for c in reads) else "one run each"
        lines.append(
            f"| the same, page cache kept (warm vs tmpfs, {how}) | {len(warm)} | "
            f"{ok} met (worst {min(warm):.2f}, median {statistics.median(warm):.2f}) | |"
        )
    small = [c for c in cells if (c["rw"], c["pattern"], c["block"]) == ("write", "rand", "16K")]
    row("16 KiB random writes >= 0.5x tmpfs", small, "tmpfs", 0.5)
    large = [c for c in cells if c["block"] in big]
    row("within 20 % of the native API, blocks >= 1M", large, "native", 0.8)
    if any(c in cells[0] for c in CEILINGS):
        lines += ["", *ceiling_rows(cells, seq_writes, reads, small, large)]
    return lines


def ceiling_rows(
    cells: list[dict], seq_writes: list[dict], reads: list[dict], small: list[dict], big: list[dict]
) -> list[str]:
    """The same targets against this kernel's FUSE ceiling: how far the ratios to tmpfs (or to
    the native API) are reachable through FUSE at all (the ceiling's own ratio), and each mount
    within 10 % of its ceiling (same kernel settings)."""
    mounts = [m for m in MOUNTS if m in cells[0] and CEILING_OF[m] in cells[0]]
    lines = [
        "Against the FUSE ceiling (the least any FUSE file system holding its files in memory does, "
        "same session and kernel settings): the ceiling's own ratio to what the target compares "
        "with (tmpfs, or the native API) says whether the target is reachable through FUSE on this "
        "machine; the mount is held to 0.9x its ceiling.",
        "",
        "| target | cells | "
        + " | ".join(f"{CEILING_OF[m]}/versus (worst, median)" for m in mounts)
        + " | "
        + " | ".join(f"{m} >= 0.9x {CEILING_OF[m]}" for m in mounts)
        + " | "
        + " | ".join(f"{m} paired (median of rounds) >= 0.9" for m in mounts)
        + " |",
        "|---|---:|" + "---:|" * (3 * len(mounts)),
    ]

    def median(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2]

    for title, chosen, versus in [
        ("sequential writes, 1M/10M (versus tmpfs)", seq_writes, "tmpfs"),
        ("reads of sealed files (versus tmpfs)", reads, "tmpfs"),
        ("16 KiB random writes (versus tmpfs)", small, "tmpfs"),
        ("blocks >= 1M (versus the native API)", big, "native"),
    ]:
        chosen = [c for c in chosen if versus in c and c[versus]["mibs"] > 0]
        if not chosen:
            continue
        reach, held, pairs = [], [], []
        for m in mounts:
            ceiling = CEILING_OF[m]
            ratios = [c[ceiling]["mibs"] / c[versus]["mibs"] for c in chosen]
            reach.append(f"{min(ratios):.2f}, {median(ratios):.2f}")
            ok = [c for c in chosen if c[ceiling]["mibs"] > 0 and c[m]["mibs"] >= 0.9 * c[ceiling]["mibs"]]
            worst = min(c[m]["mibs"] / c[ceiling]["mibs"] for c in chosen if c[ceiling]["mibs"] > 0)
            held.append(f"{len(ok)} met (worst {worst:.2f})")
            medians = [x for x in (paired(c, m, CEILING_OF[m]) for c in chosen) if x is not None]
            met = sum(x >= 0.9 for x in medians)
            pairs.append(f"{met} met (worst {min(medians):.2f})" if medians else "-")
        lines.append(
            f"| {title} | {len(chosen)} | "
            + " | ".join(reach)
            + " | "
            + " | ".join(held)
            + " | "
            + " | ".join(pairs)
            + " |"
        )
    return lines


def report(res: dict, png: str) -> str:
    targets = [t for t in TARGETS if t in res["cells"][0]]
    mounts = [m for m in MOUNTS if m in targets]
    versus = [(m, v) for v in ("tmpfs", "native") if v in targets for m in mounts]
    versus += [(m, CEILING_OF[m]) for m in mounts if CEILING_OF[m] in targets]
    lines = [
        "# POSIX view: seed 002's IOR matrix with fio (bench/fuse/fio_matrix.py)",
        "",
        f"Run {res['started']}, {res['size_per_proc'] >> 20} MiB per process"
        + ("" if res.get("tiers", True) else ", a memory-only daemon (no tiers, no drain)")
        + ", best of "
        f"{res.get('repeat', 1)} rounds per cell"
        + (f" pooled from {res['pooled']} full runs" if res.get("pooled") else "")
        + " (targets interleaved; "
        + ("every" if res.get("settle") == "every run" else "a mount's")
        + " run starts with "
        f"the drain queue empty), load {res['load_before']} before / "
        f"{res['load_after']} after (2 shared cores).",
        *([res["note"]] if res.get("note") else []),
        "",
        "## The issue's targets",
        "",
        *targets_met(res),
        "",
    ]
    if res.get("drain"):
        lines += [
            "## 16 KiB random writes while the drain runs",
            "",
            f"fio randwrite 16K for {res['drain_seconds']} s, 64 MiB file per process; drain: "
            f"{res['backlog'] >> 20} MiB of objects put just before (drain queue before -> after "
            "fio). Target: drain >= 0.8x idle, and idle >= 0.5x tmpfs.",
            "",
            "| target | procs | idle MiB/s | drain MiB/s | drain/idle | queue before -> after |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for d in res["drain"]:
            idle, busy = d["idle"]["mibs"], d["drain"]["mibs"]
            run = f" (run {d['run']})" if "run" in d else ""
            lines.append(
                f"| {d['target']}{run} | {d['procs']} | {idle:.0f} | {busy:.0f} | {ratio(busy, idle)} | "
                f"{d['queue_before']} -> {d['queue_after']} |"
            )
        lines.append("")
    lines += [
        "## Throughput (MiB/s) and ratios",
        "",
        "| op | block | procs | "
        + " | ".join(targets)
        + " | "
        + " | ".join(f"{m}/{v}" for m, v in versus)
        + " | warm/tmpfs |",
        "|---|---|---:|" + "---:|" * (len(targets) + len(versus) + 1),
    ]
    for c in res["cells"]:
        values = " | ".join(f"{c[t]['mibs']:.0f}" for t in targets)
        ratios = " | ".join(ratio(c[m]["mibs"], c[v]["mibs"]) for m, v in versus)
        w = warm_ratio(c)
        warm = f"{w:.2f}" if w is not None else "-"
        lines.append(
            f"| {c['rw']} {c['pattern']} | {c['block']} | {c['procs']} | {values} | {ratios} | {warm} |"
        )
    lines += [
        "",
        "## Completion latency per operation (µs, p50 / p99)",
        "",
        "| op | block | procs | " + " | ".join(targets) + " |",
        "|---|---|---:|" + "---:|" * len(targets),
    ]
    for c in res["cells"]:
        values = " | ".join(f"{c[t]['p50_us']:.0f} / {c[t]['p99_us']:.0f}" for t in targets)
        lines.append(f"| {c['rw']} {c['pattern']} | {c['block']} | {c['procs']} | {values} |")
    lines += ["", f"![throughput per block size]({Path(png).name})", ""]
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = [t for t in TARGETS if t in res["cells"][0]]
    panels = sorted({(c["rw"], c["procs"]) for c in res["cells"] if c["pattern"] == "seq"})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
    for ax, (rw, procs) in zip(axes[0], panels, strict=True):
        cells = [c for c in res["cells"] if (c["rw"], c["procs"], c["pattern"]) == (rw, procs, "seq")]
        x = [c["block"] for c in cells]
        for t in targets:
            ax.plot(x, [c[t]["mibs"] for c in cells], marker="o", label=t)
        ax.set_title(f"sequential {rw}, {procs} proc")
        ax.set_xlabel("block size")
        ax.set_ylabel("MiB/s")
        ax.set_yscale("log")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/fuse.md")
    p.add_argument("--dir", default=str(REPO / "bench"), help="where the daemon's tiers and the burst dir go")
    p.add_argument("--size", type=int, default=64 << 20, help="bytes per process")
    # 2 GiB: at 8 processes the mounts' files (8 x 64 MiB) and the native driver's objects
    # (as many) must fit together, or the files are evicted and their reads restore them.
    p.add_argument("--capacity", default="2GiB")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--quick", action="store_true", help="blocks 16K and 1M, 1 and 4 processes")
    p.add_argument("--blocks", help="block sizes to run, e.g. 1M,10M (default: all, or --quick's)")
    p.add_argument("--procs", help="process counts to run, e.g. 8 (default: all, or --quick's)")
    p.add_argument("--ops", help="write, read or both (default)")
    p.add_argument("--report-only", action="store_true", help="redo the report from OUT's .json")
    p.add_argument("--pool", help="no run: one report of these runs' .json files (comma-separated), pooled")
    p.add_argument("--note", help="what else ran on the machine meanwhile (kept in the .json and the report)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of fio runs per cell (the best is kept)")
    p.add_argument("--drain-seconds", type=float, default=3, help="the drain case's fio runtime (0: skip)")
    p.add_argument("--backlog", type=int, default=512 << 20, help="bytes put before the drain case")
    p.add_argument(
        "--no-tiers",
        action="store_true",
        help="a memory-only daemon: no drain beside the writes (its cost apart from the mount's)",
    )
    args = p.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    args.targets = args.targets.split(",")
    if importlib.util.find_spec("matplotlib") is None:
        sys.exit("matplotlib is missing (the PNG): pip install matplotlib into the venv")
    if shutil.which("fio") is None:
        sys.exit("fio is missing: scripts/setup-test-tools.sh installs it")
    import shoal

    if "fuse" not in shoal.features() and not (args.pool or args.report_only):
        sys.exit("this shoal has no `shoal mount` (the fuse feature): SHOAL_FEATURES=full ./scripts/setup.sh")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.pool:
        res = pool([json.loads(Path(f).read_text()) for f in args.pool.split(",")])
    elif args.report_only:
        res = json.loads(out.with_suffix(".json").read_text())
    else:
        res = run(args)
    if args.note:
        res["note"] = args.note
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    png = str(out.with_suffix(".png"))
    plot(res, png)
    out.write_text(report(res, png))
    print(f"wrote {out}, {png}")


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    main()
