"""Network-mode pull: shoal beside Ray and the machine's limits, in one run.

    python bench/network.py --out bench/results/network.md

Starts an emulated 2-node shoal cluster with `--modes mapped,network`: node 1
is network-only, so a get of its objects from node 0 pulls a copy over node
1's bulk data channel (docs/cluster.md, "Network mode"). This process is the
writer, a client of node 1; a reader process (this file with `--reader`) is
a client of node 0 and times each first get, the pull. Beside it, in the
same rounds:
  tcp    a raw loopback pair doing what an ideal puller would: an owner
         process (`--owner`) sends a range with os.sendfile from a /dev/shm
         file, this process receives it with recv_into (MSG_WAITALL) into a
         preallocated shared mapping; 1 and 4 parallel streams, default and
         bulk.rs's receive buffer;
  ray    Ray's object store: a 2-node `ray.cluster_utils.Cluster` in
         bench/.venv-ray (a driver process, `--ray-driver`); an actor pinned
         to node B makes the object, the driver on node A times `ray.get`,
         which moves it from B's object store into A's;
and memcpy of 100 MB (numpy) before and after. The cluster, the Ray nodes and
the owner are stopped however the run ends. See bench/README.md, "Network
benchmark".
"""

import argparse
import concurrent.futures
import datetime
import gc
import json
import mmap
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from adapters import payload
from cluster import (
    cell,
    checkout,
    cluster_up,
    daemons_cpu,
    machine_busy,
    own_cpu,
    pair,
    process_cpu,
    ratio,
    save_run,
    shoal_env,
)
from table1 import GiB, best_bandwidth, fmt, log, machine, shared_pages, table

MiB = 2**20
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SIZES = [1_000_000, 10_000_000, 100_000_000]  # 1 MB, 10 MB, 100 MB
SAMPLE_FACTOR = {1_000_000: 4, 10_000_000: 2, 100_000_000: 1}  # samples per size: factor × --reps
TARGET_SIZE, TARGET_GIBS = 100_000_000, 4.0  # the issue: pull ≥ 4 GiB/s for 100 MB objects
PARALLEL_PULL = 8 * MiB  # shoal pulls objects this large in 4 ranges (connection.rs)
PULL_PARTS = 4
RECEIVE_BUFFER = 8 * MiB  # SO_RCVBUF bulk.rs asks for on the puller's side
CAPACITY = 512 * MiB  # per shoal node; one object of each kind is alive at a time
RAY_STORE = 768 * MiB  # object store per Ray node
TIMEOUT_MS = 30_000  # shoal gets and creates
CALL_TIMEOUT = 120  # seconds for one request to a worker process
RAY_START_TIMEOUT = 180
RAY_IDLE_S = 3  # Ray's own CPU use while idle is measured over this long after its start
SAMPLE_STEP = MiB  # the touch: one byte every MiB, plus both 8-byte stamps
LOADED = 1.0  # load average (1 min) before the run above which the report calls the machine loaded
BUSY = 0.1  # or: the share of the machine's CPU time other processes used during the run
# (streams, SO_RCVBUF as bulk.rs); 2 and 8 streams show whether shoal's 4 ranges suit the machine
TCP = [(1, False), (4, False), (1, True), (2, True), (4, True), (8, True)]


def self_cpu():
    """CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def group_cpu(pgid, exclude=None):
    """CPU seconds (user + system) of the live processes of a process group,
    but for the process `exclude`."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and int(entry) != exclude:
                total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def shoal_parts(size):
    return PULL_PARTS if size >= PARALLEL_PULL else 1


