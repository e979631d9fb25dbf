"""Seed 002's IOR-style matrix (IME-FUSE) with fio, through `shoal mount` and beside the
native API, tmpfs and the burst buffer's file system, in one run.

    python bench/fuse/fio_matrix.py --out bench/results/fuse.md [--quick]

Matrix: {write, read} x {sequential, random} x block {16K, 100K, 1M, 10M} x {1, 2, 4, 8}
processes (fio `numjobs`, one file each, psync, `--size` per process). Targets:
  mount    a `shoal mount` of a daemon with a burst buffer (DIR/burst) and a backing
           directory (DIR/backing): writes land in the mount's buffers and become objects at
           close; reads of the files the write pass sealed (fio's default invalidate=1 drops
           the page cache of each file first, so reads go through the mount);
  native   the same I/O pattern through the Python API (`bench/fuse/native.py`, one process
           per fio job): write = create an object of the file's size, copy each block to its
           offset, seal; read = get the object and copy each block out;
  tmpfs    /dev/shm;
  burst    DIR/plain, a directory on the file system the burst buffer lives on (the page
           cache absorbs the writes: no fsync anywhere, as on tmpfs and the mount).
Per cell: bandwidth (MiB/s) and fio's completion-latency percentiles (p50, p99; the native
driver's per-block copy times). Report: ratios mount/tmpfs and mount/native, latency
tables, and a PNG of throughput per block size (sequential, 1 and 4 processes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
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
TARGETS = ["mount", "native", "tmpfs", "burst"]


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
    """A daemon with tiers and a mount of it, for the run."""

    def __init__(self, root: Path, capacity: str) -> None:
        self.root = root
        self.socket = str(root / "s.sock")
        self.mnt = root / "mnt"
        self.mnt.mkdir()
        log = open(root / "daemon.log", "ab")
        self.daemon = subprocess.Popen(
            [*shoal_cmd(), "serve", "-s", self.socket, "-m", capacity, "--no-prefault"]
            + ["--burst", str(root / "burst"), "--backing", str(root / "backing")],
            stdout=log,
            stderr=log,
        )
        import shoal

        deadline = time.monotonic() + 30
        while True:
            try:
                shoal.Client(self.socket).close()
                break
            except Exception:
                assert time.monotonic() < deadline, "daemon did not start"
                time.sleep(0.05)
        mlog = open(root / "mount.log", "ab")
        self.mount = subprocess.Popen(
            [*shoal_cmd(), "mount", "-s", self.socket, str(self.mnt)], stdout=mlog, stderr=mlog
        )
        while not mounted(self.mnt):
            assert self.mount.poll() is None, (root / "mount.log").read_text()
            time.sleep(0.05)

    def clear(self) -> None:
        import shoal

        client = shoal.Client(self.socket)
        for info in client.ls():
            client.unlink(info.name)
        client.close()

    def stop(self) -> None:
        self.mount.terminate()
        self.mount.wait(10)
        self.daemon.terminate()
        self.daemon.wait(30)


def fio(directory: Path, rw: str, pattern: str, bs: int, procs: int, size: int) -> dict:
    """One fio job of `procs` processes; returns MiB/s and clat percentiles (µs)."""
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
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0][rw]
    pct = job["clat_ns"].get("percentile", {})
    return {
        "mibs": job["bw_bytes"] / (1 << 20),
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
    }


def native(socket: str, rw: str, pattern: str, bs: int, procs: int, size: int) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "native.py"), socket, rw, pattern, str(bs), str(procs), str(size)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def run(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="fuse-bench-", dir=args.dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="shoal-fuse-bench-", dir="/dev/shm"))
    burst = root / "plain"
    burst.mkdir()
    blocks = {k: v for k, v in BLOCKS.items() if not args.quick or k in ("16K", "1M")}
    procs = [1, 4] if args.quick else PROCS
    res: dict = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "cells": []}
    res["load_before"] = loadavg()
    res["size_per_proc"] = args.size
    store = Shoal(root, args.capacity)
    try:
        for name, bs in blocks.items():
            size = max(args.size // bs, 2) * bs
            for n in procs:
                for rw, pattern in OPS:
                    cell = {"rw": rw, "pattern": pattern, "block": name, "procs": n}
                    for target in args.targets:
                        if target == "mount":
                            if rw == "write":
                                store.clear()
                            cell[target] = fio(store.mnt, rw, pattern, bs, n, size)
                        elif target == "native":
                            cell[target] = native(store.socket, rw, pattern, bs, n, size)
                        else:
                            directory = tmpfs if target == "tmpfs" else burst
                            if rw == "write":
                                for f in directory.iterdir():
                                    f.unlink()
                            cell[target] = fio(directory, rw, pattern, bs, n, size)
                    res["cells"].append(cell)
                    print(json.dumps(cell), flush=True)
    finally:
        store.stop()
        shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    res["load_after"] = loadavg()
    return res


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def report(res: dict, png: str) -> str:
    targets = [t for t in TARGETS if t in res["cells"][0]]
    lines = [
        "# POSIX view: seed 002's IOR matrix with fio (bench/fuse/fio_matrix.py)",
        "",
        f"Run {res['started']}, {res['size_per_proc'] >> 20} MiB per process, load "
        f"{res['load_before']} before / {res['load_after']} after (2 shared cores).",
        "",
        "## Throughput (MiB/s) and ratios",
        "",
        "| op | block | procs | " + " | ".join(targets) + " | mount/tmpfs | mount/native |",
        "|---|---|---:|" + "---:|" * len(targets) + "---:|---:|",
    ]
    for c in res["cells"]:
        values = " | ".join(f"{c[t]['mibs']:.0f}" for t in targets)
        mt = ratio(c["mount"]["mibs"], c["tmpfs"]["mibs"]) if "tmpfs" in c else "-"
        mn = ratio(c["mount"]["mibs"], c["native"]["mibs"]) if "native" in c else "-"
        lines.append(f"| {c['rw']} {c['pattern']} | {c['block']} | {c['procs']} | {values} | {mt} | {mn} |")
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
    p.add_argument("--size", type=int, default=32 << 20, help="bytes per process")
    p.add_argument("--capacity", default="1GiB")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--quick", action="store_true", help="blocks 16K and 1M, 1 and 4 processes")
    args = p.parse_args()
    args.targets = args.targets.split(",")
    if shutil.which("fio") is None:
        sys.exit("fio is missing: scripts/setup.sh installs it")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = run(args)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    png = str(out.with_suffix(".png"))
    plot(res, png)
    out.write_text(report(res, png))
    print(f"wrote {out}, {png}")


if __name__ == "__main__":
    os.environ.setdefault("NO_COLOR", "1")
    main()
