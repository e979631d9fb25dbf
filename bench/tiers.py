"""Tiers below memory (issue 10): shoal beside Ray's object spilling and the disk's limits.

    python bench/tiers.py --out bench/results/tiers.md

One run, one directory (--dir, default a fresh one under bench/.tiers-run, on
the file system the repository is on), every writer and reader on it:
  disk     dd with O_DIRECT (oflag=direct conv=fsync, then iflag=direct), the
           block size = the object size rounded up to 4 KiB: the device's own
           sequential write and read limits at that size (one dd run right
           before each shoal run of that size, so both see the same device);
  shoal    a daemon with --burst DIR/burst: put N objects (memory durability),
           then `stage_out` (spill: the images are written, fsync'ed and
           renamed, memory freed) and `stage_in` (restore) of all of them,
           timed; the page cache of the images is dropped (fadvise DONTNEED
           after a sync) before each restore so reads come from the device;
  ray      Ray 2.60 (bench/.venv-ray, bench/setup_ray.sh) with a 256 MiB object
           store and object_spilling_config = a filesystem directory DIR/ray:
           the puts of the same objects spill (timed: the put loop, and the
           put loop plus an os.sync(), since Ray does not fsync its spill
           files and shoal's stage_out does); then filler
           objects of the store's size push every one of them out to disk and
           are freed, and `ray.get` of each restores it (page cache dropped the
           same way), so every byte of Ray's restore comes from disk, as shoal's;
  get      a get of a 100 MB object that only the burst buffer holds, against
           size / the disk's O_DIRECT read limit;
  restart  a daemon whose manifest holds --million objects (written by
           crates/shoal-tiers/examples/fill_manifest.rs): time from the start
           of `shoal serve` until a `contains` of one of them returns True,
           beside the same with an empty manifest;
  drain    foreground put throughput (1 MiB objects) of a daemon with a burst
           buffer and a backing directory (the write-behind drain copies every
           put down while the puts run) against a daemon without tiers.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
MiB = 2**20
SIZES = [64 * 1024, MiB, 16 * MiB, 100_000_000]
LABELS = {64 * 1024: "64 KiB", MiB: "1 MiB", 16 * MiB: "16 MiB", 100_000_000: "100 MB"}
RAY_STORE = 256 * MiB
TARGET_SPILL, TARGET_GET, TARGET_RESTART_S, TARGET_DRAIN = 0.8, 1.25, 2.0, 0.10


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def drop_cache(directory):
    """Writes back and drops the page cache of every file under `directory`, so the next
    read comes from the device (fadvise works on clean pages: sync first)."""
    os.sync()
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def count_for(size, total):
    return max(4, total // size)


# -- disk ------------------------------------------------------------------------------------


# Runs per size of dd and of shoal's spill and restore (the best is reported, every run is
# in the JSON): one run of 512 MiB takes a fraction of a second, and a shared machine's
# virtual disk varies by up to 2x between such runs (fio here: 1.1-2.8 GiB/s for the same
# 4 MiB direct reads a second apart). So the runs are interleaved: each shoal run follows
# a dd run of the same size, and both see the same phases of the device.
REPEAT = 5


def dd_once(directory, size, total):
    block = -(-size // 4096) * 4096
    count = max(4, total // block)
    path = os.path.join(directory, "dd.bin")
    rates = []
    for cmd in (
        ["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}", "oflag=direct", "conv=fsync"],
        ["dd", f"if={path}", "of=/dev/null", f"bs={block}", "iflag=direct"],
    ):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        rates.append(block * count / (time.perf_counter() - start))
    os.unlink(path)
    return rates


# -- shoal -----------------------------------------------------------------------------------


def start_daemon(directory, name, capacity, *args, wait=True):
    """A `shoal serve` (shoal.testing.Daemon, prefaulted as `serve` is by default) with its
    socket in `directory/name` and its output in `directory/name.log`; with `wait=False`
    not waited for (`served` times the start)."""
    from shoal.testing import Daemon

    log = os.path.join(directory, f"{name}.log")
    return Daemon(
        Path(directory) / name, capacity, args, connect=False, prefault=True, log=log, wait=wait, timeout=60
    )


def served(daemon, timeout, probe=None):
    """Connects, retrying until the daemon serves; with `probe`, until it holds that id.
    Returns the seconds since the start of its process."""
    import shoal

    deadline = time.monotonic() + timeout
    while True:
        if daemon.process.poll() is not None:
            raise RuntimeError(f"daemon exited ({daemon.process.returncode}), see {daemon.log_path}")
        try:
            client = shoal.connect(daemon.socket)
            if probe is None or client.contains(probe):
                return time.monotonic() - daemon.started
        except shoal.ShoalError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"daemon at {daemon.socket} did not serve within {timeout} s")
        time.sleep(0.002)


def put_many(client, payload, count, batch_bytes=64 * MiB):
    import shoal

    ids = [shoal.ObjectID.from_random() for _ in range(count)]
    per = max(1, batch_bytes // len(payload))
    for start in range(0, count, per):
        chunk = ids[start : start + per]
        client.put_batch(chunk, [payload] * len(chunk), timeout_ms=0)
    return ids


def shoal_spill_restore(directory, total):
    import numpy as np

    burst = os.path.join(directory, "burst")
    daemon = start_daemon(directory, "spill", "2GiB", "--burst", burst)
    out = {}
    try:
        client = daemon.client()
        for size in SIZES:
            payload = memoryview(np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)).cast("B")
            count = count_for(size, total)
            spills, restores, disk = [], [], []
            for _ in range(REPEAT):
                disk.append(dd_once(directory, size, total))
                ids = put_many(client, payload, count)
                start = time.perf_counter()
                client.stage_out(ids)
                spills.append(size * count / (time.perf_counter() - start))
                drop_cache(burst)
                start = time.perf_counter()
                client.stage_in(ids)
                restores.append(size * count / (time.perf_counter() - start))
                client.delete(ids)
            out[size] = {
                "count": count,
                "spill": max(spills),
                "restore": max(restores),
                "spills": spills,
                "restores": restores,
                # dd's (write, read) in the same rounds, just before each shoal run.
                "disk": [max(r[0] for r in disk), max(r[1] for r in disk)],
                "disk_runs": disk,
            }
            log(
                f"disk {LABELS[size]}: write {mibs(out[size]['disk'][0])} "
                f"read {mibs(out[size]['disk'][1])} MiB/s"
            )
            log(
                f"shoal {LABELS[size]}: spill {mibs(out[size]['spill'])} MiB/s, "
                f"restore {mibs(out[size]['restore'])} MiB/s"
            )
        # A get that restores a 100 MB object from the burst buffer (the best of 3).
        size = 100_000_000
        payload = memoryview(np.zeros(size, dtype=np.uint8)).cast("B")
        times = []
        for _ in range(3):
            (oid,) = put_many(client, payload, 1)
            client.stage_out([oid])
            drop_cache(burst)
            start = time.perf_counter()
            buffer = client.get_buffer(oid)
            times.append(time.perf_counter() - start)
            del buffer
            client.delete([oid])
        out["get100"] = {"seconds": min(times), "all": times}
        out["tiers"] = client.tiers()
    finally:
        daemon.teardown(check=False, timeout=30)
    return out


def restart(directory, million):
    """Seconds from `shoal serve` to a served `contains` with an empty manifest and with
    `million` objects in it."""
    burst = os.path.join(directory, "restart")
    out = {}
    daemon = start_daemon(directory, "restart0", "64MiB", "--burst", burst, wait=False)
    try:
        out["empty"] = served(daemon, timeout=60)
    finally:
        daemon.teardown(check=False, timeout=30)
    log(f"restart, empty manifest: {out['empty']:.3f} s; filling {million} objects")
    fill = subprocess.run(
        [os.path.join(ROOT, "target", "release", "examples", "fill_manifest"), burst, str(million)],
        check=True,
        capture_output=True,
        text=True,
    )
    probe = bytes.fromhex(fill.stdout.split()[-1])
    os.sync()
    times = []
    for attempt in range(2):
        daemon = start_daemon(directory, f"restart{attempt + 1}", "64MiB", "--burst", burst, wait=False)
        try:
            seconds = served(daemon, timeout=600, probe=probe)
            times.append(seconds)
        finally:
            daemon.teardown(check=False, timeout=30)
        log(f"restart with {million} objects: {seconds:.3f} s")
    out["full"] = times
    return out


def drain_cost(directory, total, rounds=3):
    """Foreground put rate of 1 MiB objects without tiers and with burst + backing."""
    import numpy as np

    payload = memoryview(np.ones(MiB, dtype=np.uint8)).cast("B")
    count = total // MiB
    rates = {"none": [], "tiers": []}
    for r in range(rounds):
        for kind in ("none", "tiers"):
            args = []
            if kind == "tiers":
                args += [
                    "--burst",
                    os.path.join(directory, f"db{r}"),
                    "--backing",
                    os.path.join(directory, f"dk{r}"),
                ]
            daemon = start_daemon(directory, f"drain-{kind}{r}", "2GiB", *args)
            try:
                client = daemon.client()
                start = time.perf_counter()
                put_many(client, payload, count, batch_bytes=8 * MiB)
                rates[kind].append(count * MiB / (time.perf_counter() - start))
                if kind == "tiers":
                    rates.setdefault("drained", []).append(client.tiers())
            finally:
                daemon.teardown(check=False, timeout=30)
            shutil.rmtree(os.path.join(directory, f"db{r}"), ignore_errors=True)
            shutil.rmtree(os.path.join(directory, f"dk{r}"), ignore_errors=True)
        log(f"drain round {r}: none {mibs(rates['none'][-1])} MiB/s, tiers {mibs(rates['tiers'][-1])} MiB/s")
    return rates


# -- Ray (run in bench/.venv-ray) ------------------------------------------------------------


def ray_worker(directory, total):
    """Ray's spill and restore per size; prints one JSON line."""
    import numpy as np
    import ray

    spill_dir = os.path.join(directory, "ray")
    os.makedirs(spill_dir, exist_ok=True)
    ray.init(
        num_cpus=1,
        object_store_memory=RAY_STORE,
        include_dashboard=False,
        _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
        _system_config={
            "object_spilling_config": json.dumps(
                {"type": "filesystem", "params": {"directory_path": spill_dir}}
            ),
        },
    )
    out = {}
    try:
        for size in SIZES:
            payload = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
            count = count_for(size, total)
            start = time.perf_counter()
            refs = [ray.put(payload) for _ in range(count)]
            put_s = time.perf_counter() - start
            # Ray's spill files are written without fsync; shoal's stage_out
            # returns once its images are fsync'ed. The sync puts Ray's spilled
            # bytes on the disk too, for a like-for-like spill rate.
            os.sync()
            put_sync_s = time.perf_counter() - start
            spilled = spilled_bytes(spill_dir)
            # Fillers of the store's size spill every measured object (their
            # references keep them primary copies), then free their memory, so
            # the gets below all restore from disk, like shoal's stage_in.
            piece = min(size, 32 * MiB)
            fillers = [ray.put(np.zeros(piece, dtype=np.uint8)) for _ in range(RAY_STORE // piece + 1)]
            del fillers
            time.sleep(1.0)  # Ray frees the fillers asynchronously
            drop_cache(spill_dir)
            start = time.perf_counter()
            for ref in refs:
                value = ray.get(ref)
                del value
            get_s = time.perf_counter() - start
            del refs
            out[size] = {
                "count": count,
                "put_all": size * count / put_s,
                "spilled_bytes": spilled,
                "get_from_disk": size * count / get_s,
                "spill_only": spilled / put_s,
                "put_synced": size * count / put_sync_s,
            }
            time.sleep(1.0)  # Ray deletes the spilled files of freed objects asynchronously
    finally:
        ray.shutdown()
    print(json.dumps(out))


def spilled_bytes(directory):
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def run_ray(directory, total):
    setup = subprocess.run(
        ["bash", os.path.join(BENCH, "setup_ray.sh")], check=True, capture_output=True, text=True
    )
    python = setup.stdout.strip().splitlines()[-1]
    done = subprocess.run(
        [python, __file__, "--ray-worker", "--dir", directory, "--total-mib", str(total // MiB)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray worker failed: {done.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


# -- report ----------------------------------------------------------------------------------


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def mibs(rate):
    return f"{rate / MiB:,.0f}"


def report(args, res):
    disk, shoal_r, ray_r = res["disk"], res["shoal"], res["ray"]
    lines = [
        "# Tiers below memory: spill, restore, restart, drain (issue 10)",
        "",
        f"Run {res['when']} on {res['machine']}; directory `{res['dir']}` "
        f"({res['fs']}); load average before {res['load_before']}, after {res['load_after']} "
        "(2 cores shared with other engineers' builds). "
        f"{args.total_mib} MiB per size; dd and shoal's spill and restore: the best of "
        f"{args.repeat} runs per size, each shoal run right after a dd run of its size "
        "(every run in tiers.json), Ray: one run; commit "
        f"{res['commit']}. `python bench/tiers.py` (see its docstring for how each number is measured).",
        "",
        "## Spill and restore throughput (MiB/s), beside the disk (O_DIRECT dd) and Ray",
        "",
        "| size | objects | disk write | disk read | shoal spill | ×disk | Ray spill (put loop) "
        "| Ray spill (put loop + sync) "
        "| shoal ÷ Ray | shoal restore | ×disk | Ray restore (get loop, all from disk) | shoal ÷ Ray |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in SIZES:
        w, r = disk[size]
        s, y = shoal_r[size], ray_r[size]
        lines.append(
            f"| {LABELS[size]} | {s['count']} | {mibs(w)} | {mibs(r)} | "
            f"{mibs(s['spill'])} | {s['spill'] / w:.2f} | "
            f"{mibs(y['put_all'])} | {mibs(y['put_synced'])} | {s['spill'] / y['put_synced']:.2f} | "
            f"{mibs(s['restore'])} | {s['restore'] / r:.2f} | {mibs(y['get_from_disk'])} | "
            f"{s['restore'] / y['get_from_disk']:.2f} |"
        )
    g = shoal_r["get100"]
    limit = 100_000_000 / disk[100_000_000][1]
    lines += [
        "",
        "Ray's put loop counts every object's bytes, including those that stayed in its 256 MiB "
        "store, and Ray writes its spill files without fsync while shoal's stage_out returns once its "
        "images are fsync'ed; 'put loop + sync' adds an os.sync() after the loop, so Ray's spilled bytes "
        "are on the disk too, and shoal ÷ Ray for spills uses it (the bytes Ray kept in memory still "
        "count for Ray). Before Ray's get loop, fillers of the store's size push every measured object "
        "out to disk and are freed, so all its restored bytes come from disk, as shoal's.",
        "",
        "## Targets",
        "",
        "| what | measured | limit / target | ratio | target met |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for size in SIZES:
        w, r = disk[size]
        s = shoal_r[size]
        lines.append(
            f"| spill {LABELS[size]} | {mibs(s['spill'])} MiB/s | disk write {mibs(w)} MiB/s | "
            f"{s['spill'] / w:.2f} | {'yes' if s['spill'] / w >= TARGET_SPILL else 'no'} (≥ 0.8) |"
        )
        lines.append(
            f"| restore {LABELS[size]} | {mibs(s['restore'])} MiB/s | disk read {mibs(r)} MiB/s | "
            f"{s['restore'] / r:.2f} | {'yes' if s['restore'] / r >= TARGET_SPILL else 'no'} (≥ 0.8) |"
        )
    lines.append(
        f"| get restoring 100 MB from the burst buffer | {g['seconds'] * 1000:.0f} ms "
        f"(of {', '.join(f'{t * 1000:.0f}' for t in g['all'])}) | "
        f"100 MB / disk read = {limit * 1000:.0f} ms | {g['seconds'] / limit:.2f} | "
        f"{'yes' if g['seconds'] / limit <= TARGET_GET else 'no'} (≤ 1.25) |"
    )
    rs = res["restart"]
    best = min(rs["full"])
    lines.append(
        f"| restart with {args.million:,} objects until a `contains` of one of them is true | {best:.2f} s "
        f"(runs {', '.join(f'{t:.2f}' for t in rs['full'])}; empty manifest {rs['empty']:.2f} s) | 2 s | "
        f"{best / TARGET_RESTART_S:.2f} | {'yes' if best <= TARGET_RESTART_S else 'no'} (≤ 2 s) |"
    )
    d = res["drain"]
    none, tiers = statistics.median(d["none"]), statistics.median(d["tiers"])
    slow = 1 - tiers / none
    lines.append(
        f"| put rate with the drain running (1 MiB objects, median of {len(d['none'])}) | "
        f"{mibs(tiers)} MiB/s "
        f"(runs {', '.join(mibs(x) for x in d['tiers'])}) | without tiers {mibs(none)} MiB/s "
        f"(runs {', '.join(mibs(x) for x in d['none'])}) | {tiers / none:.2f} | "
        f"{'yes' if slow <= TARGET_DRAIN else 'no'} (≤ 10 % slower: {slow * 100:.0f} %) |"
    )
    lines += ["", "Raw numbers: `bench/results/tiers.json`.", ""]
    return "\n".join(lines)


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(SIZES)))
    series = [
        ("disk write (O_DIRECT dd)", [res["disk"][s][0] for s in SIZES], "k--"),
        ("disk read (O_DIRECT dd)", [res["disk"][s][1] for s in SIZES], "k:"),
        ("shoal spill", [res["shoal"][s]["spill"] for s in SIZES], "b-o"),
        ("shoal restore", [res["shoal"][s]["restore"] for s in SIZES], "b-s"),
        ("Ray spill (put loop + sync)", [res["ray"][s]["put_synced"] for s in SIZES], "r-o"),
        ("Ray restore (get loop, all from disk)", [res["ray"][s]["get_from_disk"] for s in SIZES], "r-s"),
    ]
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, values, style in series:
        ax.plot(x, [v / MiB for v in values], style, label=label)
    ax.set_xticks(x, [LABELS[s] for s in SIZES])
    ax.set_xlabel("object size")
    ax.set_ylabel("MiB/s")
    ax.set_title("Spill and restore throughput, same directory, one run")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    global REPEAT
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", help="where every writer writes (default: a fresh directory under bench/)")
    parser.add_argument("--out", default=os.path.join(BENCH, "results", "tiers.md"))
    parser.add_argument("--total-mib", type=int, default=512, help="bytes per object size")
    parser.add_argument("--million", type=int, default=1_000_000, help="objects in the restart manifest")
    parser.add_argument(
        "--repeat", type=int, default=REPEAT, help="runs per size of dd and of shoal (best kept)"
    )
    parser.add_argument("--ray-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    total = args.total_mib * MiB
    REPEAT = max(1, args.repeat)
    if args.ray_worker:
        ray_worker(args.dir, total)
        return
    os.makedirs(os.path.join(BENCH, ".tiers-run"), exist_ok=True)
    directory = args.dir or tempfile.mkdtemp(prefix="run", dir=os.path.join(BENCH, ".tiers-run"))
    fs = (
        subprocess.run(["df", "-T", directory], capture_output=True, text=True)
        .stdout.splitlines()[-1]
        .split()
    )
    res = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {os.uname().release}",
        "dir": directory,
        "fs": f"{fs[1]} on {fs[0]}",
        "load_before": loadavg(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    try:
        res["shoal"] = shoal_spill_restore(directory, total)
        res["disk"] = {size: res["shoal"][size]["disk"] for size in SIZES}
        res["ray"] = run_ray(directory, total)
        for size in SIZES:
            log(f"ray {LABELS[size]}: {res['ray'][size]}")
        res["drain"] = drain_cost(directory, total)
        res["restart"] = restart(directory, args.million)
        res["load_after"] = loadavg()
        results = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "tiers.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        with open(args.out, "w") as f:
            f.write(report(args, res))
        plot(res, os.path.join(results, "tiers.png"))
        log(f"wrote {args.out}")
    finally:
        # After the report: removing a million files takes minutes on a virtual disk.
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