def ranges(size, parts):
    """The byte ranges of a pull in `parts` connections, split as shoal splits
    them (cluster/bulk.rs `fetch`)."""
    step = -(-size // parts)
    return [(p * step, min(size, (p + 1) * step)) for p in range(parts) if p * step < size]


def sample_index(size):
    """Where the reader touches an object: both stamps and one byte a MiB."""
    idx = np.concatenate([np.arange(8), np.arange(8, size - 8, SAMPLE_STEP), np.arange(size - 8, size)])
    return np.unique(idx)


def stamped(size, stamp):
    """The payload of `size` bytes with `stamp` (uint64) in its first and last
    8 bytes, so every object of a size differs from the one before."""
    obj = payload(size).copy()
    word = np.array([stamp], np.uint64).view(np.uint8)
    obj[:8], obj[-8:] = word, word
    return obj


def check_object(arr, size, stamp):
    """Untimed full verification of a pulled object against its source."""
    word = np.array([stamp], np.uint64).view(np.uint8)
    src = payload(size)
    assert arr.size == size, f"{arr.size} bytes, expected {size}"
    assert np.array_equal(arr[:8], word) and np.array_equal(arr[-8:], word), "wrong stamp"
    assert np.array_equal(arr[8:-8], src[8:-8]), "the object's bytes differ from the source"


STOPPING = []  # set when a signal or the deadline stops the run: workers get little time to quit


class JsonWorker:
    """A child process answering JSON lines on stdin/stdout; `group` puts it
    in a session of its own, so that it and everything it starts can be
    killed by its process-group id."""

    def __init__(self, cmd, errlog, env=None, group=False):
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            text=True,
            env=env,
            start_new_session=group,
        )
        self.group = group

    def read(self, timeout=CALL_TIMEOUT):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"{self.proc.args[2:4]} died or timed out (see raw-network.log)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def call(self, timeout=CALL_TIMEOUT, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def close(self, timeout=60):
        """Asks it to quit (end of stdin), waits, then kills it (and its group)."""
        if STOPPING:
            timeout = min(timeout, 5)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.proc.args[2:4]} did not quit in {timeout} s: killing it")
            self.proc.kill()
            self.proc.wait()
        if self.group:  # whatever it started and left behind (its group id is its pid)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def json_out():
    """The worker's reply channel: the original stdout. Anything else the
    process (or a library) prints goes to stderr from here on."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def serve_json(out, handler):
    """Worker loop: one JSON request per stdin line, one reply per line of
    `out`; ends at the end of stdin."""
    gc.disable()  # no collector pauses inside timed sections
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = handler(req)
        except Exception:  # noqa: BLE001 - any failure goes back to the orchestrator
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")


# ---------------------------------------------------------------- shoal reader


def reader_main(sock):
    """`--reader SOCKET`: a client of node 0 that pulls node 1's objects."""
    out = json_out()
    import shoal

    client = shoal.Client(sock)
    lo, hi = client.region_address, client.region_address + client.region_size

    def pull(req):
        oid, size = shoal.ObjectID.from_hex(req["id"]), req["size"]
        idx = sample_index(size)
        c0 = self_cpu()
        t0 = time.perf_counter()
        buf = client.get_buffer(oid, TIMEOUT_MS)  # the first get: the pull
        arr = np.frombuffer(buf, np.uint8)
        touched = int(arr[idx].sum(dtype=np.uint64))
        t1 = time.perf_counter()
        c1 = self_cpu()
        t2 = time.perf_counter()
        again = client.get_buffer(oid, TIMEOUT_MS)  # a later get: the local copy
        t3 = time.perf_counter()
        assert touched == req["expect"], "the touched sample differs from the source"
        local = lo <= arr.ctypes.data and arr.ctypes.data + size <= hi
        assert local, "the object is not a copy in node 0's region"
        check_object(arr, size, req["stamp"])
        del arr, buf, again
        return {"pull_s": t1 - t0, "later_get_s": t3 - t2, "reader_cpu_s": c1 - c0}

    def delete(req):
        """Through the copy holder: the copy and the primary go."""
        client.delete([shoal.ObjectID.from_hex(req["id"])])
        return {}

    def probe(req):
        """Timed gets (timeout 0) of absent ids, one at a time: each asks the id's home,
        a peer RPC when that is the other node."""
        times = []
        for hexid in req["ids"]:
            oid = shoal.ObjectID.from_hex(hexid)
            t0 = time.perf_counter()
            got = client.get([oid], timeout_ms=0)
            times.append(time.perf_counter() - t0)
            assert got == [None], "an absent id was found"
        return {"times": times}

    ops = {"pull": pull, "delete": delete, "probe": probe}

    out.write(json.dumps({"ready": True}) + "\n")
    serve_json(out, lambda req: ops[req["op"]](req))


class Shoal:
    """The 2-node cluster, this process's writer (a client of node 1) and the
    reader process (a client of node 0)."""

    def __init__(self, directory, errlog, tls=False, capacity=CAPACITY, tiers=True):
        self.directory, self.errlog = directory, errlog
        self.tls, self.capacity, self.tiers = tls, capacity, tiers
        self.reader, self.writer, self.cluster = None, None, None

    def start(self):
        import shoal

        self.shoal = shoal
        self.cluster = cluster_up(
            self.directory,
            self.errlog,
            nodes=2,
            modes="mapped,network",
            capacity=f"{self.capacity // MiB}MiB",
            tls=self.tls,
            tiers=self.tiers,
        )
        with open(os.path.join(self.directory, "cluster.toml")) as f:
            modes = [line.split("=")[1].strip().strip('"') for line in f if line.startswith("access")]
        assert modes == ["mapped", "network"], f"node access modes {modes}"
        self.writer = self.cluster.client(1)
        cmd = [sys.executable, os.path.abspath(__file__), "--reader", self.socket(0)]
        self.reader = JsonWorker(cmd, self.errlog, env=shoal_env())
        self.reader.read()
        self.version = shoal.__version__

    def socket(self, node):
        return self.cluster.socket(node)

    def pull(self, size, stamp):
        """Puts one object on node 1 (untimed), then the reader pulls it."""
        obj = stamped(size, stamp)
        oid = self.shoal.ObjectID.from_random()
        self.writer.put_batch([oid], [obj], timeout_ms=TIMEOUT_MS)
        expect = int(obj[sample_index(size)].sum(dtype=np.uint64))
        before = self.daemon_cpu()
        got = self.reader.call(op="pull", id=oid.hex(), size=size, stamp=stamp, expect=expect)
        got["cpu_s"] = self.daemon_cpu() - before + got.pop("reader_cpu_s")
        self.reader.call(op="delete", id=oid.hex())
        return got

    def daemon_cpu(self):
        return daemons_cpu(self.directory, 2)

    def stop(self):
        """Reader, writer, cluster; returns the daemons' CPU seconds."""
        if self.reader is not None:
            self.reader.close()
        used = self.daemon_cpu()
        if self.cluster is not None:
            self.cluster.down(check=False)
        return used


# ---------------------------------------------------------------- raw TCP pair


def recv_exact(conn, n):
    """`n` bytes from a socket, plain or TLS (an SSL socket takes no MSG_WAITALL)."""
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += got
    return data


