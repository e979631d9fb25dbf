"""Table I: object micro-benchmarks of shoal beside Apache Arrow Plasma.

    python3 bench/table1.py --stores plasma,shm,shoal --reps 5 \
        --out bench/results/table1.md

For every store and workload (count objects of size bytes) it times, in worker
processes running adapters.py:
  put   create + write + seal of all objects, in the writer process;
  get   one batched request for all ids, in a second (getter) process;
  read  one sequential pass over all bytes, in the getter, with its minor
        page faults.
The machine's limits (memcpy, sequential read with the same reader, Unix
socket round trip) are measured in the same run, and the report gives ratios
taken from this run only. See bench/README.md.
"""

import argparse
import contextlib
import datetime
import json
import mmap
import os
import platform
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from adapters import payload, read_all, timed

WORKLOADS = [
    (1000, 1_000),
    (500, 10_000),
    (200, 100_000),
    (100, 1_000_000),
    (50, 10_000_000),
    (10, 100_000_000),
]
CAPACITY = 2_500_000_000  # bytes, for Plasma; shoal gets the same as 2560MiB
WORKER_TIMEOUT = 300  # seconds for one request
WAIT_RESIDENT = False  # wait for a shoal daemon's region to be resident before measuring
LIMIT_BYTES = 100_000_000
GiB = 2**30

