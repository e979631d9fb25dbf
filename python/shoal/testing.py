"""Real shoal daemons and clusters for tests and benchmarks.

What shoal's own test suite and benchmarks start their stores with, for programs that
test against shoal too: a `shoal serve` process owned by one test (`Daemon`: it checks at
teardown that the daemon exits 0 and leaves neither socket nor region behind), an emulated
cluster from `shoal cluster up` (`Cluster`: kill and restart nodes), polling with a
deadline, and the home node of an id as every daemon computes it.

    from shoal.testing import Daemon
    daemon = Daemon(tmp_path, capacity="256MiB")
    client = daemon.client()
    ...
    daemon.teardown()

The keyword-only options are for benchmarks (bench/): another shoal program, a command
prefix (CPU pinning), extra environment, a log of their choosing, starting without waiting
(to time the start), and a teardown that reports instead of failing (`check=False`).
Their defaults are what the tests use.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import shoal

MiB = 1 << 20


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


def require_optimized_build() -> None:
    """Ends a benchmark run at once when this interpreter's shoal extension was not built at
    opt-level 3: the test command builds it at opt-level 1 (`shoal.build_info()`), and
    numbers measured with that build would say nothing about shoal. SHOAL_BENCH_ANY_BUILD=1
    lets a run go on anyway (to time the build itself)."""
    level = shoal.build_info()["opt_level"]
    if level != "3" and not os.environ.get("SHOAL_BENCH_ANY_BUILD"):
        sys.exit(
            f"bench: this shoal extension was built at opt-level {level} (scripts/test.sh's "
            "build, which shares its dependencies with the tests'), not for measuring; "
            "./scripts/setup.sh builds the release one (SHOAL_BENCH_ANY_BUILD=1 runs anyway)"
        )


def short_dir(base: Path) -> Path:
    """A directory for a socket: `base` if the socket path fits in sun_path (108 bytes)."""
    if len(str(base / "shoal.sock.lock")) < 100:
        return base
    return Path(tempfile.mkdtemp(prefix="shoal-", dir="/tmp"))


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _report(problem: object) -> None:
    """What a lenient teardown (`check=False`) found, for the reader of stderr."""
    print(f"shoal.testing: {problem}", file=sys.stderr, flush=True)


class Daemon:
    """A `python -m shoal serve` subprocess owned by one test."""

    def __init__(
        self,
        directory: Path,
        capacity: str = "64MiB",
        args: Sequence[str] = (),
        connect: bool = True,
        prefault: bool = False,
        *,
        program: Sequence[str] | None = None,
        prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log: str | os.PathLike[str] | IO[Any] | None = None,
        wait: bool = True,
        timeout: float = 15.0,
    ) -> None:
        """Starts the daemon and waits until it serves: by connecting a client, or with
        `connect=False` by watching the socket file and the log (a client maps and
        faults in the whole region, which is slow for huge capacities).

        Keyword-only (benchmarks):
        - `program`: the shoal command to run `serve` with, instead of this interpreter's
          `python -m shoal`: e.g. `["shoal"]`, the release binary, another interpreter's
          `[python, "-m", "shoal"]`;
        - `prefix`: put before the command line, e.g. `["taskset", "-c", "1"]` (the prefix
          must exec the daemon, so that `pid` is the daemon's);
        - `env`: variables set in the daemon's environment on top of this process's
          (SHOAL_SOCKET is still removed);
        - `log`: where its stdout and stderr go, a path (appended to) or an open file (read
          back through its name, as `connect=False` does; default `directory/shoal-daemon.log`);
        - `wait=False`: return once the process is started, without waiting (`started` is
          its `time.monotonic()` start; `wait_ready` waits later);
        - `timeout`: seconds the wait gives the daemon to serve."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = str(directory / "shoal.sock")
        output: IO[Any] | None = None  # the file we open for the log, closed once it is passed on
        if log is None or isinstance(log, (str, os.PathLike)):
            self.log_path: Path | None = Path(log or directory / "shoal-daemon.log")
            output = open(self.log_path, "ab")  # noqa: SIM115 - closed below
        else:  # an open file: read back through its name, if it has one
            name = getattr(log, "name", None)
            self.log_path = Path(name) if isinstance(name, str) else None
        self.killed = False
        self.returncode: int | None = None
        self._clients: list[shoal.Client] = []
        command = [
            *prefix,
            *(program or [sys.executable, "-m", "shoal"]),
            "serve",
            "--socket",
            self.socket,
            "--capacity",
            capacity,
            *([] if prefault else ["--no-prefault"]),
            *args,
        ]
        environment = dict(os.environ, NO_COLOR="1")
        environment.update(env or {})
        environment.pop("SHOAL_SOCKET", None)
        sink = output if output is not None else log
        try:
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=environment
            )
        finally:
            if output is not None:
                output.close()
        if wait:
            self.wait_ready(connect, timeout)

    def _serving(self, connect: bool) -> bool:
        if not connect:
            return os.path.exists(self.socket) and "shoal daemon serving" in ANSI.sub("", self.log())
        try:
            shoal.Client(self.socket).close()
            return True
        except shoal.Disconnected:
            return False

    def wait_ready(self, connect: bool = True, timeout: float = 15.0) -> None:
        """Waits until the daemon serves (see `connect` in `__init__`); fails, killing it,
        if it exits first or does not serve within `timeout` seconds."""
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
        if self.log_path is None:
            return ""
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

    def teardown(self, *, check: bool = True, timeout: float = 10.0) -> None:
        """Stops the daemon (SIGTERM; `timeout` seconds, then SIGKILL) and checks that it exited
        0 and left neither socket nor region behind; closes the clients of `client()`.
        `check=False` (benchmarks): the same, but what the checks find goes to stderr
        instead of failing."""
        try:
            if self.killed:
                return
            try:
                code = self.stop(timeout)
                assert code == 0, f"daemon exited with code {code}:\n{self.log()}"
                assert not os.path.exists(self.socket), "daemon left its socket file behind"
                assert not self.region_files(), f"daemon left its region behind: {self.region_files()}"
            except AssertionError as problem:
                if check:
                    raise
                _report(problem)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            for path in self.region_files():  # only after a kill
                os.unlink(path)
            for client in self._clients:
                client.close()