def tls_context(tls_dir, server):
    """An OpenSSL context (Python's ssl) for the raw TLS pair: TLS 1.3, the certificate
    `shoal cluster ca` made in `tls_dir` (self-signed: it is the server's and the trust)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if server:
        ctx.load_cert_chain(os.path.join(tls_dir, "ca.crt"), os.path.join(tls_dir, "ca.key"))
    else:
        ctx.load_verify_locations(os.path.join(tls_dir, "ca.crt"))
        ctx.check_hostname = False  # its name is the CA's, not 127.0.0.1; the chain is checked
    return ctx


def owner_main(path, tls_dir=None):
    """`--owner PATH`: serves ranges of the file with sendfile. One connection
    per range: request (offset u64, len u64), reply 0u8 + the bytes, then the
    puller's 1-byte ack; as bulk.rs does, without token or id. `--owner-tls DIR`:
    over TLS 1.3 (OpenSSL encrypts from a mapping of the file)."""
    fd = os.open(path, os.O_RDONLY)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    ctx = tls_context(tls_dir, server=True) if tls_dir else None
    source = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if tls_dir else None

    def send(conn):
        with conn:
            try:
                stream = ctx.wrap_socket(conn, server_side=True) if ctx else conn
                head = recv_exact(stream, 16)
                at, n = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
                stream.sendall(b"\0")
                end = at + n
                if source is not None:
                    stream.sendall(memoryview(source)[at:end])
                else:
                    while at < end:
                        at += os.sendfile(conn.fileno(), fd, at, end - at)
                stream.recv(1)
            except OSError:
                traceback.print_exc()  # the puller fails on its side and tells

    pool = concurrent.futures.ThreadPoolExecutor(max(streams for streams, _ in TCP))

    def accept():
        while True:
            conn, _ = listener.accept()
            pool.submit(send, conn)

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    sys.stdin.read()  # until the orchestrator closes stdin (or dies)
    os._exit(0)  # without waiting for the pool's threads


class RawPair:
    """The owner process and this process's puller: a preallocated, populated
    shared mapping of a /dev/shm file, like a node's region."""

    def __init__(self, tmpname, errlog, size=None, tls_dir=None):
        """`size`: the largest pull (both /dev/shm files are that large; default max(SIZES)).
        `tls_dir`: over TLS 1.3 with AES-128-GCM, shoal's suite (OpenSSL through Python's
        ssl; the certificate of `shoal cluster ca --out tls_dir`)."""
        self.size = size = size or max(SIZES)
        self.tls = tls_context(tls_dir, server=False) if tls_dir else None
        self.cipher = None  # the suite the TLS pair's last connection ran
        self.src_path = f"/dev/shm/{tmpname}-src"
        self.dst_path = f"/dev/shm/{tmpname}-dst"
        self.owner, self.dst = None, None
        self.src = payload(size)  # kept: the checks after each pull read it
        with open(self.src_path, "wb") as f:
            f.write(self.src.data)
        with open(self.dst_path, "wb") as f:
            f.truncate(size)
        with open(self.dst_path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), size)
        self.dst = np.frombuffer(self.map, np.uint8)
        self.dst[:] = 0  # populated, as a region is
        self.pool = concurrent.futures.ThreadPoolExecutor(max(streams for streams, _ in TCP))
        cmd = [sys.executable, os.path.abspath(__file__), "--owner", self.src_path]
        env = None
        if tls_dir:
            # Python's ssl cannot choose TLS 1.3 suites; OpenSSL's configuration can. The
            # server offering AES-128-GCM alone decides it.
            conf = os.path.join(tls_dir, "openssl.cnf")
            with open(conf, "w") as f:
                f.write("openssl_conf = conf\n[conf]\nssl_conf = ssl\n[ssl]\nsystem_default = tls\n"
                        "[tls]\nCiphersuites = TLS_AES_128_GCM_SHA256\n")  # fmt: skip
            cmd += ["--owner-tls", tls_dir]
            env = {**os.environ, "OPENSSL_CONF": conf}
        self.owner = JsonWorker(cmd, errlog, env=env)
        self.port = self.owner.read()["port"]
        self.effective_rcvbuf = None

    def fetch(self, start, end, rcvbuf):
        with socket.create_connection(("127.0.0.1", self.port), timeout=CALL_TIMEOUT) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
                self.effective_rcvbuf = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            if self.tls is not None:
                s = self.tls.wrap_socket(s)
                self.cipher = s.cipher()[0]
            s.sendall(start.to_bytes(8, "little") + (end - start).to_bytes(8, "little"))
            assert recv_exact(s, 1) == b"\0"
            view = memoryview(self.map)[start:end]
            flags = socket.MSG_WAITALL if self.tls is None else 0  # TLS: a record per call
            got = 0
            while got < len(view):
                n = s.recv_into(view[got:], 0, flags)
                if n == 0:
                    raise EOFError(f"owner closed after {got} of {len(view)} bytes")
                got += n
            view.release()
            s.sendall(b"\xa5")
            s.close()  # the TLS socket (`with` closes the one it wrapped)

    def pull(self, size, streams, rcvbuf):
        """One timed pull of the first `size` bytes in `streams` connections."""
        self.dst[:8] = self.dst[size - 8 : size] = 0
        c0 = self_cpu() + process_cpu(self.owner.proc.pid)
        t0 = time.perf_counter()
        if streams == 1:  # in this thread: no hand-off to a pool thread
            self.fetch(0, size, rcvbuf)
        else:
            jobs = [self.pool.submit(self.fetch, a, b, rcvbuf) for a, b in ranges(size, streams)]
            for job in jobs:
                job.result()
        elapsed = time.perf_counter() - t0
        cpu = self_cpu() + process_cpu(self.owner.proc.pid) - c0
        ends = np.r_[0:8, size - 8 : size]
        assert np.array_equal(self.dst[ends], self.src[ends]), "raw pull: wrong bytes"
        return elapsed, cpu

    def verify(self, size):
        assert np.array_equal(self.dst[:size], self.src[:size]), "raw pull bytes differ"

    def stop(self):
        self.pool.shutdown()
        if self.owner is not None:
            self.owner.close(timeout=10)
        self.dst = self.src = None
        for path in (self.src_path, self.dst_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------- Ray


def ray_environment(tmp):
    """Before `import ray` in a driver: no usage report, Ray's session files under `tmp`
    (in `tmp`/ray), loopback only."""
    os.environ.update(
        RAY_USAGE_STATS_ENABLED="0",  # no usage report leaves the machine
        RAY_TMPDIR=tmp,  # Ray's session files in our own directory
        # Loopback only: without this Ray resolves 127.0.0.1 to the host's
        # outward address (found by routing towards a public one).
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)


def ray_driver_main(tmp):
    """`--ray-driver` (run by bench/.venv-ray's python): starts a 2-node Ray
    cluster on loopback, then pulls objects made on node B from node A."""
    out = json_out()
    ray_environment(tmp)
    import ray
    from ray.cluster_utils import Cluster
    from ray.experimental import get_object_locations

    t0 = time.perf_counter()
    common = {
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "num_cpus": 1,
        "object_store_memory": RAY_STORE,
    }
    head = dict(common, resources={"A": 1}, temp_dir=os.path.join(tmp, "ray"))
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        node_b = cluster.add_node(**common, resources={"B": 1}).node_id
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        node_a = ray.get_runtime_context().get_node_id()
        assert node_a != node_b, "the driver is not on node A"

        @ray.remote(resources={"B": 1}, num_cpus=0)
        class Maker:
            """On node B: returns stamped payloads (into B's object store)."""

            def __init__(self):
                self.cache = {}

            def make(self, size, stamp):
                if size not in self.cache:  # adapters.payload, inlined (this runs in a Ray worker)
                    self.cache = {size: np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)}
                obj = self.cache[size].copy()
                word = np.array([stamp], np.uint64).view(np.uint8)
                obj[:8], obj[-8:] = word, word
                return obj

            def node(self):
                return ray.get_runtime_context().get_node_id()

        maker = Maker.remote()
        assert ray.get(maker.node.remote(), timeout=RAY_START_TIMEOUT) == node_b, "the maker is not on B"
        hello = {"ready": True, "version": ray.__version__, "start_s": time.perf_counter() - t0}
        out.write(json.dumps(hello) + "\n")

        def pull(req):
            size, stamp = req["size"], req["stamp"]
            ref = maker.make.remote(size, stamp)
            ready, _ = ray.wait([ref], timeout=CALL_TIMEOUT, fetch_local=False)
            assert ready, "the object was not made in time"
            holders = []
            for _ in range(500):  # the location reaches the owner (the driver) asynchronously
                holders = get_object_locations([ref])[ref]["node_ids"]
                if holders:
                    break
                time.sleep(0.01)
            assert holders == [node_b], f"before the get the object is on {holders}, not on B only"
            idx = sample_index(size)
            g0 = group_cpu(os.getpgid(0), exclude=os.getpid())  # the Ray processes
            c0 = self_cpu()  # and this driver, without the scans of /proc
            t0 = time.perf_counter()
            arr = ray.get(ref, timeout=CALL_TIMEOUT)  # the transfer from B's store into A's
            touched = int(arr[idx].sum(dtype=np.uint64))
            t1 = time.perf_counter()
            c1 = self_cpu()
            g1 = group_cpu(os.getpgid(0), exclude=os.getpid())
            t2 = time.perf_counter()
            again = ray.get(ref)  # a later get: the copy in A's store
            t3 = time.perf_counter()
            assert touched == req["expect"], "the touched sample differs from the source"
            assert not arr.flags.writeable, "ray.get returned a copy, not a view of the object store"
            check_object(arr, size, stamp)
            copied = False
            for _ in range(100):  # the new location is reported asynchronously
                copied = node_a in get_object_locations([ref])[ref]["node_ids"]
                if copied:
                    break
                time.sleep(0.01)
            del arr, again, ref
            return {
                "pull_s": t1 - t0,
                "later_get_s": t3 - t2,
                "cpu_s": g1 - g0 + c1 - c0,
                "copied_to_a": copied,
            }

        serve_json(out, pull)
    finally:
        ray.shutdown()
        cluster.shutdown()


