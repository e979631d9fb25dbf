"""Membership on etcd: what a join, a clean leave and a kill -9 cost, beside the static file.

    python bench/membership.py --out bench/results/membership.md

Starts one etcd (Debian's etcd-server; scripts/setup-test-tools.sh installs it) and writes a
4-node cluster file (`shoal cluster up --nodes 4`, stopped at once: its file is what the
nodes run), then one `shoal serve` process per node. Measured, in one run:
  static  nodes 0-2 on the file alone: WORKERS processes each put a 1 kB object through one
          node, get it through another, check it and delete it, for --phase seconds;
  etcd    the same nodes with `--membership`, under the same load, their file without node 3
          (node 3's lists only itself: the members learn it from its etcd record), in phases:
            steady  nothing changes;
            join    node 3 starts; leave: it is stopped with SIGTERM (it leaves at once);
                    join again; kill: it is killed with SIGKILL;
          view changes from the daemons' logs (one host, one clock): a join or leave from
          the view's proposal (whichever node's) to the last of nodes 0-2 adopting it
          (target: 100 ms); a kill to the first node adopting the view without it (target:
          TTL + 0.5 s, TTL 3 s) and from that to the last (target: 100 ms);
          per phase: operations, failures (target 0: every object the workers use lives on
          nodes 0-2) and the get's p50/p99 (target: p99 within 2x of steady);
  homes   homes moved by a join N = 3 -> 4 over 1 M random ids (numpy: the daemons'
          rendezvous hash), against 1.1/(N+1);
  keys    etcd keys under the cluster's prefix for N nodes (target <= 2N + 2) and etcd
          writes over 5 idle seconds (target 0: only lease keep-alives, which write nothing).
  adopt   the same 4 nodes again, each with a burst buffer and a backing store in one shared
          directory (named in the cluster file), under a fresh prefix: node 3 puts
          --adopt-objects objects of --adopt-size bytes with durability "backing" and is killed
          with SIGKILL; from the view without it to every object read back whole through node
          1 (target: 10 s), and what the adopter's log says it took.
"""

import argparse
import base64
import datetime
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

import shoal
from shoal.testing import shoal_command

