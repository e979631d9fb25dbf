"""Large objects (issue 14, item 4): put bandwidth against the machine's best copy,
and a single get of 100 MB against a single get of 1 kB, beside Plasma.

    python3 bench/large_objects.py --reps 5 [--variant before=DIR] \
        --out bench/results/large-objects.md

The limit is a C program (bench/c/copy_limit.c, built here with `cc -O2`)
copying the same sizes into a warm shared mapping with glibc memcpy, rep movsb
and SSE2 / AVX2 non-temporal stores (10 × 100 MB into ten places): the best of
them is "the best copy this machine can do". It runs before every store, and
once more right before each put of a paired series (limit, put, limit, put...),
whose per-pair ratios do not depend on the machine's drift over minutes. A shoal
daemon's region is resident before anything is measured. Stores are driven
exactly as bench/table1.py drives them (bench/adapters.py: a writer process
puts, a second process gets one batch and reads it), on the workloads 1 × 1 kB,
1 × 100 MB and 10 × 100 MB; then each get again in a getter started for it,
after 100 MB were written whatever the object's size (1 kB and 100 MB gets meet
the same caches).
`--variant NAME=DIR` adds another build of the shoal package (DIR holds it).
"""

import argparse
import contextlib
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import table1  # noqa: E402 - the same workers and servers as Table I

WORKLOADS = [(1, 1_000), (1, 100_000_000), (10, 100_000_000)]
FRESH_SIZES = [1_000, 100_000_000]
LARGE = [(1, 100_000_000), (10, 100_000_000)]  # the puts compared with the best copy
GiB = 2**30


def build_copy_limit(tmp):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = os.path.join(tmp, "copy_limit")
    subprocess.run([cc, "-O2", "-o", exe, os.path.join(BENCH, "c", "copy_limit.c")], check=True)
    return exe


def copy_limits(exe, workloads, reps=5):
    """{(count, size): {method: best GiB/s}}: count copies of size bytes into count places."""
    out = {}
    for count, size in workloads:
        cmd = [exe, str(size), str(reps), str(count)]
        lines = subprocess.run(cmd, check=True, capture_output=True, text=True)
        out[(count, size)] = {m: float(v) for m, v in (line.split() for line in lines.stdout.splitlines())}
    return out


@contextlib.contextmanager
def environment(env):
    """os.environ with `env` added (a variant's PYTHONPATH reaches every worker)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_store(store, args, pythons, tmp, env):
    with environment(env):
        table1.WORKLOADS = WORKLOADS
        return table1.run_store(store, args, pythons, tmp)


@contextlib.contextmanager
def serving(store, name, args, pythons, tmp, env):
    """A store's server (resident) and a writer worker: yields (writer, start a worker)."""
    _, server_kind, python = table1.STORES[store]
    sock = os.path.join(tmp, f"{name}-{store}.sock")
    with (
        environment(env),
        open(os.path.join(args.raw_dir, f"raw-{name}-{store}.log"), "w") as errlog,
        table1.server(server_kind, sock, errlog, pythons["plasma"]) as sock,
    ):
        writer = table1.Worker(pythons[python], store, sock, errlog)
        try:
            yield writer, lambda: table1.Worker(pythons[python], store, sock, errlog)
        finally:
            writer.close()


def fresh_gets(store, args, pythons, tmp, env):
    """{size: [(get, read) seconds]}: each get in a getter process started for it (its mapping of
    the store never used), after the writer wrote 100 MB (the 1 kB object gets a 100 MB
    ballast object beside it), so that a 1 kB and a 100 MB get meet the same caches."""
    out = {size: [] for size in FRESH_SIZES}
    with serving(store, "fresh", args, pythons, tmp, env) as (writer, worker):
        for rep in range(args.warmup + args.reps):
            for size in FRESH_SIZES:
                getter = worker()
                try:
                    ballast = 100_000_000 if size < 100_000_000 else 0
                    put = writer.call(op="put", count=1, size=size, ballast=ballast)
                    get = getter.call(
                        op="get", ids=put["ids"][:1], size=size, head=put["head"], tail=put["tail"]
                    )
                    writer.call(op="delete")
                finally:
                    getter.close()
                if rep >= args.warmup:
                    out[size].append((get["get_s"], get["read_s"]))
    return out