class Ray:
    """The Ray driver process (bench/.venv-ray)."""

    def __init__(self, tmp, errlog):
        self.tmp, self.errlog, self.driver = tmp, errlog, None

    def start(self):
        setup = subprocess.run(
            ["bash", os.path.join(BENCH, "setup_ray.sh")],
            stdout=subprocess.PIPE,
            stderr=self.errlog,
            text=True,
            timeout=600,
        )
        if setup.returncode != 0:
            raise RuntimeError(f"bench/setup_ray.sh failed ({setup.returncode}); see raw-network.log")
        python = setup.stdout.strip().splitlines()[-1]
        cmd = [python, os.path.abspath(__file__), "--ray-driver", self.tmp]
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        self.driver = JsonWorker(cmd, self.errlog, env=env, group=True)
        hello = self.driver.read(RAY_START_TIMEOUT)
        self.version, self.start_s = hello["version"], hello["start_s"]
        before = group_cpu(self.driver.proc.pid)
        time.sleep(RAY_IDLE_S)
        self.idle_share = (group_cpu(self.driver.proc.pid) - before) / RAY_IDLE_S

    def pull(self, size, stamp):
        expect = int(stamped(size, stamp)[sample_index(size)].sum(dtype=np.uint64))
        return self.driver.call(op="pull", size=size, stamp=stamp, expect=expect)

    def stop(self):
        if self.driver is not None:
            self.driver.close()
            self.driver = None


