"""Single-object operations, one object per call, beside Plasma (issue 14).

    python3 bench/single_object.py --rounds 3 --out bench/results/single-object.md \
        [--variant before=/path/to/site-dir]

For every store, in a worker process of its own, one 1 kB object per call:
  create_seal  create + write 1 kB + seal, then drop the writable buffer;
  get          get_buffers([id]) of one sealed object, then drop the buffer;
  put          put(numpy array of 1000 B) (Plasma: its put, pickle-free
               serialisation of pyarrow 11; shoal: Client.put);
  contains     contains(id) of a present object (one bare round trip).
Each call is timed alone (perf_counter_ns): p50 and p99 per operation. CPU
per operation is the sum of the run time of every thread (schedstat, ns) of
the client process (the worker, with its release thread) and of the store's
daemon process, over the whole loop, divided by the calls.

The stores: Plasma (pyarrow 11, in bench/.venv-plasma), the project's shoal,
each `--variant NAME=DIR` (a directory holding another build of the `shoal`
package, put first on PYTHONPATH for both its daemon and its worker: the
before/after comparison of one run), and multiprocessing.shared_memory (one
POSIX segment per object; `contains` is a stat of /dev/shm). Rounds alternate
the stores so that machine noise spreads over all of them. The machine's
Unix-socket round trip (1 byte, two processes pinned to the same core, and to
two cores) is measured in the same run.
"""