WORKERS = 16
TTL_MS = 3000  # the default: etcd's shortest lease is 1.5 x its election timeout
PREFIX = "/shoal/bench"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def stamp(line: str) -> float:
    """The wall-clock time a daemon's log line starts with (RFC 3339, UTC)."""
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on loopback, data in `directory`, stopped by `stop()`."""

    def __init__(self, directory: Path) -> None:
        self.client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client}"
        self.process = subprocess.Popen(
            ["etcd", "--name", "e0", "--data-dir", str(directory / "etcd"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"e0=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=open(directory / "etcd.log", "w"),
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.range(PREFIX)
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("etcd did not start (see etcd.log)")

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())

    def range(self, key: str, prefix: bool = False) -> dict:
        body = {"key": base64.b64encode(key.encode()).decode()}
        if prefix:
            end = key[:-1] + chr(ord(key[-1]) + 1)
            body["range_end"] = base64.b64encode(end.encode()).decode()
        return self._post("/v3/kv/range", body)

    def value(self, key: str) -> str:
        kvs = self.range(key).get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else ""

    def keys(self, prefix: str) -> list[str]:
        kvs = self.range(prefix, prefix=True).get("kvs", [])
        return [base64.b64decode(kv["key"]).decode() for kv in kvs]

    def revision(self) -> int:
        return int(self.range(PREFIX)["header"]["revision"])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def only_nodes(text: str, keep: set[int]) -> str:
    """The cluster file `text` with only the `[[node]]` tables (and their sub-tables) of `keep`."""
    head, *tables = text.split("\n[[node]]")
    kept = [t for t in tables if int(re.search(r"^id = (\d+)$", t, re.M).group(1)) in keep]
    return head + "".join("\n[[node]]" + t for t in kept)


class Node:
    """`shoal serve --cluster FILE --node N` as a process of its own, its log in a file."""

    def __init__(
        self, directory: Path, node: int, membership: str | None, file: str = "cluster.toml"
    ) -> None:
        self.node = node
        self.log_path = directory / f"serve-{node}-{time.monotonic_ns()}.log"
        self.socket = str(directory / f"n{node}.sock")
        args = ["serve", "--cluster", str(directory / file), "--node", str(node), "--no-prefault"]
        if membership:
            args += ["--membership", membership]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"),
            env=dict(os.environ, NO_COLOR="1", SHOAL_LOG="info"),
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                shoal.Client(self.socket).close()
                return
            except Exception:
                if self.process.poll() is not None:
                    raise SystemExit(f"node {node} stopped at start:\n{self.log()}") from None
                time.sleep(0.05)
        raise SystemExit(f"node {node} did not serve:\n{self.log()}")

    def log(self) -> str:
        return ANSI.sub("", self.log_path.read_text(errors="replace"))

    def times(self, message: str, view: str) -> list[float]:
        """Wall-clock times of the log lines saying `message` with view `view`."""
        return [stamp(line) for line in self.log().splitlines() if message in line and f"view={view}" in line]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)


def worker(sockets: list[str], seed: int, stop, results: "multiprocessing.Queue") -> None:
    """Put through one node, get through another, check, delete; until `stop` is set."""
    import random

    rng = random.Random(seed)
    clients = [shoal.Client(s) for s in sockets]
    done: list[tuple[float, float]] = []  # (time, get seconds)
    failures: list[tuple[float, str]] = []
    payload = bytes(rng.getrandbits(8) for _ in range(1000))
    while not stop.is_set():
        a, b = rng.sample(range(len(clients)), 2)
        try:
            oid = clients[a].put(payload)
            started = time.perf_counter()
            got = clients[b].get(oid, timeout_ms=5000)
            took = time.perf_counter() - started
            if bytes(memoryview(got)) != payload:
                failures.append((time.time(), f"{oid}: other bytes"))
            del got
            clients[a].delete(oid)
            done.append((time.time(), took))
        except Exception as err:  # every failure is counted and reported, by kind
            failures.append((time.time(), f"{type(err).__name__}: {err}"[:200]))
    results.put((done, failures))


class Load:
    """WORKERS processes running `worker` against nodes 0-2 until `finish()`."""

    def __init__(self, sockets: list[str]) -> None:
        self.results: multiprocessing.Queue = multiprocessing.Queue()
        self.stop = multiprocessing.Event()
        self.processes = [
            multiprocessing.Process(target=worker, args=(sockets, i, self.stop, self.results))
            for i in range(WORKERS)
        ]
        for p in self.processes:
            p.start()

    def finish(self) -> tuple[list[tuple[float, float]], list[tuple[float, str]]]:
        self.stop.set()
        done, failures = [], []
        for _ in self.processes:
            d, f = self.results.get(timeout=600)
            done += d
            failures += f
        for p in self.processes:
            p.join()
        return done, failures


def phase_row(name: str, start: float, end: float, done, failures, steady_p99: float | None) -> str:
    gets = np.array([took for t, took in done if start <= t < end])
    failed = [why for t, why in failures if start <= t < end]
    if len(gets) == 0:
        return f"| {name} | 0 | {len(failed)} | | | |"
    p50, p99 = np.percentile(gets, 50) * 1e6, np.percentile(gets, 99) * 1e6
    ratio = f"{p99 / steady_p99:.2f}x" if steady_p99 else "1.00x"
    kinds = sorted({why.split(":")[0] for why in failed})
    return (
        f"| {name} | {len(gets)} | {len(failed)}{' (' + ', '.join(kinds) + ')' if kinds else ''} "
        f"| {p50:.0f} | {p99:.0f} | {ratio} |"
    )


def homes_moved(count: int) -> float:
    """Share of `count` random ids whose home changes when node 3 joins nodes 0-2."""
    mask = np.uint64(0xFFFFFFFFFFFFFFFF)

    def mix(z):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & mask

    raw = np.frombuffer(os.urandom(count * 24), dtype="<u8").reshape(count, 3).copy()
    raw[:, 2] &= np.uint64(0xFFFFFFFF)  # a 20-byte id: the last word holds 4 bytes
    h = np.full(count, 0x9E3779B97F4A7C15, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for word in range(3):
            h = mix(h ^ raw[:, word])
        spread = [np.uint64((n * 0xD6E8FEB86659FD93) & 0xFFFFFFFFFFFFFFFF) for n in range(4)]
        weights = np.stack([mix(h ^ node) for node in spread])
    three = np.argmax(weights[:3], axis=0)  # ties need a 64-bit collision
    four = np.argmax(weights, axis=0)
    return float(np.mean(three != four))


def adoption(
    directory: Path, etcd: Etcd, text: str, nodes: dict[int, "Node"], count: int, size: int
) -> list[str]:
    """The adopt phase (see the module's doc); its report lines. `text` is the cluster file
    without membership; `nodes` holds the nodes it starts (stopped by the caller)."""
    prefix = PREFIX + "-adopt"
    shared = directory / "shared"
    tiered = text.replace("[cluster]\n", f"[cluster]\nmembership_ttl_ms = {TTL_MS}\n", 1)
    for i in range(4):  # each [[node]] table gets its tiers, after its id line
        tiered = tiered.replace(
            f"\nid = {i}\n",
            f'\nid = {i}\nburst = "{directory / f"burst-{i}"}"\nbacking = "{shared / str(i)}"\n',
            1,
        )
    (directory / "cluster.toml").write_text(tiered)
    membership = f"etcd://127.0.0.1:{etcd.client}{prefix}"
    for i in range(4):
        nodes[i] = Node(directory, i, membership)
    client3, client1 = shoal.Client(str(directory / "n3.sock")), shoal.Client(str(directory / "n1.sock"))
    payloads = [os.urandom(size) for _ in range(64)]
    ids = [shoal.ObjectID.from_random() for _ in range(count)]
    started = time.monotonic()
    batch = 500
    for first in range(0, count, batch):
        chunk = ids[first : first + batch]
        client3.put_batch(
            chunk, [payloads[(first + k) % len(payloads)] for k in range(len(chunk))], durability="backing"
        )
    put_took = time.monotonic() - started
    client3.close()
    killed = time.time()
    nodes[3].process.kill()
    nodes.pop(3).process.wait()
    view = "epoch=5 members=0,1,2"
    while time.time() < killed + 3 * TTL_MS / 1000 and etcd.value(f"{prefix}/view") != view:
        time.sleep(0.02)
    removed_at = min(
        (t for n in nodes.values() for t in n.times("adopted the cluster's view", view)), default=None
    )
    want = {oid: payloads[k % len(payloads)] for k, oid in enumerate(ids)}
    missing = list(ids)
    deadline = time.time() + 60
    while missing and time.time() < deadline:
        got = client1.get(missing, timeout_ms=0)
        missing = [oid for oid, value in zip(missing, got, strict=True) if value is None]
        if missing:
            time.sleep(0.02)
    readable_at = time.time()
    whole = sum(1 for oid, value in zip(ids, client1.get(ids, timeout_ms=0), strict=True)
                if value is not None and bytes(value) == want[oid])  # fmt: skip
    client1.close()
    adopter_lines = [
        (n.node, stamp(line))
        for n in nodes.values()
        for line in n.log().splitlines()
        if "adopted the backing store of a node removed" in line
    ]
    adopted_at = min((t for _, t in adopter_lines), default=None)

    def since(t: float | None) -> str:
        return f"{(t - removed_at) * 1e3:.0f} ms" if t and removed_at else "not seen"

    detected = f"{(removed_at - killed) * 1e3:.0f} ms" if removed_at else "not seen"
    adopter = adopter_lines[0][0] if adopter_lines else "?"
    return [
        f"Adoption: node 3 put {count} objects of {size} B with durability backing "
        f"({count * size / put_took / 2**20:.0f} MiB/s, {put_took:.1f} s) into its backing store "
        "in a directory all nodes share, and was killed with SIGKILL.",
        "",
        "| adoption | measured | target |",
        "|---|---|---|",
        f"| kill -9 → view without it | {detected} | ≤ TTL + 500 = {TTL_MS + 500} ms |",
        f"| view → adopter (node {adopter}) opened and recovered the store | {since(adopted_at)} | |",
        f"| view → all {count} objects readable through node 1 | {since(readable_at)} | ≤ 10 s |",
        f"| objects read back whole | {whole} of {count} | all |",
    ]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--phase", type=float, default=4.0, help="seconds per phase")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--adopt-objects", type=int, default=10_000, help="objects node 3 leaves behind")
    parser.add_argument("--adopt-size", type=int, default=4096, help="bytes per such object")
    args = parser.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    if shutil.which("etcd") is None:
        raise SystemExit("etcd is not on PATH: scripts/setup-test-tools.sh installs Debian's etcd-server")
    if "etcd" not in shoal.features():
        raise SystemExit("this build of shoal has no `etcd` feature: SHOAL_FEATURES=full ./scripts/setup.sh")
    directory = Path(tempfile.mkdtemp(prefix="shoal-membership-"))
    etcd = Etcd(directory)
    nodes: dict[int, Node] = {}
    try:
        up = shoal_command("cluster", "up", "--nodes", "4", "--dir", str(directory), "--capacity", "256MiB",
                           "--no-tiers", "--no-metrics", "--name", f"mb{os.getpid()}")  # fmt: skip
        assert up.returncode == 0, up.stderr
        # `cluster down` removes the file and the node keys it names: kept aside.
        kept = {
            p: p.read_bytes() for p in directory.iterdir() if p.is_file() and p.suffix in (".toml", ".key")
        }
        down = shoal_command("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        for path, data in kept.items():
            path.write_bytes(data)
            path.chmod(0o600)
        text = (directory / "cluster.toml").read_text()
        membership = f"etcd://127.0.0.1:{etcd.client}{PREFIX}"
        (directory / "cluster.toml").write_text(
            text.replace("[cluster]\n", f"[cluster]\nmembership_ttl_ms = {TTL_MS}\n", 1)
        )
        # With a membership each host's file may list only its own nodes: nodes 0-2 run
        # without node 3 in their file, node 3 with only itself in its own.
        full = (directory / "cluster.toml").read_text()
        (directory / "members.toml").write_text(only_nodes(full, {0, 1, 2}))
        (directory / "newcomer.toml").write_text(only_nodes(full, {3}))
        sockets = [str(directory / f"n{i}.sock") for i in range(3)]
        lines = [
            f"# Membership on etcd ({datetime.date.today()})",
            "",
            f"`python bench/membership.py --phase {args.phase}`: one etcd, nodes 0-2 (+ node 3 joining "
            f"and leaving; with etcd, absent from their file) as `shoal serve` processes, "
            f"{WORKERS} worker processes putting through one node, "
            f"getting through another and deleting 1 kB objects; TTL {TTL_MS} ms, no grace. "
            f"{os.cpu_count()} cores. Get latency in µs.",
            "",
            "| phase | gets | failures | p50 | p99 | p99 / steady |",
            "|---|---|---|---|---|---|",
        ]

        # The static file: the same three nodes, no membership.
        for i in range(3):
            nodes[i] = Node(directory, i, None)
        load = Load(sockets)
        start = time.time()
        time.sleep(args.phase)
        done, failures = load.finish()
        static_p99 = np.percentile([t for _, t in done], 99) * 1e6 if done else None
        lines.append(phase_row("static file, steady", start, time.time() + 1, done, failures, None))
        for i in range(3):
            nodes.pop(i).stop()

        # With membership.
        for i in range(3):
            nodes[i] = Node(directory, i, membership, "members.toml")
        assert etcd.value(f"{PREFIX}/view") == "epoch=3 members=0,1,2", etcd.value(f"{PREFIX}/view")
        marks: dict[str, float] = {}
        load = Load(sockets)
        marks["steady"] = time.time()
        time.sleep(args.phase)
        marks["join"] = time.time()
        nodes[3] = Node(directory, 3, membership, "newcomer.toml")
        time.sleep(args.phase)
        marks["leave"] = time.time()
        nodes.pop(3).stop()
        time.sleep(args.phase)
        marks["rejoin"] = time.time()
        nodes[3] = Node(directory, 3, membership, "newcomer.toml")
        time.sleep(args.phase)
        marks["kill"] = time.time()
        killed = time.time()
        nodes[3].process.kill()
        while (
            time.time() < killed + 3 * TTL_MS / 1000
            and etcd.value(f"{PREFIX}/view") != "epoch=7 members=0,1,2"
        ):
            time.sleep(0.02)
        nodes.pop(3).process.wait()
        time.sleep(args.phase / 2)
        done, failures = load.finish()
        marks["end"] = time.time()

        steady_gets = [t for at, t in done if marks["steady"] <= at < marks["join"]]
        steady_p99 = np.percentile(steady_gets, 99) * 1e6 if steady_gets else None
        names = ["steady", "join", "leave", "rejoin", "kill"]
        for name, next_name in zip(names, names[1:] + ["end"]):
            row_text = phase_row(f"etcd, {name}", marks[name], marks[next_name], done, failures, steady_p99)
            lines.append(row_text)
        lines.append("")
        if static_p99 and steady_p99:
            lines.append(f"Steady get p99 with membership / static file: {steady_p99 / static_p99:.2f}x.")
        failed = [why for _, why in failures]
        if failed:
            lines.append(f"First failure: `{failed[0]}`")
        lines.append("")

        # View changes, from the nodes' logs (one host, one clock).
        survivors = [nodes[i] for i in range(3)]

        def adopted_by_all(view: str) -> float | None:
            times = [min(n.times("adopted the cluster's view", view), default=None) for n in survivors]
            return None if None in times else max(times)

        def row(what: str, seconds: float | None, target: str) -> str:
            measured = "not seen" if seconds is None else f"{seconds * 1e3:.1f} ms"
            return f"| {what} | {measured} | {target} |"

        def first_of(message: str, view: str) -> float | None:
            times = [
                stamp(line)
                for path in directory.glob("serve-*.log")
                for line in ANSI.sub("", path.read_text(errors="replace")).splitlines()
                if message in line and f"view={view}" in line
            ]
            return min(times, default=None)

        def between(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        lines += ["| view change | measured | target |", "|---|---|---|"]
        for what, view in [
            ("join (proposed → every node adopted)", "epoch=4 members=0,1,2,3"),
            ("clean leave (proposed → every node adopted)", "epoch=5 members=0,1,2"),
            ("join again (proposed → every node adopted)", "epoch=6 members=0,1,2,3"),
        ]:
            lines.append(
                row(what, between(first_of("proposed the view", view), adopted_by_all(view)), "≤ 100 ms")
            )
        removed = "epoch=7 members=0,1,2"
        detected = between(killed, first_of("adopted the cluster's view", removed))
        target = f"≤ TTL + 500 = {TTL_MS + 500} ms"
        lines.append(row("kill -9 detected (kill → first node adopts the view without it)", detected, target))
        spread = between(first_of("adopted the cluster's view", removed), adopted_by_all(removed))
        lines.append(row("kill -9: first → last node adopting it", spread, "≤ 100 ms"))
        moved = homes_moved(1_000_000)
        lines.append(f"| homes moved by a join, 3 → 4 nodes, 1 M ids | {moved:.4f} | ≤ 1.1/4 = 0.2750 |")
        keys = etcd.keys(PREFIX + "/")
        revision = etcd.revision()
        time.sleep(5)
        writes = etcd.revision() - revision
        lines.append(f"| etcd keys, 3 members | {len(keys)} | ≤ 2·3 + 2 = 8 |")
        lines.append(f"| etcd writes in 5 idle seconds | {writes} | 0 |")
        for node in nodes.values():
            node.stop()
        nodes.clear()
        lines += ["", *adoption(directory, etcd, text, nodes, args.adopt_objects, args.adopt_size)]
        report = "\n".join(lines) + "\n"
        print(report)
        if args.out:
            args.out.write_text(report)
    finally:
        for node in nodes.values():
            node.stop(signal.SIGKILL)
        # A daemon killed leaves its region behind (`cluster down` would remove it, but
        # these nodes were started from the kept file).
        cluster_file = directory / "cluster.toml"
        if cluster_file.exists():
            for line in cluster_file.read_text().splitlines():
                if line.startswith("region = "):
                    Path(line.split('"')[1]).unlink(missing_ok=True)
        etcd.stop()
        if os.environ.get("KEEP"):
            print(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
