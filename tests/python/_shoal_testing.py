"""Helpers of the shoal test-suite beyond `shoal.testing` (daemons, clusters, polling,
homes: what benchmarks use too): child processes, store snapshots, namespaces,
per-node credentials computed independently of the Rust code.

Imported by conftest.py and by the test modules (pytest puts this directory on
sys.path because it has no __init__.py).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shoal
from shoal.testing import (  # noqa: F401  (re-exported to the test modules)
    ANSI,
    Cluster,
    Daemon,
    MiB,
    home_of,
    ids_homed_at,
    shoal_command,
    short_dir,
    wait_for,
)


def shoal_ok(*args: str) -> str:
    """Runs `python -m shoal ARGS`, which must succeed; its standard output."""
    done = shoal_command(*args)
    assert done.returncode == 0, f"shoal {' '.join(args)}: {done.stderr}"
    return done.stdout


# The client protocol's version (crates/shoal-core/src/protocol/mod.rs PROTOCOL_VERSION),
# for the tests that speak raw frames.
PROTOCOL_VERSION = 18

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


def region_files_in_log(log: str) -> list[str]:
    return re.findall(r"region=(/dev/shm/shoal-[0-9]+-[0-9a-f]+)", ANSI.sub("", log))


def snippet(code: str) -> str:
    return PREAMBLE + textwrap.dedent(code)


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


def needs_library(name: str) -> Any:
    """The module `name` of a library only the tests use (duckdb, polars, h5py, netCDF4:
    scripts/setup-test-tools.sh installs them, the test command runs it); skips the test,
    saying so, where it is missing."""
    import pytest

    return pytest.importorskip(
        name, reason=f"no {name}: scripts/setup-test-tools.sh installs it (scripts/test.sh runs it)"
    )


def in_region(client: shoal.Client, address: int, size: int = 1) -> bool:
    start = client.region_address
    return start <= address and address + size <= start + client.region_size


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
