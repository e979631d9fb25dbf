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

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from adapters import payload, read_all, timed  # noqa: E402

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


def summary(samples):
    return {"min": min(samples), "median": statistics.median(samples)}


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
    src = np.empty(LIMIT_BYTES, np.uint8)  # numpy arrays this big get huge pages
    src[:] = np.frombuffer(payload(LIMIT_BYTES), np.uint8)
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


def start_server(kind, sock, errlog, plasma_python):
    if kind == "plasma":
        store_bin = os.path.join(os.path.dirname(plasma_python), "plasma_store")
        cmd = [store_bin, "-m", str(CAPACITY), "-s", sock]
    else:
        cmd = ["shoal", "serve", "--socket", sock, "--capacity", "2560MiB"]
    proc = subprocess.Popen(cmd, stdout=errlog, stderr=errlog)
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{cmd[0]} did not create {sock}")
        time.sleep(0.01)
    return proc


def shoal_missing():
    if shutil.which("shoal") is None:
        return "no `shoal` binary on PATH"
    probe = subprocess.run([sys.executable, "-c", "import shoal"], capture_output=True)
    if probe.returncode != 0:
        return "`import shoal` fails: " + probe.stderr.decode().strip().splitlines()[-1]
    return None


def run_store(store, args, pythons, tmp):
    """Every workload on one store; returns {"version", "workloads"} or raises."""
    _, server_kind, python = STORES[store]
    sock = os.path.join(tmp, f"{store}.sock")
    errlog = open(os.path.join(args.raw_dir, f"raw-{store}.log"), "w")
    server = workers = None
    try:
        if server_kind:
            server = start_server(server_kind, sock, errlog, pythons["plasma"])
        workers = [Worker(pythons[python], store, sock, errlog) for _ in range(2)]
        writer, getter = workers
        if "unavailable" in writer.hello:
            return {"unavailable": writer.hello["unavailable"]}
        results = []
        for count, size in WORKLOADS:
            samples = {"put_s": [], "get_s": [], "read_s": [], "minflt": [], "majflt": []}
            for rep in range(args.warmup + args.reps):
                put = writer.call(op="put", count=count, size=size)
                get = getter.call(
                    op="get", ids=put["ids"], size=size, head=put["head"], tail=put["tail"]
                )
                writer.call(op="delete")
                if rep >= args.warmup:
                    for key in samples:
                        samples[key].append(put[key] if key == "put_s" else get[key])
            results.append({"count": count, "size": size, "samples": samples})
            med = {k: statistics.median(v) for k, v in samples.items()}
            log(
                f"  {store:10s} {count:5d} x {size:>11,d} B: put {med['put_s'] * 1e3:9.3f} ms"
                f"  get {med['get_s'] * 1e3:8.3f} ms  read {med['read_s'] * 1e3:8.3f} ms"
                f"  faults {med['minflt']:.0f}"
            )
        return {"version": writer.hello["version"], "workloads": results}
    finally:
        for w in workers or []:
            w.close()
        if server:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        errlog.close()


# ---------------------------------------------------------------- report