STORES = {
    # name: (label, server, python)
    "plasma": ("Plasma (pyarrow 11)", "plasma", "plasma"),
    "shm": ("multiprocessing.shared_memory", None, "project"),
    "shoal": ("shoal (put_batch)", "shoal", "project"),
    "shoal-each": ("shoal (create/seal each)", "shoal", "project"),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- limits


def best_bandwidth(fn, dst, src, n):
    """Best GiB/s of n calls of fn(dst, src) moving src.nbytes each."""
    return max(src.nbytes / timed(fn, dst, src)[0] for _ in range(n)) / GiB


def shared_pages(nbytes):
    """A new shared (shmem-backed, 4 kB pages) mapping, like store memory."""
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def socket_round_trip(n=20_000):
    """1-byte ping-pong between two processes pinned to two cores, in µs."""
    cpus = sorted(os.sched_getaffinity(0))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        os.sched_setaffinity(0, {cpus[-1]})
        while msg := b.recv(1):
            b.sendall(msg)
        os._exit(0)
    b.close()
    os.sched_setaffinity(0, {cpus[0]})
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        a.sendall(b"x")
        a.recv(1)
        times.append(time.perf_counter_ns() - t0)
    a.close()
    os.waitpid(pid, 0)
    os.sched_setaffinity(0, cpus)
    times = times[n // 10 :]  # drop the warm-up
    return {"median_us": statistics.median(times) / 1e3, "min_us": min(times) / 1e3}


def measure_limits(n=10):
    """One measurement of every limit, on 100 MB, all warm unless said."""
    src = payload(LIMIT_BYTES)  # the same kind of source as the stores' puts
    dst = np.zeros_like(src)
    shared = shared_pages(LIMIT_BYTES)
    shared[:] = src

    def read(_, buf):
        return read_all([buf])

    def copy_fresh(_, src):
        np.copyto(shared_pages(src.nbytes), src)

    return {
        "memcpy_gibs": best_bandwidth(np.copyto, dst, src, n),
        "memcpy_shared_gibs": best_bandwidth(np.copyto, shared, src, n),
        "memcpy_fresh_gibs": best_bandwidth(copy_fresh, None, src, 3),
        "seq_read_gibs": best_bandwidth(read, None, src, n),
        "seq_read_shared_gibs": best_bandwidth(read, None, shared, n),
        "socket_rtt": socket_round_trip(),
    }


def best_limits(runs):
    """Across the limit measurements of a run, the best of each."""
    best = {k: max(r[k] for r in runs) for k in runs[0] if k != "socket_rtt"}
    best["socket_rtt"] = min((r["socket_rtt"] for r in runs), key=lambda r: r["median_us"])
    return best


# ---------------------------------------------------------------- stores


class Worker:
    """A subprocess running adapters.py, spoken to in JSON lines."""

    def __init__(self, python, store, sock, errlog):
        cmd = [python, os.path.join(BENCH, "adapters.py"), store, sock]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, text=True
        )
        self.hello = self._read()

    def call(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], WORKER_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError("worker died or timed out (see the raw-*.log)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self):
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def server(kind, sock, errlog, plasma_python):
    """A store's server while the block runs; yields the socket its clients connect to.
    plasma: plasma_store on `sock`; shoal: a daemon (shoal.testing.Daemon: the `shoal`
    command on PATH, prefaulted as `serve` is by default) in a directory of its own, `sock`
    without ".sock"; None: no server (yields `sock`). Both servers' output goes to errlog."""
    if kind is None:
        yield sock
    elif kind == "shoal":
        from shoal.testing import Daemon

        daemon = Daemon(
            Path(sock).with_suffix(""),
            "2560MiB",
            connect=False,
            prefault=True,
            program=["shoal"],
            log=errlog,
            timeout=20,
        )
        try:
            if WAIT_RESIDENT:
                wait_resident(daemon.socket)
            yield daemon.socket
        finally:
            daemon.teardown(check=False)
    else:
        proc = start_plasma(sock, errlog, plasma_python)
        try:
            yield sock
        finally:
            stop(proc)


def start_plasma(sock, errlog, plasma_python):
    store_bin = os.path.join(os.path.dirname(plasma_python), "plasma_store")
    cmd = [store_bin, "-m", str(CAPACITY), "-s", sock]
    proc = subprocess.Popen(cmd, stdout=errlog, stderr=errlog)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"{cmd[0]} exited ({proc.poll()}) or did not create its socket in 20 s"
                f" (see raw-{os.path.basename(sock)[:-5]}.log)"
            )
        time.sleep(0.01)
    return proc


def wait_resident(sock, timeout=120):
    """Until the daemon has faulted its whole region in (it does so in the background at
    start): puts then copy into warm memory, as the copy limits do. On a VM whose host backs
    guest memory on first touch this takes seconds (0.3-0.4 GiB/s measured here)."""
    import shoal

    client = shoal.connect(sock)
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout:
            state = client.controller()
            if state["resident"] >= state["capacity"]:
                log(f"  region resident after {time.monotonic() - started:.1f} s")
                return
            time.sleep(0.05)
        log(f"  region not resident after {timeout} s: measuring anyway")
    finally:
        client.close()


def shoal_missing():
    if shutil.which("shoal") is None:
        return "no `shoal` binary on PATH"
    probe = subprocess.run([sys.executable, "-c", "import shoal"], check=False, capture_output=True)
    if probe.returncode != 0:
        return "`import shoal` fails: " + probe.stderr.decode().strip().splitlines()[-1]
    return None


def measure(writer, getter, count, size, args):
    """Repetitions of put (writer), get + read (getter), delete (writer)."""
    keys = ("put_s", "put_minflt", "get_s", "read_s", "read_minflt")
    samples = {k: [] for k in keys}
    for rep in range(args.warmup + args.reps):
        put = writer.call(op="put", count=count, size=size)
        get = getter.call(op="get", ids=put["ids"], size=size, head=put["head"], tail=put["tail"])
        writer.call(op="delete")
        if rep >= args.warmup:
            for key, values in samples.items():
                values.append(put[key] if key in put else get[key])
    return {"count": count, "size": size, "samples": samples}


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_store(store, args, pythons, tmp):
    """Every workload on one store: {"version", "workloads"} or raises."""
    _, server_kind, python = STORES[store]
    sock = os.path.join(tmp, f"{store}.sock")
    with (
        open(os.path.join(args.raw_dir, f"raw-{store}.log"), "w") as errlog,
        server(server_kind, sock, errlog, pythons["plasma"]) as sock,
    ):
        workers = []
        try:
            for _ in range(2):
                workers.append(Worker(pythons[python], store, sock, errlog))
            writer, getter = workers
            if "unavailable" in writer.hello:
                return {"unavailable": writer.hello["unavailable"]}
            results = []
            for count, size in WORKLOADS:
                results.append(measure(writer, getter, count, size, args))
                med = {k: statistics.median(v) for k, v in results[-1]["samples"].items()}
                log(
                    f"  {store:10s} {count:5d} x {size:>11,d} B:"
                    f" put {med['put_s'] * 1e3:9.3f} ms  get {med['get_s'] * 1e3:8.3f} ms"
                    f"  read {med['read_s'] * 1e3:8.3f} ms"
                    f"  faults put {med['put_minflt']:.0f} read {med['read_minflt']:.0f}"
                )
            return {"version": writer.hello["version"], "workloads": results}
        finally:
            for w in workers:
                w.close()


# ---------------------------------------------------------------- report


def metrics(w):
    """One workload's numbers, each a (best, median) pair from the samples."""
    s, count, total = w["samples"], w["count"], w["count"] * w["size"]

    def pair(key, f):
        return f(min(s[key])), f(statistics.median(s[key]))

    return {
        "put_ms": pair("put_s", lambda t: t * 1e3),
        "put_us_obj": pair("put_s", lambda t: t * 1e6 / count),
        "put_gibs": pair("put_s", lambda t: total / t / GiB),
        "put_minflt": pair("put_minflt", float),
        "get_ms": pair("get_s", lambda t: t * 1e3),
        "get_us_obj": pair("get_s", lambda t: t * 1e6 / count),
        "read_gibs": pair("read_s", lambda t: total / t / GiB),
        "read_minflt": pair("read_minflt", float),
    }


ROWS = [
    ("put_ms", "put, whole batch (ms)"),
    ("put_us_obj", "put (µs/object)"),
    ("put_gibs", "put (GiB/s)"),
    ("put_minflt", "put minor page faults (writer)"),
    ("get_ms", "get, one batch (ms)"),
    ("get_us_obj", "get (µs/object)"),
    ("read_gibs", "read (GiB/s)"),
    ("read_minflt", "read minor page faults (getter)"),
]


def fmt(x):
    if x >= 100 or x == int(x):
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def series(results, store, key):
    """[(best, median)] per workload for one store and metric, or Nones."""
    res = results.get(store, {})
    if "workloads" not in res:
        return [None] * len(WORKLOADS)
    return [metrics(w)[key] for w in res["workloads"]]


def div(nums, dens):
    return [None if a is None or b is None else (a[0] / b[0], a[1] / b[1]) for a, b in zip(nums, dens)]


# label, numerator, denominator: (store, metric) or a machine limit
RATIOS = [
    ("shoal / Plasma, put time", ("shoal", "put_ms"), ("plasma", "put_ms")),
    ("shoal (each) / Plasma, put time", ("shoal-each", "put_ms"), ("plasma", "put_ms")),
    ("shoal / Plasma, get time", ("shoal", "get_ms"), ("plasma", "get_ms")),
    ("shoal / Plasma, read time", ("plasma", "read_gibs"), ("shoal", "read_gibs")),
    ("shoal put bandwidth / memcpy", ("shoal", "put_gibs"), "memcpy_gibs"),
    ("shoal read bandwidth / sequential read", ("shoal", "read_gibs"), "seq_read_gibs"),
    ("Plasma put bandwidth / memcpy", ("plasma", "put_gibs"), "memcpy_gibs"),
    (
        "Plasma read bandwidth / sequential read",
        ("plasma", "read_gibs"),
        "seq_read_gibs",
    ),
]


def ratio_rows(results, limits):
    """[(label, [(from best, from median) or None per workload])]."""

    def values(spec):
        if isinstance(spec, str):
            return [(limits[spec], limits[spec])] * len(WORKLOADS)
        return series(results, *spec)

    return [(label, div(values(num), values(den))) for label, num, den in RATIOS]


def targets(results, limits):
    """The README's targets, judged on medians: table lines."""
    rows = dict(ratio_rows(results, limits))
    big = [i for i, (_, size) in enumerate(WORKLOADS) if size >= 1_000_000]
    reads = [rows["shoal read bandwidth / sequential read"][i] for i in big]
    faults = [series(results, "shoal", "read_minflt")[i] for i in big]

    def worst(pairs, pick):
        return None if None in pairs else pick(p[1] for p in pairs)

    checks = [
        (
            "put 1000 × 1 kB: shoal / Plasma, time per object",
            rows["shoal / Plasma, put time"][0],
            "≤ 0.10",
        ),
        (
            "batched get 1000 × 1 kB: shoal / Plasma, time",
            rows["shoal / Plasma, get time"][0],
            "≤ 0.50",
        ),
        (
            "put 10 × 100 MB: shoal bandwidth / memcpy",
            rows["shoal put bandwidth / memcpy"][-1],
            "≥ 0.93",
        ),
        (
            "read, objects ≥ 1 MB: lowest shoal bandwidth / sequential read",
            worst(reads, min),
            "≥ 0.95",
        ),
        ("read, objects ≥ 1 MB: most minor page faults", worst(faults, max), "= 0"),
    ]
    lines = ["| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    for label, value, goal in checks:
        if isinstance(value, tuple):
            value = value[1]
        if value is None:
            lines.append(f"| {label} | — | {goal} | — |")
            continue
        op, bound = goal.split()
        met = {
            "≤": value <= float(bound),
            "≥": value >= float(bound),
            "=": value == float(bound),
        }[op]
        lines.append(f"| {label} | {fmt(value)} | {goal} | {'yes' if met else '**no**'} |")
    return lines


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": f"{platform.system()} {platform.release()}",
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def table(first, heads, rows):
    out = [
        f"| {first} | " + " | ".join(heads) + " |",
        "|" + " --- |" * (len(heads) + 1),
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


LIMIT_ROWS = [
    ("memcpy_gibs", "memcpy, warm 100 MB numpy arrays (numpy copyto)"),
    ("memcpy_shared_gibs", "memcpy into a warm shared mapping (4 kB pages)"),
    ("memcpy_fresh_gibs", "memcpy into fresh shared pages (first touch)"),
    ("seq_read_gibs", "sequential read, warm 100 MB numpy array (the reader)"),
    ("seq_read_shared_gibs", "sequential read, warm shared mapping (4 kB pages)"),
]

INTRO = (
    "Cells are `best / median` of {reps} repetitions (after {warmup} discarded "
    "warm-up): the lowest time or highest bandwidth, then the median. "
    "1 kB = 1000 B, 1 MB = 10^6 B, GiB = 2^30 B. put is timed in the writer "
    "process, get and read in a second process. Definitions: bench/README.md."
)
RATIO_INTRO = (
    "Time ratios below 1 favour shoal; bandwidths are divided by the limits "
    "above. Cells are `from best / from median`."
)


def report(run):
    mach, lim, results = run["machine"], run["limits"], run["results"]
    heads = [f"{c} × {s // 1000:,} kB" if s < 10**6 else f"{c} × {s // 10**6} MB" for c, s in WORKLOADS]
    rtt = lim["socket_rtt"]
    limit_rows = [[name, f"{lim[key]:.2f} GiB/s"] for key, name in LIMIT_ROWS]
    limit_rows.append(
        [
            "Unix socket round trip, 1 byte, 2 processes on 2 cores",
            f"{rtt['median_us']:.1f} µs median ({rtt['min_us']:.1f} µs min)",
        ]
    )
    result_rows, notes = [], []
    for store, res in results.items():
        label = STORES[store][0]
        if "workloads" not in res:
            why = res.get("unavailable") or res["failed"].strip().splitlines()[-1]
            notes.append(f"- {label}: not measured ({why})")
            continue
        notes.append(f"- {label}: {res['version']}")
        for key, name in ROWS:
            cells = [f"{fmt(b)} / {fmt(m)}" for b, m in series(results, store, key)]
            result_rows.append([label, name, *cells])
    ratio_cells = [
        [label] + ["—" if c is None else f"{c[0]:.3f} / {c[1]:.3f}" for c in cells]
        for label, cells in ratio_rows(results, lim)
    ]
    machine_line = (
        f"Machine: {mach['cpu']}, nproc {mach['nproc']}, {mach['memory_gib']} GiB RAM,"
        f" {mach['kernel']}; Python {mach['python']}, numpy {mach['numpy']}."
    )
    lines = [
        "# Table I: object micro-benchmarks",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        machine_line,
        "",
        INTRO.format(reps=run["reps"], warmup=run["warmup"]),
        "",
        f"## Machine limits (best of {len(run['limit_runs'])} measurements in this run)",
        "",
        *table("limit", ["value"], limit_rows),
        "",
        "## Results",
        "",
        *table("store", ["metric", *heads], result_rows),
        "",
        "Stores:",
        "",
        *notes,
        "",
        "## Ratios (same run)",
        "",
        RATIO_INTRO,
        "",
        *table("ratio", heads, ratio_cells),
        "",
        "## Targets (judged on medians)",
        "",
        *targets(results, lim),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="plasma,shm,shoal", help="comma list of: plasma, shm, shoal")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="discarded repetitions per workload")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "table1.md"))
    args = ap.parse_args()
    if "shoal" in args.stores:
        from shoal.testing import require_optimized_build

        require_optimized_build()  # not the test command's opt-level-1 build
    args.raw_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(args.raw_dir, exist_ok=True)

    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if "shoal" in stores and "shoal-each" not in stores:
        stores.insert(stores.index("shoal") + 1, "shoal-each")
    unknown = [s for s in stores if s not in STORES]
    if unknown:
        ap.error(f"unknown store(s): {', '.join(unknown)}")

    pythons = {"project": sys.executable, "plasma": None}
    if "plasma" in stores:
        setup = subprocess.run(
            ["bash", os.path.join(BENCH, "setup_plasma.sh")],
            stdout=subprocess.PIPE,
            check=True,
            text=True,
        )
        pythons["plasma"] = setup.stdout.strip().splitlines()[-1]

    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/table1.py " + " ".join(sys.argv[1:]),
        "reps": args.reps,
        "warmup": args.warmup,
        "machine": machine(),
        "workloads": WORKLOADS,
    }
    results, limit_runs = {}, []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        for store in stores:
            missing = shoal_missing() if store.startswith("shoal") else None
            if missing:
                log(f"{store}: unavailable ({missing})")
                results[store] = {"unavailable": missing}
                continue
            log("machine limits ...")
            limit_runs.append(measure_limits())
            log(f"  {json.dumps(limit_runs[-1])}")
            log(f"{store} ...")
            try:
                results[store] = run_store(store, args, pythons, tmp)
            except Exception as e:  # noqa: BLE001 - a broken store must not lose the others
                log(f"{store}: FAILED: {e}")
                results[store] = {"failed": str(e)}
    if not limit_runs:
        limit_runs.append(measure_limits())
    run["limit_runs"], run["limits"] = limit_runs, best_limits(limit_runs)
    run["results"] = results

    with open(os.path.join(args.raw_dir, "raw-table1.json"), "w") as f:
        json.dump(run, f, indent=1)
    with open(args.out, "w") as f:
        f.write(report(run))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