def paired_puts(store, args, pythons, tmp, env, exe):
    """[(put GiB/s, best copy GiB/s)] of 10 × 100 MB, the limit measured (one pass of each
    method) right before each put: a ratio of two numbers taken a second apart, not minutes."""
    count, size = LARGE[-1]
    pairs = []
    with serving(store, "paired", args, pythons, tmp, env) as (writer, _):
        for rep in range(args.warmup + args.reps):
            limit = max(copy_limits(exe, [(count, size)], reps=1)[(count, size)].values())
            put = writer.call(op="put", count=count, size=size)
            writer.call(op="delete")
            if rep >= args.warmup:
                pairs.append((count * size / put["put_s"] / GiB, limit))
    return pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--stores", default="plasma,shoal,shoal-each")
    ap.add_argument("--variant", action="append", default=[], help="NAME=DIR: another shoal build")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "large-objects.md"))
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    args.raw_dir = tempfile.mkdtemp(prefix="shoal-large-logs-")
    table1.WAIT_RESIDENT = True  # the copy limits copy into warm memory too

    plasma_python = subprocess.run(
        ["bash", os.path.join(BENCH, "setup_plasma.sh")], stdout=subprocess.PIPE, check=True, text=True
    ).stdout.splitlines()[-1]
    pythons = {"project": sys.executable, "plasma": plasma_python}
    runs = []  # (label, store, env)
    for store in args.stores.split(","):
        runs.append((store, store, {}))
        if store.startswith("shoal"):
            for v in args.variant:
                name, path = v.split("=", 1)
                runs.append((f"{store} [{name}]", store, {"PYTHONPATH": os.path.abspath(path)}))
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results, limits, fresh, paired = {}, [], {}, {}
    with tempfile.TemporaryDirectory(prefix="shoal-large-") as tmp:
        exe = build_copy_limit(tmp)
        for label, store, env in runs:
            if exe:
                limits.append(copy_limits(exe, LARGE))
                table1.log(f"limits: {limits[-1]}")
            table1.log(f"{label} ...")
            results[label] = run_store(store, args, pythons, tmp, env)
            if "workloads" in results[label]:
                table1.log(f"{label}: gets in fresh getters ...")
                fresh[label] = fresh_gets(store, args, pythons, tmp, env)
                if exe:
                    table1.log(f"{label}: puts paired with the copy limit ...")
                    paired[label] = paired_puts(store, args, pythons, tmp, env, exe)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())

    def med(xs):
        return statistics.median(xs)

    lines = [
        "# Large objects",
        "",
        f"Generated {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} by "
        f"`python3 bench/large_objects.py {' '.join(sys.argv[1:])}`; load average {load_start}"
        f" at the start, {load_end} at the end.",
        "",
        f"Cells: best / median of {args.reps} repetitions (after {args.warmup} discarded).",
        "",
        "## The machine's best copy into a warm shared mapping (GiB/s, best of each method)",
        "",
    ]
    best = {}
    if limits:
        methods = list(limits[0][LARGE[0]])
        lines += ["| measurement | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for i, lim in enumerate(limits):
            for count, size in LARGE:
                cells = " | ".join(f"{lim[(count, size)][m]:.2f}" for m in methods)
                lines.append(f"| {count} × {size // 10**6} MB, before store {i + 1} | {cells} |")
        for key in LARGE:
            best[key] = max(max(lim[key].values()) for lim in limits)
        lines += [
            "",
            "Best copy in this run: "
            + ", ".join(f"{c} × {s // 10**6} MB **{best[(c, s)]:.2f} GiB/s**" for c, s in LARGE)
            + ".",
            "",
        ]
    else:
        lines += ["No C compiler: limits not measured.", ""]
    lines += [
        "## Stores",
        "",
        "| store | put 1 × 100 MB (GiB/s) | put 10 × 100 MB (GiB/s) | put / best copy (1 × 100 MB)"
        " | put / best copy (10 × 100 MB) | get 1 × 1 kB (µs) | get 1 × 100 MB (µs)"
        " | get 10 × 100 MB (µs) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, res in results.items():
        if "workloads" not in res:
            lines.append(f"| {label} | not measured: {res.get('unavailable') or res.get('failed')} |")
            continue
        w = {(x["count"], x["size"]): x["samples"] for x in res["workloads"]}

        def bw(key, w=w):
            c, s = key
            ts = w[key]["put_s"]
            return c * s / min(ts) / GiB, c * s / med(ts) / GiB

        def get_us(key, w=w):
            ts = w[key]["get_s"]
            return min(ts) * 1e6, med(ts) * 1e6

        puts = {key: bw(key) for key in LARGE}
        ratios = [
            f"{puts[key][0] / best[key]:.2f} / {puts[key][1] / best[key]:.2f}" if best else "—"
            for key in LARGE
        ]
        g = [get_us(k) for k in WORKLOADS]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{puts[key][0]:.2f} / {puts[key][1]:.2f}" for key in LARGE)
            + " | "
            + " | ".join(ratios)
            + " | "
            + " | ".join(f"{b:.0f} / {m:.0f}" for b, m in g)
            + " |"
        )
    if paired:
        lines += [
            "",
            "## Puts of 10 × 100 MB, each right after the best copy (one pass of each method)",
            "",
            "| store | put (GiB/s) | best copy (GiB/s) | put / best copy |",
            "| --- | --- | --- | --- |",
        ]
        for label, pairs in paired.items():
            puts = [p for p, _ in pairs]
            copies = [c for _, c in pairs]
            ratios = [p / c for p, c in pairs]
            lines.append(
                f"| {label} | {max(puts):.2f} / {med(puts):.2f} | {max(copies):.2f} / {med(copies):.2f}"
                f" | {max(ratios):.2f} / {med(ratios):.2f} |"
            )
    lines += [
        "",
        "## A get in a getter that never used the store's memory, after 100 MB were written",
        "",
        "| store | get 1 × 1 kB (µs) | get 1 × 100 MB (µs) | 100 MB / 1 kB | then read 100 MB (ms)"
        " | get + read 100 MB (ms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, sizes in fresh.items():
        small = [g for g, _ in sizes[FRESH_SIZES[0]]]
        large = [g for g, _ in sizes[FRESH_SIZES[1]]]
        read = [r for _, r in sizes[FRESH_SIZES[1]]]
        total = [g + r for g, r in sizes[FRESH_SIZES[1]]]
        lines.append(
            f"| {label} | {min(small) * 1e6:.0f} / {med(small) * 1e6:.0f}"
            f" | {min(large) * 1e6:.0f} / {med(large) * 1e6:.0f}"
            f" | {min(large) / min(small):.2f} / {med(large) / med(small):.2f}"
            f" | {min(read) * 1e3:.1f} / {med(read) * 1e3:.1f}"
            f" | {min(total) * 1e3:.1f} / {med(total) * 1e3:.1f} |"
        )
    lines += [
        "",
        "put: create + write + seal in the writer (shoal: put_batch, a Rust copy; shoal-each: create,"
        " `memoryview(buf)[:] = src`, seal; Plasma: the same). get: one get_buffers call in a second"
        " process, until the buffers are back. The Stores table's getter lives through all"
        " repetitions; after a 100 MB object was written and read, its caches and TLB are cold,"
        " which a 1 kB workload does not do to them. The fresh-getter table starts a getter per get"
        " (connected before the timing) and writes a 100 MB ballast object beside the 1 kB one,"
        " so both sizes meet the same state; the read after the get takes the page-table work a"
        " get leaves to the populating thread (docs/architecture.md, Prefaulting).",
    ]
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