# ---------------------------------------------------------------- measurements


def memcpy_limits(n=10):
    src = payload(TARGET_SIZE)
    dst = np.zeros_like(src)
    shared = shared_pages(TARGET_SIZE)
    shared[:] = src
    return {
        "memcpy_gibs": best_bandwidth(np.copyto, dst, src, n),
        "memcpy_shared_gibs": best_bandwidth(np.copyto, shared, src, n),
    }


def drop_ray(ray, results, error):
    """A Ray pull failed: Ray is stopped and all its samples are left out."""
    why = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    log(f"ray: FAILED during the pulls: {why}")
    results["ray"]["failed"] = f"failed during the pulls: {why}"
    for res in results["sizes"].values():
        res["ray"] = {}
    ray.stop()
    return None


def measure(args, shoal, ray, raw, results):
    """For each size, rounds of: every raw TCP configuration, one shoal pull,
    one Ray pull, in an order that rotates from round to round, so that the
    machine's noise falls on all of them alike. The first --warmup rounds are
    discarded."""
    stamp = 0
    for size in SIZES:
        n = SAMPLE_FACTOR[size] * args.reps
        res = results["sizes"][str(size)] = {"samples": n, "tcp": {}, "tcp_cpu": {}, "shoal": {}, "ray": {}}
        for streams, rcvbuf in TCP:
            res["tcp"][tcp_key(streams, rcvbuf)] = []
            res["tcp_cpu"][tcp_key(streams, rcvbuf)] = []
        steps = [("tcp", cfg) for cfg in TCP] + [("shoal", None)] + ([("ray", None)] if ray else [])
        for rnd in range(args.warmup + n):
            keep = rnd >= args.warmup
            k = rnd % len(steps)
            for kind, cfg in steps[k:] + steps[:k]:
                stamp += 1
                if kind == "tcp":
                    streams, rcvbuf = cfg
                    t, cpu = raw.pull(size, streams, rcvbuf)
                    if keep:
                        res["tcp"][tcp_key(streams, rcvbuf)].append(t)
                        res["tcp_cpu"][tcp_key(streams, rcvbuf)].append(cpu)
                elif kind == "shoal":
                    got = shoal.pull(size, stamp)
                    if keep:
                        for key, value in got.items():
                            res[kind].setdefault(key, []).append(value)
                elif ray is not None:
                    try:
                        got = ray.pull(size, stamp)
                    except Exception as e:  # noqa: BLE001 - without Ray the rest still runs
                        ray = drop_ray(ray, results, e)
                        continue
                    if keep:
                        for key, value in got.items():
                            res[kind].setdefault(key, []).append(value)
        raw.verify(size)
        med = {k: res[k]["pull_s"] for k in ("shoal", "ray") if res[k]}
        med.update({f"tcp {c}": t for c, t in res["tcp"].items()})
        log(
            f"  {size // 1_000_000} MB, median GiB/s: "
            + ", ".join(f"{k} {size / statistics.median(t) / GiB:.2f}" for k, t in med.items())
        )


# ---------------------------------------------------------------- report


def gibs(size):
    return lambda t: size / t / GiB


def tcp_key(streams, rcvbuf):
    return f"{streams}{'b' if rcvbuf else ''}"


def best_tcp(res, size, streams):
    """The better buffer setting (by median) for `streams` connections: the
    ideal puller's limit."""
    options = [pair(res["tcp"][tcp_key(streams, b)], gibs(size)) for b in (False, True)]
    return max(options, key=lambda p: p[1])


def throughput_rows(run):
    rows = []
    for size in SIZES:
        res = run["results"]["sizes"][str(size)]
        parts = shoal_parts(size)
        ray = res["ray"].get("pull_s")
        rows.append(
            [
                f"{size // 1_000_000} MB",
                str(res["samples"]),
                cell(pair(res["shoal"]["pull_s"], gibs(size))),
                cell(pair(ray, gibs(size))) if ray else "not measured",
                cell(pair(res["tcp"][tcp_key(parts, True)], gibs(size))),
                cell(best_tcp(res, size, 1)),
                cell(best_tcp(res, size, 4)),
            ]
        )
    return rows


def ratio_rows(run):
    lim = run["limits"]
    memcpy = (lim["memcpy_gibs"], lim["memcpy_gibs"])
    rows = []
    for size in SIZES:
        res = run["results"]["sizes"][str(size)]
        shoal = pair(res["shoal"]["pull_s"], gibs(size))
        same = pair(res["tcp"][tcp_key(shoal_parts(size), True)], gibs(size))
        ray = res["ray"].get("pull_s")
        rows.append(
            [
                f"{size // 1_000_000} MB",
                cell(ratio(shoal, same)),
                cell(ratio(shoal, best_tcp(res, size, 1))),
                cell(ratio(shoal, best_tcp(res, size, 4))),
                cell(ratio(shoal, memcpy)),
                cell(ratio(shoal, pair(ray, gibs(size)))) if ray else "",
            ]
        )
    return rows


