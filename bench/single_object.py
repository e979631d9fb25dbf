"""Single-object operations, one object per call, beside Plasma, quiet and under a CPU hog per core.

    python3 bench/single_object.py --rounds 3 --out bench/results/single-object.md \
        [--variant before=/path/to/site-dir]

For every store, in a worker process of its own, one 1 kB object per call, in a loop
as a user's Python program runs it:
  create_seal      create + write 1 kB + seal, then drop the writable buffer;
  get              get_buffers([id]) of one sealed object, then drop the buffer;
  put              put(numpy array of 1000 B) (Plasma: its put; shoal: Client.put);
  delete           delete(id) of a sealed, unreferenced object;
  contains         contains(id) of a present object;
  contains_absent  contains(id) of an id never stored (the store must ask its daemon).
Each loop is timed whole (mean per call = loop time / calls: what a program pays) and
every call alone (perf_counter_ns: p50 and p99). CPU per call is the run time of every
thread of the client process over the loop, and of the store's daemon over the whole
request (its set-up and clean-up included), per call.

Every round measures every store twice, interleaved: on a quiet machine, then with one
CPU-bound process per core (`while :; do :; done` in a shell, started and stopped by
this script), so that the same load falls on every store. Within a phase the stores take
turns of `--turn` calls of one operation (the first turn of each after its warm-up
calls): under the hogs the scheduler falls into states that last seconds, in which ~1
call in 40 of any process pair waits a whole time slice (a C futex or socket ping-pong
too), and a store measured in a window of its own could catch one its peers missed;
in turns, every store samples the same states.

The stores: Plasma (pyarrow 11, in bench/.venv-plasma), shoal (the fast path), socket
(shoal with SHOAL_FAST_READS=0: every call a round trip to the daemon), each
`--variant NAME=DIR[,KEY=VALUE...]` (another build of the `shoal` package, put first on
PYTHONPATH, with these environment variables), and optionally shm
(multiprocessing.shared_memory: one POSIX segment per object).
"""

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
SIZE = 1000
OPS = ("create_seal", "get", "put", "delete", "contains", "contains_absent")
PHASES = ("quiet", "hog")
WORKER_TIMEOUT = 300
LABELS = {
    "create_seal": "create + write + seal (1 kB)",
    "get": "get of one object, then drop",
    "put": "put(numpy 1 kB)",
    "delete": "delete(id)",
    "contains": "contains(id), present",
    "contains_absent": "contains(id), absent",
}
# Issue 40's targets: loop mean / Plasma's loop mean, p99 / Plasma's p99.
TARGETS = {"quiet": (0.1, 0.25), "hog": (0.5, 1.0)}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- worker side


_libc = ctypes.CDLL(None, use_errno=True)


def cpu_ns(pid="self"):
    """Run time of every thread of a process so far, those that ended included, in ns: the
    process's CPU-time clock (`clock_getcpuclockid`). Summing the live threads' schedstat
    instead lost the time of threads that ended between two readings (the daemon's
    blocking-pool threads come and go), which made some daemon cells negative."""
    if pid == "self":
        return time.process_time_ns()
    clock = ctypes.c_int()
    if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return 0  # the process is gone
    return time.clock_gettime_ns(clock.value)


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

    def delete(self, oid):
        self.client.delete([oid])

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

    def delete(self, oid):
        self.client.delete(oid)

    def contains(self, oid):
        return self.client.contains(oid)

    def cleanup(self, ids):
        for oid in ids:
            self.client.delete(oid)


