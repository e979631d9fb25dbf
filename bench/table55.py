"""Thesis Table 5.5: initialising a 1 GiB uint64 table in local vs remote memory.

    python bench/table55.py --reps 5 --out bench/results/table55.md

Starts an emulated 3-node cluster (`python -m shoal cluster up`), first with
`--coherence noncoherent` (real caches: the writer's seal runs clwb /
clflushopt over the object, a reader's first get invalidates it), then a
coherent one (no cache maintenance), and in each creates a table of one uint64
column, 134,217,728 rows (1 GiB), through a client of node 0 (this process):

  local   in node 0's memory (the writer's own node);
  remote  in node 1's memory (`node=1`: only node 1's allocator runs, this
          process writes node 1's region through a writable mapping).

Each initialisation is timed phase by phase (the steps `create_table` takes,
one at a time), and again end to end with the public API:

  allocation  `client.create(..., node=k)` until the writable buffer is back;
  write       filling the column in place (numpy, 512 KiB chunks);
  flush       the cache write-back the seal does (`_raw.flush_unsealed`, a
              diagnostic hook running the seal's own routine; the seal then
              skips it);
  seal        the seal message (forwarded to node 1 for remote objects);
  serialise   the shareable descriptor: the Arrow IPC schema and record batch
              header (a dry run of pyarrow's IPC writer) written into the
              object, plus the id;
  send        the id sent to a reader process on node 2, which gets the table
              (a pyarrow.Table over the owner's memory) and answers.

The machine's limits (memset, memcpy and the same fill routine on 1 GiB, a
fill through a fresh mapping of resident shared memory, the Unix socket round
trip) are measured in the same run. See bench/README.md, "Table 5.5".
"""

import argparse
import datetime
import gc
import mmap
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from cluster import (
    ReaderProcess,
    checkout,
    cluster_up,
    daemons_cpu,
    machine_busy,
    own_cpu,
    save_run,
    serve_worker,
)
from table1 import GiB, fmt, log, machine, socket_round_trip, table

MiB = 2**20
NODES = 3  # node 0: the writer's; node 1: remote memory; node 2: the reader's
WRITER_NODE, REMOTE_NODE, READER_NODE = 0, 1, 2
ROWS = 2**27  # 134,217,728 uint64 values = 1 GiB (thesis Table 5.5)
CAPACITY = 1280 * MiB  # per node: the table (1 GiB + a few hundred bytes) and room to spare
CHUNK = 2**16  # rows per fill step: a 512 KiB ramp that stays in L2
TIMEOUT_MS = 30_000  # a create waits this long for the previous table's memory
VARIANTS = ("noncoherent", "coherent")
PLACEMENTS = {"local": WRITER_NODE, "remote": REMOTE_NODE}
PHASES = ["alloc", "write", "flush", "seal", "serialise", "send"]
PHASE_LABELS = {
    "alloc": "allocation request (`create`, writable buffer back)",
    "write": "write (fill 1 GiB in place)",
    "flush": "flush (cache write-back over the object)",
    "seal": "seal (message; forwarded to the owner if remote)",
    "serialise": "descriptor serialise (IPC schema + batch header, id)",
    "send": "descriptor send (id to node 2, its get of the table)",
}
# Thesis Table 5.5 (ms): (a) remote memory, (b) local memory, as mapped onto
# our phases. The thesis's "pre-write flush" (51.84 ms in both) has no
# counterpart: shoal's readers invalidate at their first get (in "send").
THESIS = {
    "remote": {"alloc": 4.99, "prewrite": 51.84, "write": 180, "flush": 60.32, "serialise": 0.058,
               "send": 3.23, "total": 300.44},
    "local": {"alloc": 3.13, "prewrite": 51.84, "write": 10, "flush": 0.0, "serialise": 0.058,
              "send": 3.23, "total": 68.26},
}  # fmt: skip
TARGET = 1.3  # remote / local, whole initialisation (our issue)


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def make_ramp():
    return np.arange(CHUNK, dtype=np.uint64)


