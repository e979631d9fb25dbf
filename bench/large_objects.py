"""Large objects (issue 14, item 4): put bandwidth against the machine's best copy,
and a single get of 100 MB against a single get of 1 kB, beside Plasma.

    python3 bench/large_objects.py --reps 5 [--variant before=DIR] \
        --out bench/results/large-objects.md

The limit is a C program (bench/c/copy_limit.c, built here with `cc -O2`)
copying the same sizes into a warm shared mapping with glibc memcpy, rep movsb
and SSE2 / AVX2 non-temporal stores: the best of them is "the best copy this
machine can do". It runs before every store so that limits and stores are
measured minutes apart. Stores are driven exactly as bench/table1.py drives them
(bench/adapters.py: a writer process puts, a second process gets one batch and
reads it), on the workloads 1 × 1 kB, 1 × 100 MB and 10 × 100 MB.
`--variant NAME=DIR` adds another build of the shoal package (DIR holds it).
"""

import argparse
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
GiB = 2**30


def build_copy_limit(tmp):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = os.path.join(tmp, "copy_limit")
    subprocess.run([cc, "-O2", "-o", exe, os.path.join(BENCH, "c", "copy_limit.c")], check=True)
    return exe


def copy_limits(exe, sizes, reps=5):
    """{size: {method: best GiB/s}}."""
    out = {}
    for size in sizes:
        lines = subprocess.run([exe, str(size), str(reps)], check=True, capture_output=True, text=True)
        out[size] = {m: float(v) for m, v in (line.split() for line in lines.stdout.splitlines())}
    return out


def run_store(store, args, pythons, tmp, env):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        table1.WORKLOADS = WORKLOADS
        return table1.run_store(store, args, pythons, tmp)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--stores", default="plasma,shoal,shoal-each")
    ap.add_argument("--variant", action="append", default=[], help="NAME=DIR: another shoal build")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "large-objects.md"))
    args = ap.parse_args()
    args.raw_dir = tempfile.mkdtemp(prefix="shoal-large-logs-")

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
    results, limits = {}, []
    with tempfile.TemporaryDirectory(prefix="shoal-large-") as tmp:
        exe = build_copy_limit(tmp)
        for label, store, env in runs:
            if exe:
                limits.append(copy_limits(exe, sorted({s for _, s in WORKLOADS if s >= 10**6})))
                table1.log(f"limits: {limits[-1]}")
            table1.log(f"{label} ...")
            results[label] = run_store(store, args, pythons, tmp, env)
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
    if limits:
        methods = list(limits[0][100_000_000])
        lines += ["| measurement | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for i, lim in enumerate(limits):
            row = lim[100_000_000]
            cells = " | ".join(f"{row[m]:.2f}" for m in methods)
            lines.append(f"| 100 MB, before store {i + 1} | {cells} |")
        best = max(max(lim[100_000_000].values()) for lim in limits)
        lines += ["", f"Best copy of 100 MB in this run: **{best:.2f} GiB/s**.", ""]
    else:
        best = None
        lines += ["No C compiler: limits not measured.", ""]
    lines += [
        "## Stores",
        "",
        "| store | put 1 × 100 MB (GiB/s) | put 10 × 100 MB (GiB/s) | put / best copy (10 × 100 MB)"
        " | get 1 × 1 kB (µs) | get 1 × 100 MB (µs) | get 10 × 100 MB (µs) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
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

        p1, p10 = bw((1, 100_000_000)), bw((10, 100_000_000))
        ratio = f"{p10[0] / best:.2f} / {p10[1] / best:.2f}" if best else "—"
        g = [get_us(k) for k in WORKLOADS]
        lines.append(
            f"| {label} | {p1[0]:.2f} / {p1[1]:.2f} | {p10[0]:.2f} / {p10[1]:.2f} | {ratio} | "
            + " | ".join(f"{b:.0f} / {m:.0f}" for b, m in g)
            + " |"
        )
    lines += [
        "",
        "put: create + write + seal in the writer (shoal: put_batch, a Rust copy; shoal-each: create,"
        " `memoryview(buf)[:] = src`, seal; Plasma: the same). get: one get_buffers call in a second"
        " process, until the buffers are back.",
    ]
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