import argparse
import datetime
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
SIZE = 1000
OPS = ("create_seal", "get", "put", "contains")
WORKER_TIMEOUT = 120
LABELS = {
    "create_seal": "create + write + seal (1 kB)",
    "get": "get of one object, then drop",
    "put": "put(numpy 1 kB)",
    "contains": "contains(id) (one round trip)",
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- worker side


def cpu_ns(pid="self"):
    """Run time of every thread of a process so far, in ns (schedstat)."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


class PlasmaStore:
    def __init__(self, sock):
        import warnings

        warnings.simplefilter("ignore", DeprecationWarning)
        import pyarrow
        from pyarrow import plasma

        self.version = f"pyarrow {pyarrow.__version__}"
        self.plasma = plasma
        self.client = plasma.connect(sock)

    def new_id(self):
        return self.plasma.ObjectID(os.urandom(20))

    def create_seal(self, oid, src):
        buf = self.client.create(oid, SIZE)
        memoryview(buf).cast("B")[:] = src
        self.client.seal(oid)
        del buf

    def get(self, oid):
        bufs = self.client.get_buffers([oid], timeout_ms=1000)
        del bufs

    def put(self, value):
        self.client.put(value)

    def contains(self, oid):
        return self.client.contains(oid)

    def cleanup(self, ids):
        self.client.delete(ids)


class ShoalStore:
    def __init__(self, sock):
        import shoal

        self.version = f"shoal {shoal.__version__} from {os.path.dirname(shoal.__file__)}"
        self.shoal = shoal
        self.client = shoal.connect(sock)

    def new_id(self):
        return self.shoal.ObjectID(os.urandom(20))

    def create_seal(self, oid, src):
        buf = self.client.create(oid, SIZE)
        memoryview(buf).cast("B")[:] = src
        self.client.seal(oid)
        del buf

    def get(self, oid):
        bufs = self.client.get_buffers([oid], timeout_ms=1000)
        del bufs

    def put(self, value):
        self.client.put(value)

    def contains(self, oid):
        return self.client.contains(oid)

    def cleanup(self, ids):
        self.client.delete(ids)


class ShmStore:
    def __init__(self, sock):
        from multiprocessing import resource_tracker, shared_memory

        self.version = f"python {sys.version.split()[0]}"
        self.SharedMemory = shared_memory.SharedMemory
        self.tracker = resource_tracker
        self.live = []
        warm = self.SharedMemory(create=True, size=1)  # starts the resource tracker
        warm.close()
        warm.unlink()

    def new_id(self):
        return "so" + os.urandom(12).hex()

    def create_seal(self, name, src):
        shm = self.SharedMemory(name, create=True, size=SIZE)
        shm.buf[:SIZE] = src
        self.live.append(shm)

    def get(self, name):
        shm = self.SharedMemory(name)
        view = shm.buf
        del view
        shm.close()
        self.tracker.unregister(shm._name, "shared_memory")

    def put(self, value):
        self.create_seal(self.new_id(), value.view(np.uint8))

    def contains(self, name):
        return os.path.exists("/dev/shm/" + name)

    def cleanup(self, ids):
        for shm in self.live:
            shm.close()
            shm.unlink()
        self.live = []


STORES = {"plasma": PlasmaStore, "shoal": ShoalStore, "shm": ShmStore}


def run_op(store, op, n, warmup):
    """n timed calls of one operation (after warmup untimed ones)."""
    src = np.frombuffer(os.urandom(SIZE), np.uint8)
    value = np.arange(SIZE // 8, dtype=np.int64)  # 1000 B of numpy
    made = []
    if op == "create_seal":
        ids = [store.new_id() for _ in range(n + warmup)]
        made = ids

        def call(i):
            store.create_seal(ids[i], src)

    elif op in ("get", "contains"):
        oid = store.new_id()
        store.create_seal(oid, src)
        made = [oid]
        fn = getattr(store, op)

        def call(i):
            fn(oid)

    else:

        def call(i):
            store.put(value)

    times = []
    for i in range(warmup):
        call(i)
    clock = time.perf_counter_ns
    cpu0 = cpu_ns()
    for i in range(warmup, warmup + n):
        t0 = clock()
        call(i)
        times.append(clock() - t0)
    cpu = cpu_ns() - cpu0
    if op != "put":
        store.cleanup(made)
    return {"times": times, "client_cpu_ns": cpu}


def worker(kind, sock):
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    try:
        store = STORES[kind](sock)
    except ImportError as e:
        out.write(json.dumps({"unavailable": str(e)}) + "\n")
        return
    import gc

    gc.disable()
    out.write(json.dumps({"ready": True, "version": store.version}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        out.write(json.dumps(run_op(store, req["op"], req["n"], req["warmup"])) + "\n")


# ---------------------------------------------------------------- orchestrator


def socket_round_trip(same_core, n=20_000):
    """1-byte ping-pong between two processes, in ns per round trip (list)."""
    cpus = sorted(os.sched_getaffinity(0))
    mine = cpus[0]
    theirs = cpus[0] if same_core else cpus[-1]
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        os.sched_setaffinity(0, {theirs})
        while msg := b.recv(1):
            b.sendall(msg)
        os._exit(0)
    b.close()
    os.sched_setaffinity(0, {mine})
    times = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        a.sendall(b"x")
        a.recv(1)
        times.append(clock() - t0)
    a.close()
    os.waitpid(pid, 0)
    os.sched_setaffinity(0, set(cpus))
    return times[n // 10 :]


def pinned(cmd, pin, which):
    """cmd run on one CPU (the first or the last) with --pin cross."""
    if pin != "cross":
        return cmd
    cpu = sorted(os.sched_getaffinity(0))[which]
    return ["taskset", "-c", str(cpu), *cmd]


class Store:
    """A store's daemon (if any) and its worker process."""

    def __init__(self, name, kind, python, env, tmp, plasma_store, pin):
        self.name, self.kind = name, kind
        self.sock = os.path.join(tmp, f"{name}.sock")
        self.log = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115 - closed in stop()
        self.daemon = None  # the daemon's process: plasma_store, or the shoal daemon's
        self.shoal = None  # the shoal daemon (shoal.testing.Daemon)
        if kind == "plasma":
            cmd = [plasma_store, "-m", "1000000000", "-s", self.sock]
            t0 = time.monotonic()
            self.daemon = subprocess.Popen(pinned(cmd, pin, -1), stdout=self.log, stderr=self.log, env=env)
            while not os.path.exists(self.sock):
                if self.daemon.poll() is not None or time.monotonic() - t0 > 60:
                    raise RuntimeError(f"{name}: the daemon did not start (see {self.log.name})")
                time.sleep(0.005)
        elif kind == "shoal":
            from shoal.testing import Daemon

            # `python -m shoal serve` of the store's build (env), prefaulted as by default.
            self.shoal = Daemon(
                Path(tmp) / name,
                "1GiB",
                connect=False,
                prefault=True,
                program=[python, "-m", "shoal"],
                prefix=pinned([], pin, -1),
                env=env,
                log=self.log,
                timeout=60,
            )
            self.sock = self.shoal.socket
            self.daemon = self.shoal.process
        self.worker = subprocess.Popen(
            pinned([python, os.path.abspath(__file__), "--worker", kind, self.sock], pin, 0),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.hello = self._read()

    def _read(self):
        ready, _, _ = select.select([self.worker.stdout], [], [], WORKER_TIMEOUT)
        line = self.worker.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"{self.name}: worker died or timed out (see {self.log.name})")
        return json.loads(line)

    def run(self, op, n, warmup):
        daemon0 = cpu_ns(self.daemon.pid) if self.daemon else 0
        self.worker.stdin.write(json.dumps({"op": op, "n": n, "warmup": warmup}) + "\n")
        self.worker.stdin.flush()
        result = self._read()
        result["daemon_cpu_ns"] = cpu_ns(self.daemon.pid) - daemon0 if self.daemon else 0
        return result

    def stop(self):
        try:
            self.worker.stdin.write('{"op": "quit"}\n')
            self.worker.stdin.close()
            self.worker.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.worker.kill()
        if self.shoal:
            self.shoal.teardown(check=False)
        elif self.daemon:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        self.log.close()


def pct(times, q):
    s = sorted(times)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def summarise(samples, n):
    """Per-round p50/p99 (µs) and CPU per op (µs); median over rounds."""
    p50 = [pct(s["times"], 0.5) for s in samples]
    p99 = [pct(s["times"], 0.99) for s in samples]
    client = [s["client_cpu_ns"] / n / 1e3 for s in samples]
    daemon = [s["daemon_cpu_ns"] / n / 1e3 for s in samples]
    med = statistics.median
    return {
        "p50": med(p50),
        "p50_best": min(p50),
        "p99": med(p99),
        "client_cpu": med(client),
        "daemon_cpu": med(daemon),
    }


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(run):
    lines = [
        "# Single-object operations (issue 14)",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        f"Machine: {run['cpu']}, nproc {os.cpu_count()}, {platform.system()} {platform.release()};"
        f" load average at start {run['load_start']}, at end {run['load_end']}.",
        "",
        f"{run['n']} timed calls per operation and round (after {run['warmup']} untimed), "
        f"{run['rounds']} rounds alternating the stores; pinning: {run['pin']}"
        " (cross: daemons on the last CPU, clients on the first). Cells: p50 / p99 in µs (medians "
        "over rounds; the best round's p50 in brackets); CPU in µs per call, client process "
        "(all threads) and daemon process.",
        "",
        "## Machine: Unix-socket round trip, 1 byte (µs)",
        "",
        "| pinning | p50 | p99 |",
        "| --- | --- | --- |",
    ]
    for key, label in (("same", "both processes on one core"), ("cross", "two cores")):
        t = run["rtt"][key]
        lines.append(f"| {label} | {pct(t, 0.5):.1f} | {pct(t, 0.99):.1f} |")
    lines += ["", "## Per call", ""]
    names = [s for s in run["stores"] if "ops" in run["results"][s]]
    lines.append("| operation | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for op in OPS:
        cells = []
        for s in names:
            r = run["results"][s]["ops"][op]
            cells.append(f"{r['p50']:.1f} / {r['p99']:.1f} ({r['p50_best']:.1f})")
        lines.append(f"| {LABELS[op]} | " + " | ".join(cells) + " |")
    lines += ["", "## CPU per call (µs): client / daemon", ""]
    lines.append("| operation | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for op in OPS:
        cells = []
        for s in names:
            r = run["results"][s]["ops"][op]
            cells.append(f"{r['client_cpu']:.1f} / {r['daemon_cpu']:.1f}")
        lines.append(f"| {LABELS[op]} | " + " | ".join(cells) + " |")
    if "plasma" in names:
        lines += ["", "## Ratios to Plasma (p50 / p50, below 1 favours the store)", ""]
        others = [s for s in names if s != "plasma"]
        lines.append("| operation | " + " | ".join(others) + " |")
        lines.append("|---" * (len(others) + 1) + "|")
        for op in OPS:
            base = run["results"]["plasma"]["ops"][op]["p50"]
            cells = [f"{run['results'][s]['ops'][op]['p50'] / base:.2f}" for s in others]
            lines.append(f"| {LABELS[op]} | " + " | ".join(cells) + " |")
    lines += ["", "Stores:", ""]
    for s in run["stores"]:
        r = run["results"][s]
        lines.append(f"- {s}: {r.get('version') or r.get('unavailable')}")
    for v in run["variants"]:
        lines.append(f"- variant {v}")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=5000, help="timed calls per operation and round")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--stores", default="plasma,shoal,shm")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=DIR[,KEY=VALUE...]: another shoal build (DIR holds its `shoal` package; empty:"
        " the project's) with these environment variables, measured as a store",
    )
    ap.add_argument(
        "--pin",
        choices=("none", "cross"),
        default="none",
        help="cross: every daemon on the last CPU, every client on the first (two cores, always)",
    )
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "single-object.md"))
    args = ap.parse_args()

    plasma_python = subprocess.run(
        ["bash", os.path.join(BENCH, "setup_plasma.sh")], stdout=subprocess.PIPE, check=True, text=True
    ).stdout.splitlines()[-1]
    plasma_store = os.path.join(os.path.dirname(plasma_python), "plasma_store")
    specs = []  # (name, kind, python, env)
    for s in args.stores.split(","):
        if s == "plasma":
            specs.append(("plasma", "plasma", plasma_python, None))
        elif s == "shoal":
            specs.append(("shoal", "shoal", sys.executable, None))
        elif s == "shm":
            specs.append(("shm", "shm", sys.executable, None))
        else:
            ap.error(f"unknown store {s}")
    for v in reversed(args.variant):
        name, rest = v.split("=", 1)
        path, *assignments = rest.split(",")
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = os.path.abspath(path)
        env.update(a.split("=", 1) for a in assignments)
        specs.insert(1, (name, "shoal", sys.executable, env))

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/single_object.py " + " ".join(sys.argv[1:]),
        "cpu": cpu,
        "n": args.n,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "pin": args.pin,
        "load_start": load(),
        "stores": [s[0] for s in specs],
        "variants": args.variant,
    }
    samples = {name: {op: [] for op in OPS} for name, *_ in specs}
    results = {}
    with tempfile.TemporaryDirectory(prefix="shoal-single-") as tmp:
        stores = {}
        try:
            for name, kind, python, env in specs:
                stores[name] = Store(name, kind, python, env, tmp, plasma_store, args.pin)
                results[name] = {"version": stores[name].hello.get("version")}
                if "unavailable" in stores[name].hello:
                    results[name]["unavailable"] = stores[name].hello["unavailable"]
            rtt = {"same": socket_round_trip(True), "cross": socket_round_trip(False)}
            for rnd in range(args.rounds):
                for name, store in stores.items():
                    if "unavailable" in results[name]:
                        continue
                    for op in OPS:
                        samples[name][op].append(store.run(op, args.n, args.warmup))
                    last = {op: round(pct(samples[name][op][-1]["times"], 0.5), 1) for op in OPS}
                    log(f"round {rnd} {name:8s} p50 µs {json.dumps(last)}")
        finally:
            for store in stores.values():
                store.stop()
    for name in samples:
        if "unavailable" not in results[name]:
            results[name]["ops"] = {op: summarise(samples[name][op], args.n) for op in OPS}
    run["rtt"] = rtt
    run["results"] = results
    run["load_end"] = load()
    text = report(run)
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
