"""Start-up of a large store (issue 14, item 5): how soon `shoal serve` serves.

    python3 bench/startup.py --capacity 8GiB [--variant before=DIR] \
        --out bench/results/startup.md

For each build (the project's, and each `--variant NAME=DIR` whose DIR holds
another build of the `shoal` package), in a child process: start
`python -m shoal serve --capacity C` (this tree's shoal.testing.Daemon, not waited
for), then time, from the start, the socket's appearance, the first client's
connection (Hello → Welcome → mapped; the child imports pyarrow first, which the
first `Client()` would otherwise do) and its first put of 1 kB; then, for
`--seconds`, one 1 kB create + write + seal every millisecond (latency p50 / p99 /
max while the region is still being faulted in) and finally one 100 MB put. The
daemon is stopped before the next build.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import shoal.testing

CHILD = r"""
import importlib.util, json, os, sys, time
from pathlib import Path
import numpy as np
import pyarrow  # imported by the first Client() otherwise (~0.1 s): not the daemon's time
import shoal

directory, capacity, seconds, harness = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
# This tree's shoal.testing, whichever build `shoal` is (an older one may have none).
spec = importlib.util.spec_from_file_location("shoal_testing", harness)
testing = importlib.util.module_from_spec(spec)
spec.loader.exec_module(testing)
big = np.ones(100_000_000, np.uint8)
src = np.zeros(1000, np.uint8)
# Prefaulted, as `serve` is by default; not waited for: the loop below times the start.
daemon = testing.Daemon(directory, capacity, prefault=True, wait=False)
t0 = daemon.started
sock = daemon.socket
try:
    while not os.path.exists(sock):
        time.sleep(0.0005)
    t_socket = time.monotonic() - t0
    client = shoal.Client(sock)
    t_connected = time.monotonic() - t0
    client.put(src)
    t_first_put = time.monotonic() - t0
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = time.perf_counter()
        oid = shoal.ObjectID(os.urandom(20))
        buf = client.create(oid, 1000)
        memoryview(buf)[:] = src
        client.seal(oid, True)
        del buf
        latencies.append(time.perf_counter() - a)
        time.sleep(0.001)
    a = time.perf_counter()
    client.put(big)
    t_big = time.perf_counter() - a
    latencies.sort()
    print(json.dumps({
        "socket_ms": t_socket * 1e3, "connected_ms": t_connected * 1e3,
        "first_put_ms": t_first_put * 1e3,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "max_ms": latencies[-1] * 1e3, "calls": len(latencies),
        "put_100mb_ms": t_big * 1e3, "version": os.path.dirname(shoal.__file__),
    }))
finally:
    daemon.teardown(check=False, timeout=120)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", default="8GiB")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME=DIR: another shoal build")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    builds = [("shoal", None)] + [tuple(v.split("=", 1)) for v in args.variant]
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-startup-") as tmp:
        for rnd in range(args.rounds):
            for name, path in builds:
                env = dict(os.environ)
                if path:
                    env["PYTHONPATH"] = os.path.abspath(path)
                directory = os.path.join(tmp, f"{name}-{rnd}")
                child = [CHILD, directory, args.capacity, str(args.seconds), shoal.testing.__file__]
                load = os.getloadavg()[0]
                out = subprocess.run(
                    [sys.executable, "-c", *child],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                row = json.loads(out.strip().splitlines()[-1]) | {"build": name, "load": load}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    lines = [
        f"# Start-up of a {args.capacity} store",
        "",
        f"Generated {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} by "
        f"`python3 bench/startup.py {' '.join(sys.argv[1:])}`.",
        "",
        "Times from the start of `python -m shoal serve` (interpreter start included). Latency: one 1 kB"
        f" create + write + seal per millisecond during the first {args.seconds:g} s after the first put.",
        "",
        "| build | load | socket (ms) | first client connected (ms) | first put done (ms) |"
        " 1 kB create p50 / p99 (µs), max (ms) | 100 MB put afterwards (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['build']} | {r['load']:.2f} | {r['socket_ms']:.0f} | {r['connected_ms']:.0f} |"
            f" {r['first_put_ms']:.0f} | {r['p50_us']:.0f} / {r['p99_us']:.0f}, {r['max_ms']:.1f} |"
            f" {r['put_100mb_ms']:.0f} |"
        )
    lines += ["", "Builds:", ""] + [f"- {n}: {p or 'the project (this tree)'}" for n, p in builds]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