def fill(column, ramp):
    """column[i] = i, written in place chunk by chunk (no temporaries): the
    write every phase-by-phase and end-to-end run does, and the same loop the
    limits time on plain memory."""
    n = column.shape[0]
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        np.add(ramp[: stop - start], start, out=column[start:stop])


# ---------------------------------------------------------------- reader


class Reader:
    """A client of node 2: gets tables by id and checks them."""

    def __init__(self, socket):
        import pyarrow as pa

        import shoal

        self.pa, self.shoal = pa, shoal
        self.client = shoal.Client(socket)
        self.held = None

    def get(self, req):
        """Timed: the get of the table (lookup, acquire, invalidate on a
        non-coherent fabric, the IPC header read in place). Kept for `check`."""
        t0 = time.perf_counter()
        self.held = self.client.get(self.shoal.ObjectID.from_hex(req["id"]))
        return {"get_s": time.perf_counter() - t0}

    def check(self, req):
        """Untimed: the table has the expected shape and values, and lies in
        the owner's memory (not in this node's); then it is dropped."""
        t, rows = self.held, req["rows"]
        assert t.num_rows == rows and t.schema == self.pa.schema([("x", self.pa.uint64())])
        col = t.column(0).chunk(0)
        for i in (0, 1, rows // 3, rows - 1):
            assert col[i].as_py() == i, f"row {i} reads {col[i].as_py()}"
        address = col.buffers()[1].address
        base = self.client.region_address
        assert not base <= address < base + self.client.region_size, "the table was copied here"
        self.held = t = col = None
        self.client.contains(self.shoal.ObjectID(bytes(20)))  # the release is handled
        return {"ok": True}


def reader_main(socket):
    serve_worker(lambda: Reader(socket))


# ---------------------------------------------------------------- cluster


class Cluster:
    """One emulated cluster, this process's writer client (node 0) and the
    reader (node 2). Stopped with `down()` whatever happens."""

    def __init__(self, directory, coherence, errlog):
        self.directory, self.errlog = directory, errlog
        self.writer = self.reader = None
        self.cluster = cluster_up(
            directory, errlog, nodes=NODES, capacity=f"{CAPACITY // MiB}MiB", coherence=coherence
        )
        try:
            self.wait_resident()
        except BaseException:
            self.cluster.down(check=False)
            raise

    def socket(self, node):
        return self.cluster.socket(node)

    def pids(self):
        return [self.cluster.pid(node) for node in range(NODES)]

    def wait_resident(self, timeout=120):
        """Waits until every daemon's prefault thread has faulted its whole
        region in (its shared RSS reaches the capacity), so no phase pays for
        allocating pages that a running cluster would already hold."""
        deadline = time.monotonic() + timeout
        for pid in self.pids():
            while shmem_rss(pid) < CAPACITY * 0.99:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {pid} did not prefault its region in {timeout} s")
                time.sleep(0.05)

    def connect(self):
        import shoal

        self.shoal = shoal
        t0 = time.perf_counter()
        self.writer = shoal.Client(self.socket(WRITER_NODE))
        self.connect_s = time.perf_counter() - t0
        for node in range(NODES):
            with shoal.Client(self.socket(node)) as c:
                if c.capacity < CAPACITY:
                    raise RuntimeError(f"node {node} has capacity {c.capacity} B, asked for {CAPACITY} B")
        self.reader = ReaderProcess(self.socket(READER_NODE), self.errlog, script=__file__)

    def daemon_cpu(self):
        return daemons_cpu(self.directory, NODES)

    def down(self):
        if self.reader is not None:
            self.reader.close()
        if self.writer is not None:
            self.writer.close()
        used = self.daemon_cpu()
        self.cluster.down(check=False)
        return used


def shmem_rss(pid):
    """Bytes of shared memory mapped and resident in a process (RssShmem)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- measurements


def schema():
    import pyarrow as pa

    return pa.schema([("x", pa.uint64())])


def init_phases(cl, node, ramp):
    """One initialisation of the table in `node`'s memory, each phase timed
    apart. The steps are those of `TableBuilder` (shoal/arrow.py) in its own
    order: layout (serialise), create (alloc), header copy (serialise),
    fill (write), then flush and seal, then the descriptor to the reader."""
    from shoal import _codec
    from shoal.arrow import _layout

    writer, shoal = cl.writer, cl.shoal
    oid = shoal.ObjectID.from_random()
    clock = time.perf_counter
    t0 = clock()
    layout = _layout(schema(), ROWS)  # the IPC stream's metadata, and where the body goes
    t1 = clock()
    buffer = writer.create(oid, layout.position, _codec.TAG_ARROW + b"table", TIMEOUT_MS, node=node)
    t2 = clock()
    whole = memoryview(buffer)
    for position, data in layout.metadata:
        whole[position : position + len(data)] = data
    column = np.frombuffer(buffer, np.uint64, ROWS, layout.body[0][0])
    descriptor = oid.hex()  # what crosses to the reader
    t3 = clock()
    faults = minflt()
    fill(column, ramp)
    t4 = clock()
    faults = minflt() - faults
    flushed = writer._raw.flush_unsealed([oid])
    t5 = clock()
    writer.seal(oid)
    t6 = clock()
    got = cl.reader.call(op="get", id=descriptor)
    t7 = clock()
    cl.reader.call(op="check", rows=ROWS)
    del whole, column, buffer
    writer.delete([oid])
    return {
        "alloc": t2 - t1,
        "write": t4 - t3,
        "flush": t5 - t4,
        "seal": t6 - t5,
        "serialise": (t1 - t0) + (t3 - t2),
        "send": t7 - t6,
        "reader_get": got["get_s"],
        "write_faults": faults,
        "flushed": flushed,
        "nbytes": layout.position,
    }


def init_end_to_end(cl, node, ramp):
    """The same initialisation through the public API, timed as one:
    `create_table(..., node=k)`, fill, seal on leaving the `with` (flush
    included), the id to the reader and its get."""
    writer = cl.writer
    t0 = time.perf_counter()
    with writer.create_table(schema(), ROWS, timeout_ms=TIMEOUT_MS, node=node) as builder:
        column = builder["x"]
        fill(column, ramp)
        del column
    cl.reader.call(op="get", id=builder.id.hex())
    elapsed = time.perf_counter() - t0
    cl.reader.call(op="check", rows=ROWS)
    writer.delete([builder.id])
    return elapsed


def run_variant(coherence, args, errlog):
    """Every initialisation on one cluster. The first repetition (the new
    client's first table on each node) is kept apart."""
    directory = tempfile.mkdtemp(prefix="shoal-t55-", dir="/tmp")
    cl = None
    out = {"first": {}, "phases": {p: [] for p in PLACEMENTS}, "e2e": {p: [] for p in PLACEMENTS}}
    ramp = make_ramp()
    gc.collect()
    gc.disable()  # no collector pauses inside timed sections
    try:
        log(f"{coherence}: cluster up ({NODES} × {CAPACITY / GiB:.2f} GiB) ...")
        t0 = time.monotonic()
        cl = Cluster(directory, coherence, errlog)
        out["up_s"] = time.monotonic() - t0
        cl.connect()
        out["connect_s"] = cl.connect_s
        out["version"] = f"shoal {cl.shoal.__version__}"
        for rep in range(args.warmup + args.reps):
            # Alternate which placement goes first, so drift falls on both alike.
            order = list(PLACEMENTS) if rep % 2 == 0 else list(reversed(PLACEMENTS))
            if rep == 0:
                order = list(PLACEMENTS)  # the first remote table follows the first local one
            for name in order:
                phases = init_phases(cl, PLACEMENTS[name], ramp)
                e2e = init_end_to_end(cl, PLACEMENTS[name], ramp)
                if rep < args.warmup:
                    out["first"].setdefault(name, {**phases, "e2e": e2e})
                    continue
                out["phases"][name].append(phases)
                out["e2e"][name].append(e2e)
            if rep >= args.warmup:
                med = {n: out["phases"][n][-1] for n in PLACEMENTS}
                log(
                    f"  rep {rep - args.warmup + 1}: "
                    + ", ".join(
                        f"{n} {sum(med[n][p] for p in PHASES) * 1e3:.0f} ms"
                        f" (e2e {out['e2e'][n][-1] * 1e3:.0f})"
                        for n in PLACEMENTS
                    )
                )
    finally:
        gc.enable()
        if cl is not None:
            out["daemon_cpu_s"] = cl.down()
        shutil.rmtree(directory, ignore_errors=True)
    return out


# ---------------------------------------------------------------- limits


def timed_best(n, fn, *args):
    """(best, median) seconds of n calls of fn(*args)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def measure_limits(n=3):
    """1 GiB limits on this machine, best and median of n: memset and the
    fill routine into a warm 1 GiB shared mapping (4 KiB pages, like a
    region) and into a warm numpy array (huge pages), memcpy between two warm
    numpy arrays, the fill through a *fresh* mapping of already-resident
    shared memory (one minor page fault per 4 KiB page, no allocation: what a
    write through an unpopulated mapping of a peer's region costs), and the
    Unix socket round trip."""
    nbytes = ROWS * 8
    ramp = make_ramp()
    out = {}
    shared = np.frombuffer(mmap.mmap(-1, nbytes), np.uint64)
    shared.fill(1)
    out["memset_shared"] = timed_best(n, shared.fill, 7)
    out["fill_shared"] = timed_best(n, fill, shared, ramp)
    del shared
    a = np.ones(ROWS, np.uint64)
    b = np.ones(ROWS, np.uint64)
    out["memset_numpy"] = timed_best(n, a.fill, 7)
    out["memcpy_numpy"] = timed_best(n, np.copyto, b, a)
    del a, b
    fd = os.memfd_create("t55-limit")
    try:
        os.ftruncate(fd, nbytes)
        warm = np.frombuffer(mmap.mmap(fd, nbytes), np.uint64)
        warm.fill(1)  # every page resident
        times, faults = [], []
        for _ in range(n):
            view = np.frombuffer(mmap.mmap(fd, nbytes), np.uint64)  # no page tables yet
            before, t0 = minflt(), time.perf_counter()
            fill(view, ramp)
            times.append(time.perf_counter() - t0)
            faults.append(minflt() - before)
            del view
        out["fill_fresh_mapping"] = (min(times), statistics.median(times))
        out["fresh_mapping_faults"] = max(faults)
        del warm
    finally:
        os.close(fd)
    out["socket_rtt"] = socket_round_trip()
    return out


def best_limits(runs):
    best = {}
    for key in runs[0]:
        if key == "socket_rtt":
            best[key] = min((r[key] for r in runs), key=lambda r: r["median_us"])
        elif key == "fresh_mapping_faults":
            best[key] = max(r[key] for r in runs)
        else:
            best[key] = (min(r[key][0] for r in runs), min(r[key][1] for r in runs))
    return best


# ---------------------------------------------------------------- report


def med(samples):
    return statistics.median(samples)


def phase_samples(var, name, phase):
    rows = var["phases"][name]
    if phase == "sum":
        return [sum(r[p] for p in PHASES) for r in rows]
    return [r[phase] for r in rows]


def ms_cell(samples):
    return f"{fmt(min(samples) * 1e3)} / {fmt(med(samples) * 1e3)}"


def ratio_cell(num, den):
    if med(den) <= 0 or min(den) <= 0:
        return "–"
    return f"{fmt(min(num) / min(den))} / {fmt(med(num) / med(den))}"


def thesis_ms(name, key):
    return fmt(THESIS[name][key]) if key in THESIS[name] else "–"


def variant_table(var):
    """Phase rows: local and remote (ms, best / median), remote / local, and
    the thesis's numbers for the same phase."""
    rows = []
    for key in [*PHASES, "sum"]:
        loc, rem = (phase_samples(var, n, key) for n in PLACEMENTS)
        label = PHASE_LABELS.get(key, "**sum of the phases**")
        th = "total" if key == "sum" else key
        rows.append([label, ms_cell(loc), ms_cell(rem), ratio_cell(rem, loc),
                     thesis_ms("local", th), thesis_ms("remote", th)])  # fmt: skip
    loc, rem = var["e2e"]["local"], var["e2e"]["remote"]
    rows.append(["**end to end** (`create_table`, fill, seal, reader's get; one clock)",
                 ms_cell(loc), ms_cell(rem), ratio_cell(rem, loc), "68.26", "300.44"])  # fmt: skip
    faults = [max(r["write_faults"] for r in var["phases"][n]) for n in PLACEMENTS]
    rows.append(["minor page faults in the write (max)", f"{faults[0]:,}", f"{faults[1]:,}", "", "", ""])
    return rows


def first_table(var):
    rows = []
    for name in PLACEMENTS:
        f = var["first"].get(name)
        if not f:
            continue
        total = sum(f[p] for p in PHASES)
        rows.append([name, *(fmt(f[p] * 1e3) for p in PHASES), fmt(total * 1e3), fmt(f["e2e"] * 1e3),
                     f"{f['write_faults']:,}"])  # fmt: skip
    return rows


def limit_rows(lim):
    nbytes = ROWS * 8

    def bw(key):
        best, median = lim[key]
        return f"{nbytes / best / GiB:.2f} / {nbytes / median / GiB:.2f} GiB/s ({fmt(best * 1e3)} ms best)"

    rtt = lim["socket_rtt"]
    return [
        ["memset 1 GiB, warm shared mapping (4 KiB pages, like a region)", bw("memset_shared")],
        ["fill routine (the write phase's loop), same warm shared mapping", bw("fill_shared")],
        ["memset 1 GiB, warm numpy array (huge pages)", bw("memset_numpy")],
        ["memcpy 1 GiB between warm numpy arrays (`np.copyto`)", bw("memcpy_numpy")],
        [
            "fill routine through a fresh mapping of resident shared memory "
            f"({lim['fresh_mapping_faults']:,} minor faults, one per 4 KiB page)",
            bw("fill_fresh_mapping"),
        ],
        [
            "Unix socket round trip, 1 byte, 2 processes on 2 cores",
            f"{rtt['median_us']:.1f} µs median ({rtt['min_us']:.1f} µs min)",
        ],
    ]


def ratio_rows(res, lim):
    """Ratios against the limits and the targets, judged on medians."""
    nbytes = ROWS * 8
    fill_limit = lim["fill_shared"][1]
    rtt = lim["socket_rtt"]["median_us"] * 1e-6
    rows = []
    for variant in res["variants"]:
        var = res["variants"][variant]
        for name in PLACEMENTS:
            write = med(phase_samples(var, name, "write"))
            flush = med(phase_samples(var, name, "flush"))
            send = med(phase_samples(var, name, "send"))
            flush_note = f"{nbytes / flush / GiB:.1f} GiB/s" if flush > 1e-3 else "no flush"
            rows.append([
                f"{variant}, {name}",
                f"{fmt(write / fill_limit)}",
                flush_note,
                f"{fmt(send / rtt)}",
                fmt(med(phase_samples(var, name, "sum")) / fill_limit),
            ])  # fmt: skip
    return rows


def targets(res):
    lines = [
        "| variant | measure | remote / local (median) | goal | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for variant, var in res["variants"].items():
        for label, loc, rem in [
            ("end to end", var["e2e"]["local"], var["e2e"]["remote"]),
            ("sum of the phases", phase_samples(var, "local", "sum"), phase_samples(var, "remote", "sum")),
        ]:
            r = med(rem) / med(loc)
            met = "yes" if r <= TARGET else "**no**"
            lines.append(f"| {variant} | {label} | {fmt(r)} | ≤ {TARGET} | {met} |")
    return lines


HEADS = ["local (ms)", "remote (ms)", "remote / local", "thesis local (ms)", "thesis remote (ms)"]
RATIO_HEADS = ["write / fill limit", "flush", "send / RTT", "sum / fill limit"]
FIRST_HEADS = [*PHASES, "sum", "end to end", "write faults"]


def report(run):
    res, lim, mach = run["results"], run["limits"], run["machine"]
    nc = res["variants"].get("noncoherent")
    lines = [
        "# Table 5.5: initialising a 1 GiB table in local vs remote memory",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        f"Machine: {mach['cpu']}, nproc {mach['nproc']}, {mach['memory_gib']} GiB RAM, {mach['kernel']};"
        f" Python {mach['python']}, numpy {mach['numpy']}, pyarrow {run['pyarrow']}. Load average (1 min)"
        f" before the run {run['load']:.2f}; during the {run['seconds']:.0f} s run other processes used"
        f" {run['others_cpu_s']:.1f} CPU-seconds"
        f" ({run['others_cpu_s'] / run['seconds'] / mach['nproc']:.0%} of the machine).",
        "",
        f"Cluster: {res['version']} ({run['checkout']}), {NODES} nodes emulated on this host"
        f" (`python -m shoal cluster up`), {CAPACITY / GiB:.2f} GiB per node, mapped mode, regions"
        " prefaulted before the first measurement. Cache write-back instruction on this CPU:"
        f" `{run['flush_instruction']}`.",
        "",
        f"The table: one uint64 column, {ROWS:,} rows ({ROWS * 8 / GiB:.0f} GiB of values;"
        f" the object is {res['nbytes']:,} B with its Arrow IPC header). Created by a client of"
        " node 0 (this process): *local* = in node 0's memory, *remote* = in node 1's memory"
        " (`node=1`). The descriptor goes to a reader process, a client of node 2, which gets the"
        " table and answers; for both placements the reader is on a third node. Cells are"
        f" `best / median` of {run['reps']} repetitions after {run['warmup']} warm-up (the warm-up,"
        " the writer's first table on each node, is shown apart); ratios from the best and from"
        ' the median values. Definitions: bench/README.md, "Table 5.5".',
        "",
        "## Machine limits (best / median of 3, two measurements in this run, the better kept)",
        "",
        *table("limit", ["value"], limit_rows(lim)),
        "",
    ]
    for variant, var in res["variants"].items():
        what = (
            '`coherence = "noncoherent"`, real caches (no simulation): the seal writes back the'
            f" object's lines (`{run['flush_instruction']}` per 64 B, then a fence), the reader's get"
            " invalidates them (`clflushopt`) before handing out the table"
            if variant == "noncoherent"
            else '`coherence = "coherent"`: no cache maintenance (the flush phase does nothing)'
        )
        lines += [
            f"## {variant.capitalize()} cluster",
            "",
            f"{what}. Cluster start {fmt(var['up_s'])} s (prefault included); the writer's connect"
            f" (its own region mapped and populated) {fmt(var['connect_s'] * 1e3)} ms.",
            "",
            *table("phase", HEADS, variant_table(var)),
            "",
            "Descriptor send, the reader's part: its get of the table took "
            + ", ".join(f"{ms_cell(phase_samples(var, n, 'reader_get'))} ms ({n})" for n in PLACEMENTS)
            + "; the rest is the pipe round trip to the reader process.",
            "",
            "First initialisation by the new writer client (the warm-up; ms). The remote one"
            " includes mapping node 1's region writable in this process; the reader's first get of"
            " each node's object includes mapping that node's region read-only.",
            "",
            *table("placement", FIRST_HEADS, first_table(var)),
            "",
        ]
    lines += [
        "## Ratios to the machine's limits (medians)",
        "",
        "*write / fill limit*: the write phase over the same fill loop on a warm shared mapping."
        " *flush*: bytes written back per second. *send / RTT*: the descriptor send over one Unix"
        " socket round trip. *sum / fill limit*: the whole initialisation over the time just to"
        " write 1 GiB.",
        "",
        *table("variant, placement", RATIO_HEADS, ratio_rows(res, lim)),
        "",
        f"## Target (remote ≤ {TARGET} × local for the whole initialisation, judged on medians)",
        "",
        *targets(res),
        "",
    ]
    if nc:
        loc, rem = (med(var_e2e) for var_e2e in (nc["e2e"]["local"], nc["e2e"]["remote"]))
        lines += [
            f"Thesis (ThymesisFlow, POWER9): remote 300.44 ms vs local 68.26 ms, {300.44 / 68.26:.1f}×."
            f" Here, non-coherent, end to end: remote {fmt(rem * 1e3)} ms vs local {fmt(loc * 1e3)} ms,"
            f' {fmt(rem / loc)}×. In mapped mode on one host "remote" memory is the same DRAM behind a'
            " second mapping, so this measures what shoal adds on the way (RPCs, mappings, faults,"
            " flushes), not what a fabric costs.",
            "",
        ]
    if run["plots"]:
        lines += ["Plot: " + ", ".join(f"[{p}]({p})" for p in run["plots"]) + ".", ""]
    else:
        lines += [f"Plot: not drawn ({run['plots_note']}).", ""]
    return "\n".join(lines)


def plot(run, out_dir):
    """Stacked bars of the phases' medians, ours and the thesis's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = run["results"]
    bars, labels = [], []
    for variant, var in res["variants"].items():
        for name in PLACEMENTS:
            bars.append([med(phase_samples(var, name, p)) * 1e3 for p in PHASES] + [0.0])
            labels.append(f"shoal {variant}\n{name}")
    for name in PLACEMENTS:
        th = THESIS[name]
        bars.append([th.get(p, 0.0) for p in PHASES] + [th["prewrite"]])
        labels.append(f"thesis\n{name}")
    keys = [*PHASES, "pre-write flush (thesis)"]
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    left = [0.0] * len(bars)
    for i, key in enumerate(keys):
        vals = [b[i] for b in bars]
        if not any(vals):
            continue
        ax.barh(range(len(bars)), vals, left=left, label=key)
        left = [lft + v for lft, v in zip(left, vals, strict=True)]
    ax.set_yticks(range(len(bars)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time, median (ms)")
    ax.set_title("Initialising a 1 GiB uint64 table, by phase")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    name = "table55.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return [name]


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="first repetitions, reported apart")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "table55.md"))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="noncoherent,coherent or one of them")
    ap.add_argument("--reader", metavar="SOCKET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    if args.reader:
        return reader_main(args.reader)
    args.warmup = max(1, args.warmup)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    import pyarrow

    import shoal

    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python bench/table55.py " + " ".join(sys.argv[1:]),
        "reps": args.reps,
        "warmup": args.warmup,
        "machine": machine(),
        "pyarrow": pyarrow.__version__,
        "checkout": checkout(),
        "flush_instruction": shoal._internal.flush_instruction(),
    }
    results = {"limit_runs": [], "variants": {}}
    started, busy, own = time.monotonic(), machine_busy(), own_cpu()
    run["load"] = os.getloadavg()[0]
    daemons = 0.0
    with open(os.path.join(out_dir, "raw-table55.log"), "w") as errlog:
        log("machine limits ...")
        results["limit_runs"].append(measure_limits())
        for variant in variants:
            var = run_variant(variant, args, errlog)
            daemons += var.pop("daemon_cpu_s", 0.0)
            results["version"] = var.pop("version")
            results["variants"][variant] = var
        log("machine limits ...")
        results["limit_runs"].append(measure_limits())
    first = next(iter(results["variants"].values()))
    results["nbytes"] = first["phases"]["local"][0]["nbytes"]
    run["results"], run["limits"] = results, best_limits(results["limit_runs"])
    run["seconds"] = time.monotonic() - started
    run["others_cpu_s"] = max(0.0, machine_busy() - busy - (own_cpu() - own + daemons))
    save_run(run, args.out, "raw-table55.json", plot, report)


if __name__ == "__main__":
    main()
