"""Helpers shared by the shoal test-suite: daemons, child processes, polling.

Imported by conftest.py and by the test modules (pytest puts this directory on
sys.path because it has no __init__.py).
"""

from __future__ import annotations

import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import shoal

MiB = 1 << 20

# Every child process gets this preamble, so snippets stay short.
PREAMBLE = """\
import gc, hashlib, json, os, sys, time
import numpy as np
import pyarrow as pa
import shoal

def emit(value):
    print(json.dumps(value), flush=True)

def status():
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields
"""


def wait_for(
    predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01, message: str = ""
) -> Any:
    """Polls `predicate` until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message or predicate}")
        time.sleep(interval)


def short_dir(base: Path) -> Path:
    """A directory for a socket: `base` if the socket path fits in sun_path (108 bytes)."""
    if len(str(base / "shoal.sock.lock")) < 100:
        return base
    return Path(tempfile.mkdtemp(prefix="shoal-", dir="/tmp"))


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def region_files_in_log(log: str) -> list[str]:
    return re.findall(r"region=(/dev/shm/shoal-[0-9]+-[0-9a-f]+)", ANSI.sub("", log))


def snippet(code: str) -> str:
    return PREAMBLE + textwrap.dedent(code)


# -- daemons ----------------------------------------------------------------------------------


class Daemon:
    """A `python -m shoal serve` subprocess owned by one test."""

    def __init__(
        self,
        directory: Path,
        capacity: str = "64MiB",
        args: Sequence[str] = (),
        connect: bool = True,
        prefault: bool = False,
    ) -> None:
        """Starts the daemon and waits until it serves: by connecting a client, or with
        `connect=False` by watching the socket file and the log (a client maps and
        faults in the whole region, which is slow for huge capacities)."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = str(directory / "shoal.sock")
        self.log_path = directory / "shoal-daemon.log"
        self.killed = False
        self.returncode: int | None = None
        self._clients: list[shoal.Client] = []
        command = [
            sys.executable,
            "-m",
            "shoal",
            "serve",
            "--socket",
            self.socket,
            "--capacity",
            capacity,
            *([] if prefault else ["--no-prefault"]),
            *args,
        ]
        env = dict(os.environ, NO_COLOR="1")
        env.pop("SHOAL_SOCKET", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        self._wait_ready(connect)

    def _serving(self, connect: bool) -> bool:
        if not connect:
            return os.path.exists(self.socket) and "shoal daemon serving" in ANSI.sub("", self.log())
        try:
            shoal.Client(self.socket).close()
            return True
        except shoal.Disconnected:
            return False

    def _wait_ready(self, connect: bool, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"daemon exited with {self.process.returncode} before serving:\n{self.log()}"
                )
            if self._serving(connect):
                return
            if time.monotonic() >= deadline:
                self.process.kill()
                self.process.wait(5)
                raise AssertionError(f"daemon did not start within {timeout} s:\n{self.log()}")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def client(self) -> shoal.Client:
        client = shoal.Client(self.socket)
        self._clients.append(client)
        return client

    def region_files(self) -> list[str]:
        return glob.glob(f"/dev/shm/shoal-{self.pid}-*")

    def kill(self) -> None:
        """SIGKILL: the test takes responsibility; teardown does not expect exit code 0."""
        self.killed = True
        self.process.kill()
        self.returncode = self.process.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code (kills and fails if it hangs)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"daemon ignored SIGTERM for {timeout} s:\n{self.log()}") from None
        self.returncode = self.process.returncode
        return self.returncode

    def teardown(self) -> None:
        try:
            if self.killed:
                return
            code = self.stop()
            assert code == 0, f"daemon exited with code {code}:\n{self.log()}"
            assert not os.path.exists(self.socket), "daemon left its socket file behind"
            assert not self.region_files(), f"daemon left its region behind: {self.region_files()}"
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            for path in self.region_files():  # only after a kill
                os.unlink(path)
            for client in self._clients:
                client.close()


# -- child Python processes --------------------------------------------------------------------