class ShmStore:
    def __init__(self, sock):
        from multiprocessing import resource_tracker, shared_memory

        self.version = f"python {sys.version.split()[0]}"
        self.SharedMemory = shared_memory.SharedMemory
        self.tracker = resource_tracker
        self.live = {}
        warm = self.SharedMemory(create=True, size=1)  # starts the resource tracker
        warm.close()
        warm.unlink()

    def new_id(self):
        return "so" + os.urandom(12).hex()

    def create_seal(self, name, src):
        shm = self.SharedMemory(name, create=True, size=SIZE)
        shm.buf[:SIZE] = src
        self.live[name] = shm

    def get(self, name):
        shm = self.SharedMemory(name)
        view = shm.buf
        del view
        shm.close()
        self.tracker.unregister(shm._name, "shared_memory")

    def put(self, value):
        self.create_seal(self.new_id(), value.view(np.uint8))

    def delete(self, name):
        shm = self.live.pop(name)
        shm.close()
        shm.unlink()

    def contains(self, name):
        return os.path.exists("/dev/shm/" + name)

    def cleanup(self, ids):
        for shm in self.live.values():
            shm.close()
            shm.unlink()
        self.live = {}


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

    elif op == "delete":
        ids = [store.new_id() for _ in range(n + warmup)]
        for oid in ids:
            store.create_seal(oid, src)

        def call(i):
            store.delete(ids[i])

    elif op in ("get", "contains"):
        oid = store.new_id()
        store.create_seal(oid, src)
        made = [oid]
        fn = getattr(store, op)

        def call(i):
            fn(oid)

    elif op == "contains_absent":
        oid = store.new_id()

        def call(i):
            if store.contains(oid):
                raise AssertionError("an id never stored is present")

    else:

        def call(i):
            store.put(value)

    times = []
    for i in range(warmup):
        call(i)
    clock = time.perf_counter_ns
    cpu0 = cpu_ns()
    start = clock()
    for i in range(warmup, warmup + n):
        t0 = clock()
        call(i)
        times.append(clock() - t0)
    loop = clock() - start
    cpu = cpu_ns() - cpu0
    if made:
        store.cleanup(made)
    return {"times": times, "loop_ns": loop, "client_cpu_ns": cpu}


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


def socket_round_trip(n=20_000):
    """1-byte ping-pong between two processes, in ns per round trip (list)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        while msg := b.recv(1):
            b.sendall(msg)
        os._exit(0)
    b.close()
    times = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        a.sendall(b"x")
        a.recv(1)
        times.append(clock() - t0)
    a.close()
    os.waitpid(pid, 0)
    return times[n // 10 :]


class Hogs:
    """One CPU-bound shell loop per core, while in use."""

    def __enter__(self):
        self.procs = [
            subprocess.Popen(["bash", "-c", "while :; do :; done"], start_new_session=True)
            for _ in range(os.cpu_count())
        ]
        time.sleep(0.2)  # let the scheduler spread them
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


class Store:
    """A store's daemon (if any) and its worker process."""

    def __init__(self, name, kind, python, env, tmp, plasma_store):
        self.name, self.kind = name, kind
        self.sock = os.path.join(tmp, f"{name}.sock")
        self.log = open(os.path.join(tmp, f"{name}.log"), "w")  # noqa: SIM115 - closed in stop()
        self.daemon = None  # the daemon's process: plasma_store, or the shoal daemon's
        self.shoal = None  # the shoal daemon (shoal.testing.Daemon)
        if kind == "plasma":
            cmd = [plasma_store, "-m", "1000000000", "-s", self.sock]
            t0 = time.monotonic()
            self.daemon = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env)
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
                env=env,
                log=self.log,
                timeout=60,
            )
            self.sock = self.shoal.socket
            self.daemon = self.shoal.process
        self.worker = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker", kind, self.sock],
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