def latency_rows(run):
    rows = []
    ms, us = (lambda t: t * 1e3), (lambda t: t * 1e6)
    for size in SIZES:
        res = run["results"]["sizes"][str(size)]
        same = res["tcp"][tcp_key(shoal_parts(size), True)]
        shoal, ray = res["shoal"], res["ray"]
        extra = statistics.median(shoal["pull_s"]) - statistics.median(same)
        rows.append(
            [
                f"{size // 1_000_000} MB",
                cell(pair(same, ms)),
                cell(pair(shoal["pull_s"], ms)),
                f"{extra * 1e3:+.2f}",
                cell(pair(shoal["later_get_s"], us)),
                cell(pair(ray["pull_s"], ms)) if ray else "not measured",
                cell(pair(ray["later_get_s"], us)) if ray else "",
            ]
        )
    return rows


def ray_copies(run):
    """A line on where Ray's object was after the get, if Ray ran."""
    flags = [f for size in SIZES for f in run["results"]["sizes"][str(size)]["ray"].get("copied_to_a", [])]
    if not flags:
        return []
    return [
        f"Ray: before each get the object was in node B's store only (checked); after it, node A was listed "
        f"among its locations in {sum(flags)} of {len(flags)} gets (checked for up to 1 s, untimed).",
        "",
    ]


def cpu_rows(run):
    """Mean CPU time per pull and GiB moved per CPU-second, from the totals
    over all samples (the kernel counts CPU time in 10 ms ticks)."""
    rows = []
    for size in SIZES:
        res = run["results"]["sizes"][str(size)]
        row = [f"{size // 1_000_000} MB"]
        for samples in (res["tcp_cpu"][tcp_key(shoal_parts(size), True)], res["shoal"]["cpu_s"],
                        res["ray"].get("cpu_s")):  # fmt: skip
            if samples:
                total = sum(samples)
                per_gib = f"{len(samples) * size / total / GiB:.2f}" if total else "–"
                row += [f"{total / len(samples) * 1e3:.1f}", per_gib]
            else:
                row += ["not measured", ""]
        rows.append(row)
    return rows


def tcp_rows(run):
    rows = []
    for streams, rcvbuf in TCP:
        row = [
            f"{streams} stream{'s' if streams > 1 else ''}, " + ("SO_RCVBUF 8 MiB" if rcvbuf else "default")
        ]
        for size in SIZES:
            row.append(
                cell(pair(run["results"]["sizes"][str(size)]["tcp"][tcp_key(streams, rcvbuf)], gibs(size)))
            )
        rows.append(row)
    return rows


def target_lines(run):
    res = run["results"]["sizes"][str(TARGET_SIZE)]
    best, median = pair(res["shoal"]["pull_s"], gibs(TARGET_SIZE))
    limit = best_tcp(res, TARGET_SIZE, 4)
    lines = [
        "| target | best | median | goal | met (median) |",
        "| --- | --- | --- | --- | --- |",
        f"| network-mode pull, 100 MB (GiB/s) | {fmt(best)} | {fmt(median)} | ≥ {TARGET_GIBS:g}"
        f" | {'yes' if median >= TARGET_GIBS else '**no**'} |",
        "",
        f"This run's loopback limit for the same transfer (raw TCP, 4 streams, better buffer setting): "
        f"{fmt(limit[0])} GiB/s best, {fmt(limit[1])} GiB/s median.",
    ]
    if limit[1] < TARGET_GIBS:
        lines[-1] += (
            f" That is below the {TARGET_GIBS:g} GiB/s goal: on this machine, in this state, the raw pair "
            "itself does not reach it, so the goal cannot be judged here; the ratios to the limit can."
        )
    return lines


def machine_line(run):
    mach, load = run["machine"], run["load"]
    share = run["others_cpu_s"] / run["seconds"] / mach["nproc"]
    line = (
        f"Machine: {mach['cpu']}, nproc {mach['nproc']}, {mach['memory_gib']} GiB RAM, {mach['kernel']};"
        f" Python {mach['python']}, numpy {mach['numpy']}. Load average (1 min) {load['start']:.2f} before"
        f" the run and {load['end']:.2f} at its end (which counts the run's own processes); during the"
        f" {run['seconds']:.0f} s run other processes used {run['others_cpu_s']:.1f} CPU-seconds"
        f" ({share:.0%} of the machine)."
    )
    if load["start"] > LOADED or share > BUSY:
        line += (
            " **The machine was loaded during this run** (other builds and tests shared its"
            f" {mach['nproc']} cores): every number moves with that load, and so do the ratios, though less."
        )
    return line


INTRO = (
    "Cells are `best / median` over the samples (after {warmup} discarded warm-up round per size): the "
    "shortest time or highest bandwidth, then the median; ratios are taken from the best and from the "
    "median values. 1 MB = 10^6 B, MiB = 2^20 B, GiB = 2^30 B. Every round of a size runs each raw TCP "
    "configuration, one shoal pull and one Ray pull, in an order that rotates from round to round. "
    'Definitions: bench/README.md, "Network benchmark".'
)