class Cluster:
    """An emulated cluster from `python -m shoal cluster up`, owned by one test."""

    # What `__init__` sets; here too for subclasses that make their cluster another way.
    timeout: float = 60.0
    command_log: IO[str] | None = None

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
        *,
        tls: bool = False,
        timeout: float = 60.0,
        log: IO[str] | None = None,
    ) -> None:
        """`tiers`: give each node the burst buffer and backing directory `cluster up` gives
        by default; off here, so tests of memory behaviour (eviction forgets, a restarted
        node comes back empty) see memory alone. Keyword-only (benchmarks): `timeout`,
        seconds each `shoal cluster` command (up, status, down) may take; `log`, an open
        text file those commands and their output are appended to; `tls`, peer traffic over
        TLS 1.3 as between hosts (`cluster up --tls`)."""
        self.directory = directory
        self.name = f"t{os.getpid()}x{directory.name}"[-24:]
        self.nodes = nodes
        self.simulate_caches = simulate_caches
        self.timeout = timeout
        self.command_log = log
        self._clients: list[shoal.Client] = []
        result = shoal_command(
            "cluster", "up", "--nodes", str(nodes), "--dir", str(directory), "--capacity", capacity,
            "--modes", modes, "--coherence", coherence, "--name", self.name,
            *(["--simulate-caches"] if simulate_caches else []),
            *([] if linger_ms is None else ["--linger-ms", str(linger_ms)]),
            *([] if tiers else ["--no-tiers"]),
            *(["--tls"] if tls else []),
            timeout=timeout, log=log,
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

    def start(self, node: int, timeout: float = 30.0) -> None:
        """Starts node `node` again (after `kill`) from the same cluster file: a new
        incarnation with an empty store and a new region file. Returns once the
        node serves and its directory is rebuilt (its state is "up"); a node not up
        within `timeout` fails with the end of its log. (Under the test command's four
        parallel workers on 2 cores a restart took more than 15 s twice, alone ~5 s.)"""
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
        try:
            wait_for(
                lambda: os.path.exists(self.socket(node)) and self.status()[node]["state"] == "up",
                timeout=timeout,
                interval=0.05,
                message=f"node {node} up again",
            )
        except AssertionError as e:
            log = (self.directory / f"n{node}.log").read_text(errors="replace").splitlines()
            raise AssertionError(f"{e}; the end of its log:\n" + "\n".join(log[-40:])) from None

    def _command(self, *args: str) -> subprocess.CompletedProcess:
        """`shoal cluster ARGS --dir DIRECTORY`."""
        return shoal_command(
            "cluster", *args, "--dir", str(self.directory), timeout=self.timeout, log=self.command_log
        )

    def status(self) -> list[dict]:
        result = self._command("status", "--json")
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    def regions(self) -> list[str]:
        return glob.glob(f"/dev/shm/shoal-*-{self.name}-n*")

    def down(self, *, check: bool = True) -> None:
        """Closes the clients of `client()` and stops the cluster (`shoal cluster down`),
        checking that it stopped and left no region behind. `check=False` (benchmarks): what
        the checks find goes to stderr instead of failing."""
        for client in self._clients:
            client.close()
        result = self._command("down")
        try:
            assert result.returncode == 0, result.stderr + result.stdout
            assert not self.regions(), f"cluster left regions behind: {self.regions()}"
        except AssertionError as problem:
            if check:
                raise
            _report(problem)


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def id_hash(raw: bytes) -> int:
    """SplitMix64 over an id's bytes, 8 at a time (crates/shoal-cluster/src/view.rs)."""
    h = 0x9E3779B97F4A7C15
    for start in range(0, len(raw), 8):
        h = _mix(h ^ int.from_bytes(raw[start : start + 8].ljust(8, b"\0"), "little"))
    return h


def home_of(oid: shoal.ObjectID | bytes, nodes: int | Iterable[int]) -> int:
    """An id's home as every daemon computes it: rendezvous hashing over the view's members
    (`nodes` of them numbered 0..nodes, or the member ids), the highest weight wins, the
    lower id on a tie (crates/shoal-cluster/src/view.rs; tests/vectors/homes.txt)."""
    raw = oid if isinstance(oid, bytes) else oid.binary()
    members = range(nodes) if isinstance(nodes, int) else nodes
    h = id_hash(raw)
    return max(members, key=lambda node: (_mix(h ^ ((node * 0xD6E8FEB86659FD93) & _MASK)), -node))


def ids_homed_at(node: int, count: int, nodes: int = 3) -> list[shoal.ObjectID]:
    """`count` random ids whose home is `node`."""
    found: list[shoal.ObjectID] = []
    while len(found) < count:
        oid = shoal.ObjectID.from_random()
        if home_of(oid, nodes) == node:
            found.append(oid)
    return found


def shoal_command(*args: str, timeout: float = 60, log: IO[str] | None = None) -> subprocess.CompletedProcess:
    """Runs `python -m shoal ARGS` (this interpreter's shoal) and captures its output; with
    `log` (an open text file), also appends the command line and its output there."""
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SHOAL_SOCKET", None)
    command = [sys.executable, "-m", "shoal", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if log is not None:
        log.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}")
        log.flush()
    return result