def run_python(code: str, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Any:
    """Runs a snippet in a fresh interpreter and returns the JSON of its last stdout line.

    The snippet sees `sys.argv[1:] == args` and the helpers of PREAMBLE (`emit`, `status`)."""
    result = subprocess.run(
        [sys.executable, "-c", snippet(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"child exited with {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"child printed nothing; stderr:\n{result.stderr}"
    return json.loads(lines[-1])


class Child:
    """A background Python process we talk to line by line (stdin/stdout)."""

    def __init__(self, code: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", snippet(code), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.process.stdout, self._lines.put), daemon=True).start()
        threading.Thread(
            target=self._pump, args=(self.process.stderr, self._stderr.append), daemon=True
        ).start()

    @staticmethod
    def _pump(stream: Any, sink: Callable[[Any], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return "".join(s for s in self._stderr if s)

    def line(self, timeout: float = 30.0) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child printed nothing for {timeout} s; stderr:\n{self.stderr()}") from None
        if line is None:
            self.process.wait(5)
            raise AssertionError(
                f"child exited ({self.process.returncode}) instead of printing; stderr:\n{self.stderr()}"
            )
        return line.rstrip("\n")

    def json(self, timeout: float = 30.0) -> Any:
        return json.loads(self.line(timeout))

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def finish(self, timeout: float = 30.0) -> int:
        """Waits for a normal exit and returns the exit code (kills on timeout)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"child did not exit within {timeout} s; stderr:\n{self.stderr()}") from None
        assert code == 0, f"child exited with {code}; stderr:\n{self.stderr()}"
        return code

    def close(self) -> None:
        self.kill()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


# -- store inspection --------------------------------------------------------------------------


def snapshot(client: shoal.Client) -> tuple[list[tuple], int, int]:
    """What a failed request must not change: objects, used bytes, object count."""
    objects = sorted(
        (o.id.binary(), o.data_size, o.metadata_size, o.sealed, o.ref_count) for o in client.list()
    )
    stats = client.stats()
    return objects, stats["used"], stats["objects"]


def in_region(client: shoal.Client, address: int, size: int = 1) -> bool:
    start = client.region_address
    return start <= address and address + size <= start + client.region_size


# -- clusters ----------------------------------------------------------------------------------


class Cluster:
    """An emulated cluster from `python -m shoal cluster up`, owned by one test."""

    def __init__(
        self,
        directory: Path,
        nodes: int = 3,
        capacity: str = "64MiB",
        modes: str = "mapped",
        coherence: str = "coherent",
        simulate_caches: bool = False,
        linger_ms: int | None = None,
        tiers: bool = False,
    ) -> None:
        """`tiers`: give each node the burst buffer and backing directory `cluster up` gives
        by default; off here, so tests of memory behaviour (eviction forgets, a restarted
        node comes back empty) see memory alone."""
        self.directory = directory
        self.name = f"t{os.getpid()}x{directory.name}"[-24:]
        self.nodes = nodes
        self.simulate_caches = simulate_caches
        self._clients: list[shoal.Client] = []
        result = shoal_command(
            "cluster", "up", "--nodes", str(nodes), "--dir", str(directory), "--capacity", capacity,
            "--modes", modes, "--coherence", coherence, "--name", self.name,
            *(["--simulate-caches"] if simulate_caches else []),
            *([] if linger_ms is None else ["--linger-ms", str(linger_ms)]),
            *([] if tiers else ["--no-tiers"]),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr + result.stdout
        self.file = directory / "cluster.toml"

    def socket(self, node: int) -> str:
        return str(self.directory / f"n{node}.sock")

    def client(self, node: int, *, fast_path: bool = True) -> shoal.Client:
        client = shoal.Client(self.socket(node), fast_path=fast_path)
        self._clients.append(client)
        return client

    def pid(self, node: int) -> int:
        return int((self.directory / f"n{node}.pid").read_text())

    def log(self, node: int) -> str:
        return ANSI.sub("", (self.directory / f"n{node}.log").read_text(errors="replace"))

    def kill(self, node: int) -> None:
        """SIGKILL one node's daemon (node death)."""
        pid = self.pid(node)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)

    def start(self, node: int, timeout: float = 15.0) -> None:
        """Starts node `node` again (after `kill`) from the same cluster file: a new
        incarnation with an empty store and a new region file. Returns once the
        node serves and its directory is rebuilt (its state is "up")."""
        env = dict(os.environ, NO_COLOR="1")
        env.pop("SHOAL_SOCKET", None)
        # Started by a short-lived intermediate, like `cluster up` does, so the
        # daemon is not our child (a zombie would look alive to `cluster down`).
        launcher = (
            "import subprocess, sys\n"
            "log = open(sys.argv[1], 'ab')\n"
            "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log,"
            " stderr=log, start_new_session=True)\n"
            "print(p.pid)\n"
        )
        command = [sys.executable, "-m", "shoal", "serve", "--cluster", str(self.file), "--node", str(node)]
        result = subprocess.run(
            [sys.executable, "-c", launcher, str(self.directory / f"n{node}.log"), *command],
            capture_output=True, text=True, env=env, timeout=30, check=True,
        )  # fmt: skip
        (self.directory / f"n{node}.pid").write_text(result.stdout.strip())
        wait_for(
            lambda: os.path.exists(self.socket(node)) and self.status()[node]["state"] == "up",
            timeout=timeout,
            interval=0.05,
            message=f"node {node} up again",
        )

    def status(self) -> list[dict]:
        result = shoal_command("cluster", "status", "--dir", str(self.directory), "--json")
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    def regions(self) -> list[str]:
        return glob.glob(f"/dev/shm/shoal-*-{self.name}-n*")

    def down(self) -> None:
        for client in self._clients:
            client.close()
        result = shoal_command("cluster", "down", "--dir", str(self.directory))
        assert result.returncode == 0, result.stderr + result.stdout
        assert not self.regions(), f"cluster left regions behind: {self.regions()}"


def hold_namespaces(command: list[str], holders: list[subprocess.Popen], known: set[str]) -> int:
    """Starts `command` (an unshare/nsenter chain ending in `cat`) to keep new namespaces
    alive; returns its pid once it runs in a network namespace not in `known` (added to it),
    i.e. once unshare made the namespaces, wrote the user namespace's id maps and ran
    whatever setup came before the exec of cat. The process is appended to `holders`."""
    holder = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    holders.append(holder)
    deadline = time.monotonic() + 10
    while True:
        try:
            with open(f"/proc/{holder.pid}/comm") as comm:
                running = comm.read().strip()
            namespace = os.readlink(f"/proc/{holder.pid}/ns/net")
        except OSError:
            running, namespace = "", None
        if running == "cat" and namespace is not None and namespace not in known:
            known.add(namespace)
            return holder.pid
        if holder.poll() is not None:
            assert holder.stderr is not None
            raise AssertionError(f"{' '.join(command)}: {holder.stderr.read().decode().strip()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{' '.join(command)} made no namespace within 10 s")
        time.sleep(0.005)


def home_of(oid: shoal.ObjectID, nodes: int) -> int:
    """An id's home node, as every daemon computes it (SplitMix64 over the id's bytes,
    crates/shoal-cluster/src/directory.rs)."""
    mask = (1 << 64) - 1
    h = 0x9E3779B97F4A7C15
    raw = oid.binary()
    for start in range(0, len(raw), 8):
        h ^= int.from_bytes(raw[start : start + 8].ljust(8, b"\0"), "little")
        z = (h + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        h = z ^ (z >> 31)
    return h % nodes


def ids_homed_at(node: int, count: int, nodes: int = 3) -> list[shoal.ObjectID]:
    """`count` random ids whose home is `node`."""
    found: list[shoal.ObjectID] = []
    while len(found) < count:
        oid = shoal.ObjectID.from_random()
        if home_of(oid, nodes) == node:
            found.append(oid)
    return found


def shoal_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SHOAL_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# --- per-node credentials, computed independently of the Rust code (issue 15 item 8) ---

_P = 2**255 - 19


def x25519(scalar: bytes, point: bytes) -> bytes:
    """X25519 (RFC 7748, section 5): the Montgomery ladder, in plain Python (tests only)."""
    k = bytearray(scalar)
    k[0] &= 248
    k[31] = (k[31] & 127) | 64
    n = int.from_bytes(k, "little")
    x1 = int.from_bytes(point, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        if swap ^ bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3, z3 = (da + cb) ** 2 % _P, x1 * (da - cb) ** 2 % _P
        x2, z2 = aa * bb % _P, e * (aa + 121665 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def peer_credential(cluster_file: Path, sender: int, receiver: int) -> str:
    """The credential node `sender` presents to node `receiver` (docs/security.md): HMAC-SHA256
    keyed with X25519(sender's key, receiver's public key), over the context, the cluster's name
    and token (each length-prefixed) and the two node ids."""
    import hashlib
    import hmac
    import tomllib

    config = tomllib.loads(cluster_file.read_text())
    nodes = {n["id"]: n for n in config["node"]}
    key_file = Path(nodes[sender]["key_file"])
    if not key_file.is_absolute():
        key_file = cluster_file.parent / key_file
    secret = x25519(bytes.fromhex(key_file.read_text().strip()), bytes.fromhex(nodes[receiver]["public_key"]))
    message = b"shoal peer credential v1\0"
    for field in (config["cluster"]["name"].encode(), config["cluster"]["token"].encode()):
        message += len(field).to_bytes(4, "little") + field
    message += sender.to_bytes(4, "little") + receiver.to_bytes(4, "little")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