def report(run):
    res, lim = run["results"], run["limits"]
    rcv = res.get("effective_rcvbuf")
    ray = res.get("ray", {})
    ray_note = (
        f"Ray {ray['version']} (bench/.venv-ray), 2 nodes from `ray.cluster_utils.Cluster` on 127.0.0.1, "
        f"{RAY_STORE // MiB} MiB object store each, started in {ray['start_s']:.0f} s; idle, its processes"
        f" used {ray['idle_share']:.0%} of a core, which the other rows of the run pay for too"
        if "failed" not in ray
        else f"Ray{' ' + ray['version'] if 'version' in ray else ''}: not measured ({ray['failed']})"
    )
    lines = [
        "# Network-mode pull: shoal beside Ray and the machine's limits",
        "",
        f"Generated {run['date']} by `{run['command']}`.",
        "",
        machine_line(run),
        "",
        f"shoal {res['shoal_version']} ({run['checkout']}): 2 nodes emulated on this host"
        f" (`python -m shoal cluster up --nodes 2 --modes mapped,network`), {CAPACITY // MiB} MiB each;"
        " node 1 is network-only, so node 0 reads its objects by pulling them over node 1's bulk data"
        f" channel ({PULL_PARTS} parallel ranges for objects ≥ {PARALLEL_PULL // MiB} MiB). {ray_note}.",
        "",
        INTRO.format(warmup=run["warmup"]),
        "",
        "## Pull throughput (GiB/s)",
        "",
        "*shoal pull*: a reader process on node 0 times its first `get_buffer` of an object put on node 1 "
        "(the pull: Acquire at the owner, create, bulk transfer, seal) plus a touch of the object (one byte "
        "a MiB and both stamps). *Ray get*: the driver on node A times `ray.get` of an array an actor made "
        "on node B (moved from B's object store into A's, returned as a zero-copy view) plus the same touch. "
        "*TCP*: the raw pair (owner `sendfile` from /dev/shm, puller `recv_into` a populated shared "
        "mapping, one connection per range) — *as shoal* with the stream count shoal uses for the size and "
        "bulk.rs's receive buffer; *1 stream* and *4 streams* with the better of the two buffer settings "
        "(all configurations in the last table). memcpy of 100 MB, warm numpy arrays: "
        f"{fmt(lim['memcpy_gibs'])} GiB/s"
        f" (into a warm shared mapping: {fmt(lim['memcpy_shared_gibs'])} GiB/s); best of "
        f"{len(res['limit_runs'])} measurements.",
        "",
        *table(
            "size",
            ["samples", "shoal pull", "Ray get", "TCP as shoal", "TCP 1 stream", "TCP 4 streams"],
            throughput_rows(run),
        ),
        "",
        *ray_copies(run),
        "## Ratios (from best / from median)",
        "",
        "shoal's pull bandwidth divided by each: above 1 is faster than the reference.",
        "",
        *table(
            "size",
            [
                "shoal / TCP as shoal",
                "shoal / TCP 1 stream",
                "shoal / TCP 4 streams",
                "shoal / memcpy",
                "shoal / Ray",
            ],
            ratio_rows(run),
        ),  # fmt: skip
        "",
        "## Time per object",
        "",
        "*later get*: a second get of the same object right after the pull (the local copy on node 0, or "
        "the copy in A's store for Ray). *shoal − TCP*: the median pull time minus the median raw TCP "
        "time of the same transfer: what shoal adds (RPCs, create, seal, announce, the reader's request; "
        "negative when that is within the noise).",
        "",
        *table(
            "size",
            [
                "TCP as shoal (ms)",
                "shoal pull (ms)",
                "shoal − TCP (ms)",
                "shoal later get (µs)",
                "Ray get (ms)",
                "Ray later get (µs)",
            ],
            latency_rows(run),
        ),  # fmt: skip
        "",
        "## CPU time per pull",
        "",
        "CPU time (user + system) of every process taking part, summed over the samples of a size: "
        "*TCP as shoal*: the owner process and the puller; *shoal*: both node daemons and the reader; "
        "*Ray*: every process of the Ray driver's process group (GCS, raylets, workers, agents, the driver). "
        "Counted around the timed section only (for shoal, the daemons around the reader's request, which "
        "also makes the later get). The kernel counts in 10 ms ticks, so a mean over samples shorter "
        "than that is rough. Less sensitive to other load than the times: a machine of this size can pull at "
        "most about nproc × (GiB per CPU-second) per second.",
        "",
        *table(
            "size",
            [
                "TCP as shoal: ms / pull",
                "GiB / CPU-s",
                "shoal: ms / pull",
                "GiB / CPU-s",
                "Ray: ms / pull",
                "GiB / CPU-s",
            ],
            cpu_rows(run),
        ),  # fmt: skip
        "",
        "## Loopback TCP, every configuration (GiB/s)",
        "",
        "The raw pair with 1 to 8 connections (ranges split as shoal splits them), with the kernel's "
        "default receive buffer (autotuned, up to `net.ipv4.tcp_rmem`'s maximum) or with SO_RCVBUF set to "
        f"8 MiB as bulk.rs does (the kernel clamps it to `net.core.rmem_max` and doubles it: "
        f"{(rcv or 0) / MiB:.0f} MiB here). Kernel: {run['sysctl']}. The rows with 2 and 8 streams show "
        f"whether shoal's {PULL_PARTS} parallel ranges suit this machine: on a loaded machine more streams "
        "also win a larger share of the contended cores, so judge them on a quiet run.",
        "",
        *table("configuration", [f"{s // 1_000_000} MB" for s in SIZES], tcp_rows(run)),
        "",
        "## Target (issue: network-mode pull over loopback ≥ 4 GiB/s for 100 MB objects)",
        "",
        *target_lines(run),
    ]
    for name in run["plots"]:
        lines += ["", f"![pull throughput]({name})"]
    return "\n".join(lines) + "\n"