def summarise(samples):
    """Every round's calls pooled: loop mean, p50, p99 (µs) and CPU per call (µs)."""
    times = [t for s in samples for t in s["times"]]
    calls = len(times)
    return {
        "mean": sum(s["loop_ns"] for s in samples) / calls / 1e3,
        "p50": pct(times, 0.5),
        "p99": pct(times, 0.99),
        "client_cpu": sum(s["client_cpu_ns"] for s in samples) / calls / 1e3,
        "daemon_cpu": sum(s["daemon_cpu_ns"] for s in samples) / calls / 1e3,
    }


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(run):
    names = [s for s in run["stores"] if "ops" in run["results"][s]]
    lines = [
        "# Single-object operations, quiet and under a CPU hog per core (issue 40)",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        f"Machine: {run['cpu']}, nproc {os.cpu_count()}, {platform.system()} {platform.release()};"
        f" load average at start {run['load_start']}, at end {run['load_end']}"
        " (the machine is shared: other processes' load is part of every phase).",
        "",
        f"{run['n']} timed calls per operation, store, phase and round (after {run['warmup']}"
        f" untimed), {run['rounds']} rounds; each round runs every store quiet, then every store"
        f" with {os.cpu_count()} CPU-bound shell loops (`while :; do :; done`, one per core),"
        f" the stores taking turns of {min(run['turn'], run['n'])} calls of each operation (every"
        " store samples the same machine states)."
        " Cells: loop mean / p50 / p99 in µs over every round's calls (mean = loop time / calls,"
        " what a program pays per call; p50 and p99 of the calls timed alone).",
        "",
        "Machine: Unix-socket round trip, 1 byte, quiet:"
        f" p50 {pct(run['rtt'], 0.5):.1f} µs, p99 {pct(run['rtt'], 0.99):.1f} µs.",
    ]
    for phase in run["phases"]:
        title = "Quiet" if phase == "quiet" else f"Under {os.cpu_count()} CPU hogs (one per core)"
        lines += ["", f"## {title}: mean / p50 / p99 (µs)", ""]
        at = ", ".join(f"{x:.2f}" for x in run["loads"][phase])
        lines += [f"Load average (1 min) as each round's {phase} phase began, before its hogs: {at}.", ""]
        lines.append("| operation | " + " | ".join(names) + " |")
        lines.append("|---" * (len(names) + 1) + "|")
        for op in OPS:
            cells = []
            for s in names:
                r = run["results"][s]["ops"][phase][op]
                cells.append(f"{r['mean']:.1f} / {r['p50']:.1f} / {r['p99']:.1f}")
            lines.append(f"| {LABELS[op]} | " + " | ".join(cells) + " |")
        if "plasma" in names:
            mean_t, p99_t = TARGETS[phase]
            lines += [
                "",
                f"Ratios to Plasma, {phase}: mean / mean and p99 / p99 (targets: mean ≤ {mean_t},"
                f" p99 ≤ {p99_t}; ✗ marks a miss):",
                "",
            ]
            others = [s for s in names if s != "plasma"]
            lines.append("| operation | " + " | ".join(others) + " |")
            lines.append("|---" * (len(others) + 1) + "|")
            for op in OPS:
                base = run["results"]["plasma"]["ops"][phase][op]
                cells = []
                for s in others:
                    r = run["results"][s]["ops"][phase][op]
                    m, p = r["mean"] / base["mean"], r["p99"] / base["p99"]
                    mark = "" if m <= mean_t and p <= p99_t else " ✗"
                    cells.append(f"{m:.2f} / {p:.2f}{mark}")
                lines.append(f"| {LABELS[op]} | " + " | ".join(cells) + " |")
        lines += ["", f"CPU per call, {phase} (µs): client (all threads) / daemon", ""]
        lines.append("| operation | " + " | ".join(names) + " |")
        lines.append("|---" * (len(names) + 1) + "|")
        for op in OPS:
            cells = []
            for s in names:
                r = run["results"][s]["ops"][phase][op]
                cells.append(f"{r['client_cpu']:.1f} / {r['daemon_cpu']:.1f}")
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
    ap.add_argument("-n", type=int, default=1000, help="timed calls per operation, phase and round")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument(
        "--turn",
        type=int,
        default=250,
        help="calls of one operation a store makes before the next store's turn",
    )
    ap.add_argument("--stores", default="plasma,shoal,socket", help="of plasma, shoal, socket, shm")
    ap.add_argument("--phases", default=",".join(PHASES), help="quiet, hog or both")
    ap.add_argument(
        "--ops", default=",".join(OPS), help="the operations measured (default all; a report needs all)"
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=DIR[,KEY=VALUE...]: another shoal build (DIR holds its `shoal` package; empty:"
        " the project's) with these environment variables, measured as a store",
    )
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "single-object.md"))
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    phases = args.phases.split(",")
    ops = args.ops.split(",")
    if unknown := set(ops) - set(OPS):
        ap.error(f"unknown operations {sorted(unknown)}")
    if len(set(ops)) != len(ops):
        ap.error("an operation named twice in --ops")
    if args.turn < 1:
        ap.error("--turn must be at least 1")

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
        elif s == "socket":
            specs.append(("socket", "shoal", sys.executable, dict(os.environ, SHOAL_FAST_READS="0")))
        elif s == "shm":
            specs.append(("shm", "shm", sys.executable, None))
        else:
            ap.error(f"unknown store {s}")
    for v in args.variant:
        name, rest = v.split("=", 1)
        path, *assignments = rest.split(",")
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = os.path.abspath(path)
        env.update(a.split("=", 1) for a in assignments)
        specs.append((name, "shoal", sys.executable, env))

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
        "turn": args.turn,
        "rounds": args.rounds,
        "load_start": load(),
        "stores": [s[0] for s in specs],
        "variants": args.variant,
    }
    samples = {name: {p: {op: [] for op in OPS} for p in phases} for name, *_ in specs}
    loads = {p: [] for p in phases}
    results = {}
    with tempfile.TemporaryDirectory(prefix="shoal-single-") as tmp:
        stores = {}
        try:
            for name, kind, python, env in specs:
                stores[name] = Store(name, kind, python, env, tmp, plasma_store)
                results[name] = {"version": stores[name].hello.get("version")}
                if "unavailable" in stores[name].hello:
                    results[name]["unavailable"] = stores[name].hello["unavailable"]
            rtt = socket_round_trip()
            for rnd in range(args.rounds):
                for phase in phases:
                    # Before this script's hogs start: what the rest of the machine runs.
                    loads[phase].append(os.getloadavg()[0])
                    with Hogs() if phase == "hog" else contextlib.nullcontext():
                        # Stores in a different order each round: none always goes first.
                        order = list(stores.items())
                        order = order[rnd % len(order) :] + order[: rnd % len(order)]
                        order = [(name, store) for name, store in order if "unavailable" not in results[name]]
                        for op in ops:
                            done = 0
                            while done < args.n:
                                calls = min(args.turn, args.n - done)
                                for name, store in order:
                                    warmup = args.warmup if done == 0 else 0
                                    samples[name][phase][op].append(store.run(op, calls, warmup))
                                done += calls
                        for name, _ in order:
                            turns = -(-args.n // args.turn)  # this round's turns: the last ones
                            this_round = {op: samples[name][phase][op][-turns:] for op in ops}
                            last = {
                                op: round(sum(s["loop_ns"] for s in turns) / args.n / 1e3, 1)
                                for op, turns in this_round.items()
                            }
                            slow = {
                                op: sum(t > 1e6 for s in turns for t in s["times"])
                                for op, turns in this_round.items()
                            }
                            log(
                                f"round {rnd} {phase:5s} {name:8s} mean µs {json.dumps(last)}"
                                f" calls over 1 ms {json.dumps(slow)} load {load()}"
                            )
        finally:
            for store in stores.values():
                store.stop()
    for name in samples:
        if "unavailable" not in results[name]:
            results[name]["ops"] = {p: {op: summarise(samples[name][p][op]) for op in ops} for p in phases}
    run["rtt"] = rtt
    run["results"] = results
    run["load_end"] = load()
    run["loads"] = loads
    run["phases"] = phases
    if set(ops) != set(OPS):
        # Some operations only: their summaries, not the results table (it needs every one).
        for name in results:
            log(f"{name}: {json.dumps(results[name].get('ops', results[name]))}")
        return
    text = report(run)
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