def fmt(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def size_label(count, size):
    for unit, scale in (("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{count} × {size // scale} {unit}"
    return f"{count} × {size} B"


def metrics(w):
    """Per-workload numbers: (best, median) pairs from the raw samples."""
    s, total, count = w["samples"], w["count"] * w["size"], w["count"]
    put, get, read = (summary(s[k]) for k in ("put_s", "get_s", "read_s"))
    pair = {"min": "min", "median": "median"}
    return {
        "put_ms": {k: put[v] * 1e3 for k, v in pair.items()},
        "put_us_obj": {k: put[v] * 1e6 / count for k, v in pair.items()},
        "put_gibs": {k: total / put[v] / GiB for k, v in pair.items()},
        "get_ms": {k: get[v] * 1e3 for k, v in pair.items()},
        "get_us_obj": {k: get[v] * 1e6 / count for k, v in pair.items()},
        "read_gibs": {k: total / read[v] / GiB for k, v in pair.items()},
        "minflt": summary(s["minflt"]),
    }


ROWS = [
    ("put_ms", "put, whole batch (ms)"),
    ("put_us_obj", "put (µs/object)"),
    ("put_gibs", "put (GiB/s)"),
    ("get_ms", "get, one batch (ms)"),
    ("get_us_obj", "get (µs/object)"),
    ("read_gibs", "read (GiB/s)"),
    ("minflt", "read minor page faults"),
]


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


def cell(pair, key):
    return f"{fmt(pair['min'])} / {fmt(pair['median'])}" if key != "minflt" else (
        f"{pair['min']:.0f} / {pair['median']:.0f}"
    )


def ratio_rows(results, limits):
    """(label, [cell per workload], [(best, median) per workload])."""

    def m(store, i):
        r = results.get(store, {})
        return metrics(r["workloads"][i]) if "workloads" in r else None

    def ratio(num, den):
        if num is None or den is None:
            return None
        return {k: num[k] / den[k] for k in ("min", "median")}

    def per_limit(store, key, limit):
        return [
            None if m(store, i) is None else {k: m(store, i)[key][k] / limit for k in ("min", "median")}
            for i in range(len(WORKLOADS))
        ]

    def vs(store, base, key):
        return [
            ratio(*(None if x is None else x[key] for x in (m(store, i), m(base, i))))
            for i in range(len(WORKLOADS))
        ]

    rows = [
        ("shoal / Plasma, put time", vs("shoal", "plasma", "put_ms")),
        ("shoal (each) / Plasma, put time", vs("shoal-each", "plasma", "put_ms")),
        ("shoal / Plasma, get time", vs("shoal", "plasma", "get_ms")),
        ("shoal / Plasma, read time", vs("shoal", "plasma", "read_gibs")),
    ]
    # read_gibs is a bandwidth: time ratio is the inverse
    rows[3] = (rows[3][0], [None if r is None else {k: 1 / v for k, v in r.items()} for r in rows[3][1]])
    for store, label in (("shoal", "shoal"), ("plasma", "Plasma")):
        rows.append((f"{label} put bandwidth / memcpy", per_limit(store, "put_gibs", limits["memcpy_gibs"])))
        rows.append(
            (f"{label} read bandwidth / sequential read", per_limit(store, "read_gibs", limits["seq_read_gibs"]))
        )
    return rows


def targets(results, limits):
    """The README's targets, judged on medians. Returns table lines."""

    def med(store, i, key):
        r = results.get(store, {})
        return metrics(r["workloads"][i])[key]["median"] if "workloads" in r else None

    def div(a, b):
        return None if a is None or b is None else a / b

    big = [i for i, (_, size) in enumerate(WORKLOADS) if size >= 1_000_000]
    reads = [div(med("shoal", i, "read_gibs"), limits["seq_read_gibs"]) for i in big]
    faults = [med("shoal", i, "minflt") for i in big]
    checks = [
        ("put 1000 × 1 kB: shoal / Plasma time per object", div(med("shoal", 0, "put_ms"), med("plasma", 0, "put_ms")), "≤ 0.10", lambda x: x <= 0.10),
        ("batched get 1000 × 1 kB: shoal / Plasma time", div(med("shoal", 0, "get_ms"), med("plasma", 0, "get_ms")), "≤ 0.50", lambda x: x <= 0.50),
        ("put 10 × 100 MB: shoal bandwidth / memcpy", div(med("shoal", len(WORKLOADS) - 1, "put_gibs"), limits["memcpy_gibs"]), "≥ 0.93", lambda x: x >= 0.93),
        ("read ≥ 1 MB objects: worst shoal bandwidth / sequential read", None if None in reads else min(reads), "≥ 0.95", lambda x: x >= 0.95),
        ("read ≥ 1 MB objects: most minor page faults (median)", None if None in faults else max(faults), "0", lambda x: x == 0),
    ]
    lines = ["| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    for label, value, goal, ok in checks:
        met = "—" if value is None else ("yes" if ok(value) else "**no**")
        shown = "—" if value is None else (f"{value:.0f}" if "faults" in label else f"{value:.3f}")
        lines.append(f"| {label} | {shown} | {goal} | {met} |")
    return lines


def report(run):
    mach, limits, results = run["machine"], run["limits"], run["results"]
    heads = [size_label(c, s) for c, s in WORKLOADS]
    rtt = limits["socket_rtt"]
    out = [
        "# Table I: object micro-benchmarks",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        f"Machine: {mach['nproc']} × {mach['cpu']} (nproc {mach['nproc']}), {mach['memory_gib']} GiB RAM, "
        f"{mach['kernel']}; Python {mach['python']}, numpy {mach['numpy']}.",
        "",
        f"Cells are `min / median` over {run['reps']} repetitions (after {run['warmup']} discarded warm-up); "
        "for bandwidths `best / median`. 1 kB = 1000 B, 1 MB = 10^6 B, GiB = 2^30 B. "
        "put and get are timed in two different processes; read is the getter's pass over all bytes. "
        "See bench/README.md for the exact definitions.",
        "",
        "## Machine limits (same run)",
        "",
        "| limit | value |",
        "| --- | --- |",
        f"| memcpy, warm 100 MB arrays (numpy copyto, best) | {limits['memcpy_gibs']:.2f} GiB/s |",
        f"| memcpy into fresh shared pages, 100 MB (first touch, best) | {limits['memcpy_fresh_gibs']:.2f} GiB/s |",
        f"| sequential read, warm 100 MB (same reader, best) | {limits['seq_read_gibs']:.2f} GiB/s |",
        f"| Unix socket round trip, 1 byte, 2 processes on 2 cores | {rtt['median_us']:.1f} µs median "
        f"({rtt['min_us']:.1f} µs min) |",
        "",
        "## Results",
        "",
        "| store | metric | " + " | ".join(heads) + " |",
        "| --- | --- | " + " | ".join("---" for _ in heads) + " |",
    ]
    notes = []
    for store, res in results.items():
        label = STORES[store][0]
        if "workloads" not in res:
            why = res.get("unavailable") or res.get("failed", "?").strip().splitlines()[-1]
            notes.append(f"- {label}: not measured ({why})")
            continue
        notes.append(f"- {label}: {res['version']}")
        table = [metrics(w) for w in res["workloads"]]
        for key, name in ROWS:
            out.append(f"| {label} | {name} | " + " | ".join(cell(t[key], key) for t in table) + " |")
    out += ["", "Stores:", "", *notes, "", "## Ratios (same run)", ""]
    out += [
        "Time ratios below 1 favour shoal; bandwidth ratios are of the limits above. "
        "Cells are `from best / from median`.",
        "",
        "| ratio | " + " | ".join(heads) + " |",
        "| --- | " + " | ".join("---" for _ in heads) + " |",
    ]
    for label, cells in ratio_rows(results, limits):
        shown = ["—" if c is None else f"{c['min']:.3f} / {c['median']:.3f}" for c in cells]
        out.append(f"| {label} | " + " | ".join(shown) + " |")
    out += ["", "## Targets (judged on medians)", "", *targets(results, limits), ""]
    return "\n".join(out)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="plasma,shm,shoal", help="comma list of: plasma, shm, shoal")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="discarded repetitions per workload")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "table1.md"))
    args = ap.parse_args()
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
            ["bash", os.path.join(BENCH, "setup_plasma.sh")], stdout=subprocess.PIPE, check=True, text=True
        )
        pythons["plasma"] = setup.stdout.strip().splitlines()[-1]

    run = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/table1.py " + " ".join(sys.argv[1:]),
        "reps": args.reps,
        "warmup": args.warmup,
        "machine": machine(),
        "workloads": WORKLOADS,
    }
    log("measuring machine limits ...")
    run["limits"] = measure_limits()
    log(f"  {json.dumps(run['limits'])}")

    results = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        for store in stores:
            missing = shoal_missing() if store.startswith("shoal") else None
            if missing:
                log(f"{store}: unavailable ({missing})")
                results[store] = {"unavailable": missing}
                continue
            log(f"{store} ...")
            try:
                results[store] = run_store(store, args, pythons, tmp)
            except Exception as e:  # one broken store must not lose the others
                log(f"{store}: FAILED: {e}")
                results[store] = {"failed": str(e)}
    run["results"] = results

    with open(os.path.join(args.raw_dir, "raw-table1.json"), "w") as f:
        json.dump(run, f, indent=1)
    with open(args.out, "w") as f:
        f.write(report(run))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