def plot(run, out_dir):
    """Median GiB/s per size, a bar per method, best as a tick; returns [the file name]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("shoal pull", "shoal"), ("Ray get", "ray"), ("TCP 1 stream", 1), ("TCP 4 streams", 4)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.2
    for i, (label, key) in enumerate(series):
        vals = []
        for size in SIZES:
            res = run["results"]["sizes"][str(size)]
            if key in ("shoal", "ray"):
                samples = res[key].get("pull_s")
                vals.append(pair(samples, gibs(size)) if samples else (0, 0))
            else:
                vals.append(best_tcp(res, size, key))
        xs = [j + (i - 1.5) * width for j in range(len(SIZES))]
        ax.bar(xs, [v[1] for v in vals], width, label=label)
        ax.scatter(xs, [v[0] for v in vals], marker="_", color="black", s=80, zorder=3)
    ax.axhline(run["limits"]["memcpy_gibs"], color="grey", linestyle="--", label="memcpy 100 MB")
    ax.axhline(TARGET_GIBS, color="red", linestyle=":", label=f"target {TARGET_GIBS:g} GiB/s (100 MB)")
    ax.set_xticks(range(len(SIZES)), [f"{s // 1_000_000} MB" for s in SIZES])
    ax.set(ylabel="GiB/s (bar: median, tick: best)", title="Pull of one object between two nodes on one host")
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = "network.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return [name]


# ---------------------------------------------------------------- main


def sysctls():
    out = []
    for name in ("net.core.rmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                out.append(f"`{name}` = {' '.join(f.read().split())}")
        except OSError:
            pass
    return ", ".join(out)


class Deadline(BaseException):  # not caught by the `except Exception` around Ray
    pass


def on_signal(signum, _frame):
    STOPPING.append(signum)
    if signum == signal.SIGALRM:
        raise Deadline("the run took longer than --deadline")
    raise SystemExit(f"stopped by signal {signum}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10, help="100 MB pulls per method (10 MB: 2×, 1 MB: 4×)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded rounds per size")
    ap.add_argument("--out", default=os.path.join(BENCH, "results", "network.md"))
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray rows")
    ap.add_argument("--deadline", type=int, default=900, help="seconds before the run gives up")
    ap.add_argument("--reader", metavar="SOCKET", help=argparse.SUPPRESS)
    ap.add_argument("--owner", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--owner-tls", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--ray-driver", metavar="TMP", help=argparse.SUPPRESS)
    ap.add_argument(
        "--tls",
        action="store_true",
        help="peer traffic over TLS against cleartext, alternated (bench/results/network-tls.md)",
    )
    args = ap.parse_args()
    from shoal.testing import require_optimized_build

    require_optimized_build()  # not the test command's opt-level-1 build
    if args.reader:
        return reader_main(args.reader)
    if args.owner:
        return owner_main(args.owner, args.owner_tls)
    if args.ray_driver:
        return ray_driver_main(args.ray_driver)
    if args.tls:
        import network_tls

        return network_tls.main(args)

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(args.deadline)
    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python bench/network.py " + " ".join(sys.argv[1:]),
        "reps": args.reps,
        "warmup": args.warmup,
        "machine": machine(),
        "checkout": checkout(),
        "sysctl": sysctls(),
        "load": {"start": os.getloadavg()[0]},
    }
    results = {"limit_runs": [], "sizes": {}}
    started, busy, own = time.monotonic(), machine_busy(), own_cpu()
    tmp = tempfile.mkdtemp(prefix="shoal-netbench-", dir="/tmp")
    shoal = ray = raw = None
    daemon_cpu = 0.0
    with open(os.path.join(out_dir, "raw-network.log"), "w") as errlog:
        try:
            log("memcpy limits ...")
            results["limit_runs"].append(memcpy_limits())
            log("raw TCP pair ...")
            raw = RawPair(os.path.basename(tmp), errlog)
            if args.no_ray:
                results["ray"] = {"failed": "--no-ray"}
            else:
                log("ray: setup and a 2-node cluster ...")
                ray = Ray(os.path.join(tmp, "ray"), errlog)
                try:
                    ray.start()
                    results["ray"] = {
                        "version": ray.version,
                        "start_s": ray.start_s,
                        "idle_share": ray.idle_share,
                    }
                except Exception as e:  # noqa: BLE001 - without Ray the rest still runs
                    why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                    log(f"ray: FAILED: {why}")
                    results["ray"] = {"failed": why}
                    ray.stop()
                    ray = None
            log("shoal: 2-node cluster, mapped,network ...")
            shoal = Shoal(os.path.join(tmp, "cluster"), errlog)
            shoal.start()
            results["shoal_version"] = shoal.version
            log("pulls ...")
            measure(args, shoal, ray, raw, results)
            results["effective_rcvbuf"] = raw.effective_rcvbuf
        finally:
            signal.alarm(0)
            for part in (ray, raw):
                if part is not None:
                    try:
                        part.stop()
                    except Exception as e:  # noqa: BLE001 - go on stopping the rest
                        log(f"stop: {e}")
            if shoal is not None:
                try:
                    daemon_cpu = shoal.stop()
                except Exception as e:  # noqa: BLE001 - report the original failure
                    log(f"cluster down: {e}")
            shutil.rmtree(tmp, ignore_errors=True)
        results["limit_runs"].append(memcpy_limits())
    run["results"] = results
    run["limits"] = {k: max(r[k] for r in results["limit_runs"]) for k in results["limit_runs"][0]}
    run["seconds"] = time.monotonic() - started
    run["load"]["end"] = os.getloadavg()[0]
    run["others_cpu_s"] = max(0.0, machine_busy() - busy - (own_cpu() - own + daemon_cpu))
    save_run(run, args.out, "raw-network.json", plot, report)


if __name__ == "__main__":
    main()
