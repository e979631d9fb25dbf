"""A cluster across isolated hosts, emulated with namespaces: the multi-host test harness.

Each host is a network namespace AND a mount namespace with private tmpfs mounts on /tmp,
/dev/shm and /run: it shares no file system with the other hosts (nor with the test), so
its daemon's socket, region and burst buffer are its own, as on a separate machine. It has
its own hostname (host<i>, a UTS namespace) and an /etc/hosts naming every host. The
hosts' network namespaces hang off one Linux bridge in a "switch" namespace, by a veth
pair each (host i is 10.202.0.<i+1>/24 on its eth0, the switch's end is s<i>). Nothing
routes anywhere else: the switch has no other link and the hosts no default route.

The program and its Python environment are read from the real root file system (installed
software, as on every host of a real cluster); everything a node writes lands on its
host's tmpfs. A daemon's log goes to a file of the test's (through its stdout: the daemon
never sees the path), so a failing test can show it.

The test cannot be a client of a daemon (its /dev/shm is the host's), so each host runs an
agent (multihost_agent.py) inside its namespaces that the test drives over a pipe:
`hosts[1].client.get(oid)` runs `shoal.Client.get` on host 1 and returns the value, or
raises the same shoal error type. `with Hosts(directory, 3) as hosts:` (or the `make_hosts`
fixture of conftest.py) makes and removes everything. Every process is started with a
parent-death signal and the namespaces are held by processes of the test, so nothing
outlives the test process. (The signal follows the thread that started a process: make
hosts and start daemons from the test's own thread, not from a worker thread that ends.)

Faults: `kill(i)` (SIGKILL), `stop(i)` / `resume(i)` (SIGSTOP / SIGCONT), `cut(i)` /
`heal(i)` (the host's switch port: its link set down, or the bridge port disabled, so
packets vanish silently both ways; there is no netem in this kernel), `start(i)` after a
kill (same cluster file, same burst directory).

Made in a user namespace of our own (`unshare -Urn`, no privilege needed) where the kernel
allows it, else as root without one; `unavailable()` says why neither works, for a skip.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from _shoal_testing import hold_namespaces, shoal_ok, wait_for
from multihost_agent import decode, encode

import shoal

SUBNET = "10.202.0"  # host i is SUBNET.(i+1); only inside the namespaces made here
SWITCH = f"{SUBNET}.254"  # the switch's own address on its bridge: where etcd serves the hosts
RPC_PORT = 7700  # the data channel is the next port
AGENT = str(Path(__file__).with_name("multihost_agent.py"))
HOST_MOUNTS = {"/tmp": "512m", "/dev/shm": "512m", "/run": "64m"}  # private tmpfs, with limits
RUN = "/run/shoal"  # a host's run directory: cluster file, key, socket
METRICS = "127.0.0.1:9100"  # a daemon's metrics endpoint with membership, on its host's loopback
BURST = "/tmp/shoal-burst"  # a host's burst buffer (its private file system)
# Where every host sees the one directory they share (`Hosts(shared_backing=True)`: a shared
# file system holding each node's backing store, bind-mounted into each host's namespace).
SHARED = "/srv"
STARTUP = 30.0  # s, bound for a daemon to serve and see every other node
# A daemon's log line for each view of the membership it adopts (cluster/view_change.rs).
VIEW_ADOPTED = re.compile(r"adopted the cluster's view view=epoch=(\d+) members=([\d,]*)")


def until(predicate: Callable[[], Any], timeout: float, message: str, interval: float = 0.05) -> float:
    """Polls `predicate` until true; returns the seconds it took, fails after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {message}")
        time.sleep(interval)
    return time.monotonic() - started


def _host_setup(name: str, hosts: dict[str, str], shared: str | None = None) -> str:
    """The shell commands that make a new mount and UTS namespace a host: private tmpfs
    mounts, its own /etc/hosts (naming `hosts`, name -> address) and hostname; with
    `shared`, that directory of the test's bind-mounted at SHARED first (before /tmp, where
    it may lie, is hidden)."""
    mounts = [f"mount -t tmpfs -o size={size},mode=1777 tmpfs {path}" for path, size in HOST_MOUNTS.items()]
    if shared is not None:
        mounts.insert(0, f"mount --bind {shared} {SHARED}")
    names = "".join(f"{address} {host}\\n" for host, address in hosts.items())
    return " && ".join([
        *mounts,
        f"printf '127.0.0.1 localhost\\n{names}' > /run/hosts",
        "mount --bind /run/hosts /etc/hosts",
        f"hostname {name}",
    ])  # fmt: skip


def _probe(prefix: list[str]) -> str | None:
    """Whether `prefix` (an unshare command) can make what a host needs: its private file
    systems and name, a bridge and a veth pair on it. None if so, else what failed."""
    network = [
        "ip link add b0 type bridge",
        "ip link add v0 type veth peer name v1",
        "ip link set v0 master b0",
    ]
    script = " && ".join([_host_setup("probe", {"probe": "10.0.0.1"}), *network])
    try:
        done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if done.returncode == 0:
        return None
    why = done.stderr.strip() or f"exit code {done.returncode}"
    if "No space left on device" in why:  # ENOSPC from unshare(2): a namespace count limit
        why += " (a limit in /proc/sys/user/max_*_namespaces is reached or 0)"
    return why


@functools.cache
def _isolation() -> tuple[bool | None, str]:
    """(True: in a user namespace of our own, False: as root without one, None: impossible;
    why not, for the last)."""
    if not sys.platform.startswith("linux"):
        return None, "hosts are emulated with Linux namespaces"
    missing = [
        tool for tool in ("unshare", "nsenter", "setpriv", "ip", "mount") if shutil.which(tool) is None
    ]
    if missing:
        return None, f"{', '.join(missing)} not installed"
    rootless = _probe(["unshare", "-Urnmu"])
    if rootless is None:
        return True, ""
    if os.geteuid() == 0:
        as_root = _probe(["unshare", "-nmu"])
        if as_root is None:
            return False, ""
        return None, f"no network and mount namespaces: in a user namespace: {rootless}; as root: {as_root}"
    return None, f"no network and mount namespaces in a user namespace ({rootless}) and not root"


def unavailable() -> str | None:
    """Why isolated hosts cannot be made here (for `pytest.skip`), or None."""
    usable, why = _isolation()
    return None if usable is not None else f"cannot emulate isolated hosts: {why}"


def _dies_with_us(command: list[str]) -> list[str]:
    """`command` killed when the test process dies (whatever its namespaces)."""
    return ["setpriv", "--pdeathsig", "KILL", *command]


class Network:
    """The switch namespace with its bridge, and one network + mount namespace per host."""

    def __init__(self, hosts: int, shared: str | None = None) -> None:
        self.shared = shared
        self.userns, _ = _isolation()
        assert self.userns is not None, unavailable()
        self._holders: list[subprocess.Popen] = []
        self._known = {os.readlink("/proc/self/ns/net")}
        self.down: dict[int, str] = {}  # host -> how it is cut
        self.off_switch: set[int] = set()  # hosts cut from the switch's services only
        try:
            unshare = ["unshare", "-Urn"] if self.userns else ["unshare", "-n"]
            self.switch = self._hold([*unshare, *_dies_with_us(["cat"])])
            self.hosts = [
                self._hold([*self._enter(self.switch, mount=False), *self._host(i, hosts)])
                for i in range(hosts)
            ]
            self._wire()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def address(host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    @staticmethod
    def name(host: int) -> str:
        """The host's name: its hostname, and in every host's /etc/hosts."""
        return f"host{host}"

    def _host(self, host: int, hosts: int) -> list[str]:
        """The command that makes host `host`'s namespaces (network, mount, UTS), sets it up
        (`_host_setup`) and then holds them."""
        names = {self.name(i): self.address(i) for i in range(hosts)}
        setup = _host_setup(self.name(host), names, self.shared)
        return [
            *("unshare", "-n", "-m", "-u", "--propagation", "private"),
            *("sh", "-c", f"{setup} && exec setpriv --pdeathsig KILL cat"),
        ]

    def _enter(self, holder: int, mount: bool = True) -> list[str]:
        return [
            "nsenter",
            "-t",
            str(holder),
            *(["-U"] if self.userns else []),
            "-n",
            *(["-m", "-u"] if mount else []),
        ]

    def enter(self, host: int) -> list[str]:
        """The command prefix that runs a program on `host` (its network and file systems)."""
        return [*self._enter(self.hosts[host]), "--wd=/"]

    def _run(self, holder: int, *command: str) -> None:
        done = subprocess.run(
            [*self._enter(holder, mount=False), *command], capture_output=True, text=True, timeout=10
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: {done.stderr.strip()}")

    def _hold(self, command: list[str]) -> int:
        """Starts a process that keeps new namespaces alive; returns its pid once it is in them."""
        return hold_namespaces(command, self._holders, self._known)

    def _wire(self) -> None:
        self._run(self.switch, "ip", "link", "set", "lo", "up")
        self._run(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._run(self.switch, "ip", "link", "set", "br0", "up")
        self._run(self.switch, "ip", "addr", "add", f"{SWITCH}/24", "dev", "br0")
        for i, host in enumerate(self.hosts):
            port = f"s{i}"
            self._run(
                self.switch,
                "ip",
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                str(host),
            )
            self._run(self.switch, "ip", "link", "set", port, "master", "br0")
            self._run(self.switch, "ip", "link", "set", port, "up")
            self._run(host, "ip", "link", "set", "lo", "up")
            self._run(host, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            self._run(host, "ip", "link", "set", "eth0", "up")

    def cut(self, host: int, how: str = "link") -> None:
        """Cuts `host` off: every packet to or from it vanishes, without an answer. `how`:
        "link" sets its switch port's link down (its eth0 loses carrier, as when a cable is
        pulled); "port" disables its bridge port (both links stay up, as when a switch drops
        the port)."""
        if host in self.down:
            return
        if how == "link":
            self._run(self.switch, "ip", "link", "set", f"s{host}", "down")
        elif how == "port":
            self._run(self.switch, "bridge", "link", "set", "dev", f"s{host}", "state", "0")
        else:
            raise ValueError(f"a cut is by 'link' or 'port', not {how!r}")
        self.down[host] = how

    def heal(self, host: int | None = None) -> None:
        """Reconnects `host` (None: every host cut off)."""
        for h in [host] if host is not None else sorted(self.down):
            how = self.down.pop(h, None)
            if how == "link":
                self._run(self.switch, "ip", "link", "set", f"s{h}", "up")
            elif how == "port":
                self._run(self.switch, "bridge", "link", "set", "dev", f"s{h}", "state", "3")

    def cut_from_switch(self, host: int) -> None:
        """Cuts `host` off from the switch's own services (etcd) only: packets between them
        vanish both ways (a blackhole route on each side); the host still reaches every other
        host."""
        if host in self.off_switch:
            return
        self._run(self.hosts[host], "ip", "route", "add", "blackhole", f"{SWITCH}/32")
        self._run(self.switch, "ip", "route", "add", "blackhole", f"{self.address(host)}/32")
        self.off_switch.add(host)

    def heal_from_switch(self, host: int) -> None:
        if host not in self.off_switch:
            return
        self.off_switch.discard(host)
        self._run(self.hosts[host], "ip", "route", "del", "blackhole", f"{SWITCH}/32")
        self._run(self.switch, "ip", "route", "del", "blackhole", f"{self.address(host)}/32")

    def on_switch(self, command: list[str], log: Path) -> subprocess.Popen:
        """Starts `command` in the switch's network namespace (a service every host reaches
        at SWITCH); its output goes to `log`. The caller stops it."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                [*self._enter(self.switch, mount=False), *_dies_with_us(command)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip

    def run_on_switch(self, *command: str, timeout: float = 10) -> subprocess.CompletedProcess:
        prefix = self._enter(self.switch, mount=False)
        return subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=timeout)

    def namespaces(self) -> set[str]:
        return self._known - {os.readlink("/proc/self/ns/net")}

    def close(self) -> None:
        for holder in self._holders:
            if holder.poll() is None:
                holder.kill()
            holder.wait(10)
            for stream in (holder.stdin, holder.stderr):
                if stream is not None:
                    stream.close()


class Etcd:
    """An etcd cluster of `members` members (Debian's etcd-server) in the switch's namespace:
    every host reaches member m at SWITCH:2379+100m, as it would an etcd run apart from the
    store's hosts. Fast elections (50 ms heartbeats, 500 ms election timeout), so a lease
    may be as short as 1 s. Members can be killed and started again; `leader` asks them
    with etcdctl which leads. Its data and logs live in the test's `directory`."""

    def __init__(self, network: Network, directory: Path, members: int = 1) -> None:
        if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
            raise AssertionError("no etcd or etcdctl: scripts/setup-test-tools.sh installs them")
        self.network = network
        self.directory = directory
        self.count = members
        self.processes: list[subprocess.Popen | None] = [None] * members
        for m in range(members):
            self.start(m, state="new")
        wait_for(lambda: self.leader() is not None, 20, interval=0.1, message="etcd electing a leader")

    @staticmethod
    def client_port(member: int) -> int:
        return 2379 + 100 * member

    def endpoints(self) -> str:
        return ",".join(f"{SWITCH}:{self.client_port(m)}" for m in range(self.count))

    def url(self, prefix: str) -> str:
        """The `membership` URL of a cluster file: every member, then the key prefix."""
        return f"etcd://{self.endpoints()}/{prefix}"

    def start(self, member: int, state: str = "existing") -> None:
        assert self.processes[member] is None or self.processes[member].poll() is not None
        name, peer = f"e{member}", f"http://{SWITCH}:{self.client_port(member) + 1}"
        client = f"http://{SWITCH}:{self.client_port(member)}"
        initial = ",".join(f"e{m}=http://{SWITCH}:{self.client_port(m) + 1}" for m in range(self.count))
        command = [
            "etcd", "--name", name, "--data-dir", str(self.directory / f"etcd-{name}"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial, "--initial-cluster-state", state,
            "--initial-cluster-token", "shoal-multihost",
            "--heartbeat-interval", "50", "--election-timeout", "500",
        ]  # fmt: skip
        self.processes[member] = self.network.on_switch(command, self.directory / f"etcd-{name}.log")

    def kill(self, member: int) -> None:
        process = self.processes[member]
        assert process is not None and process.poll() is None, f"etcd member {member} is not running"
        process.kill()
        process.wait(10)

    def _ctl(self, *args: str, endpoints: str | None = None) -> str:
        done = self.network.run_on_switch(
            "etcdctl", "--endpoints", endpoints or self.endpoints(), "--dial-timeout", "2s",
            "--command-timeout", "3s", *args,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"etcdctl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def leader(self) -> int | None:
        """The member that leads now, or None (no quorum, or none running)."""
        for m, process in enumerate(self.processes):
            if process is None or process.poll() is not None:
                continue
            try:
                status = json.loads(
                    self._ctl("endpoint", "status", "-w", "json", endpoints=f"{SWITCH}:{self.client_port(m)}")
                )
            except (AssertionError, ValueError, subprocess.TimeoutExpired):
                continue
            if status and status[0]["Status"]["leader"] == status[0]["Status"]["header"]["member_id"]:
                return m
        return None

    def close(self) -> None:
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)


class AgentError(AssertionError):
    """An agent's request failed with an error that is not a shoal error (a bug in the test
    or the harness): its type, message and traceback on the host."""


class Agent:
    """The agent process of one host (see multihost_agent.py); thread-safe, one request at
    a time."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def request(self, timeout: float = 60.0, **request: Any) -> tuple[Any, float]:
        """Sends one request; returns (value, seconds it took on the host), or raises the
        shoal error it failed with (with `.seconds` set)."""
        with self._lock:
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                raise AssertionError(f"agent exited:\n{self.log.read_text(errors='replace')}") from None
            try:
                line = self._answers.get(timeout=timeout)
            except queue.Empty:
                self.process.kill()  # its answer would be read as the next request's
                raise AssertionError(f"agent answered {request.get('op')} not within {timeout} s") from None
        if line is None:
            raise AssertionError(f"agent exited:\n{self.log.read_text(errors='replace')}")
        answer = json.loads(line)
        if "error" in answer:
            kind = getattr(shoal.errors, answer["error"], None)
            if isinstance(kind, type) and issubclass(kind, shoal.ShoalError):
                err: Exception = kind(answer["message"])
            else:
                err = AgentError(f"{answer['error']}: {answer['message']}\n{answer.get('traceback', '')}")
            err.seconds = answer["seconds"]  # type: ignore[attr-defined]
            raise err
        return decode(answer["ok"]), answer["seconds"]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # the agent ends at the end of its input
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


class RemoteClient:
    """`shoal.Client` of one host, run by its agent: `host.client.put(value)`."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._agent.request(
                op="call", method=method, args=encode(list(args)), kwargs=encode(kwargs)
            )[0]

        return call


class Host:
    """One emulated host: its agent (`client`, `timed`, `checksums`, `exec`, `run`, `write`)
    and its daemon (started and faulted through `Hosts`)."""

    def __init__(self, hosts: Hosts, index: int) -> None:
        self.index = index
        self.address = Network.address(index)
        self.directory = hosts.directory / f"host{index}"  # the test's: logs only
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket = hosts.path("socket", index)
        self.agent = Agent(
            [*hosts.network.enter(index), *_dies_with_us([sys.executable, "-u", AGENT, self.socket])],
            self.directory / "agent.log",
        )
        self.client = RemoteClient(self.agent)
        self.daemon: subprocess.Popen | None = None
        self.daemon_log = self.directory / "daemon.log"
        self.stopped = False  # SIGSTOP'ed
        self.killed = False  # SIGKILL'ed (and not started again)

    def timed(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """Runs a client method; returns (its value or the shoal error it raised, the seconds
        it took on the host)."""
        try:
            return self.agent.request(
                op="call", method=method, args=encode(list(args)), kwargs=encode(kwargs)
            )
        except shoal.ShoalError as err:
            return err, err.seconds  # type: ignore[attr-defined]

    def checksums(self, ids: Iterable[shoal.ObjectID], timeout_ms: int = 0) -> list[str | None]:
        """The SHA-256 of each object's data as this host reads it, None where not found."""
        return self.agent.request(op="checksums", ids=encode(list(ids)), timeout_ms=timeout_ms)[0]

    def timed_checksums(
        self, ids: Iterable[shoal.ObjectID], timeout_ms: int = 0
    ) -> tuple[list[str | None], float]:
        """`checksums` and the seconds the gets took on the host."""
        return self.agent.request(op="checksums", ids=encode(list(ids)), timeout_ms=timeout_ms)

    def exec(self, code: str, **variables: Any) -> Any:
        """Runs Python on the host with `client` (its shoal.Client), `shoal`, `pa`, `np` and
        `keep` (a dict kept between calls) in scope; returns what it leaves in `result`."""
        return self.agent.request(op="exec", code=code, vars=encode(variables))[0]

    def run(self, *argv: str, timeout: float = 30.0) -> dict[str, Any]:
        """Runs a program on the host: returncode, stdout, stderr."""
        return self.agent.request(op="run", argv=list(argv), timeout=timeout)[0]

    def write(self, path: str, text: str, mode: int = 0o600) -> None:
        self.agent.request(op="write", path=path, text=text, mode=mode)

    def read(self, path: str) -> str:
        return self.agent.request(op="read", path=path)[0]

    def log(self) -> str:
        try:
            return self.daemon_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def serving(self) -> bool:
        return self.agent.request(op="serving")[0]

    def metric(self, name: str) -> float | None:
        """A metric of this host's daemon (membership clusters serve them), None if absent."""
        text = self.exec(
            "import urllib.request\n"
            f"result = urllib.request.urlopen('http://{METRICS}/metrics', timeout=5).read().decode()"
        )
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def views(self, since_start: bool = False) -> list[tuple[int, list[int]]]:
        """Every view this host's daemon adopted, in order, from its log: (epoch, members),
        over all its runs or only since it was last started."""
        text = self.log()
        if since_start:
            text = text.rsplit("\n--- ", 1)[-1]
        return [
            (int(epoch), [int(m) for m in members.split(",") if m])
            for epoch, members in VIEW_ADOPTED.findall(text)
        ]

    def view(self) -> tuple[int, list[int]] | None:
        """The last view this host's daemon adopted since it was last started, or None
        before its first."""
        views = self.views(since_start=True)
        return views[-1] if views else None

    def sees(self) -> set[int]:
        """The nodes this host's daemon counts as alive, itself included."""
        return {n["node"] for n in self.client.cluster_nodes() if n["alive"]}

    def __repr__(self) -> str:
        return f"Host({self.index}, {self.address})"


class Hosts:
    """N isolated hosts, one shoal daemon each, in one cluster (every node `access =
    "network"`); `hosts[i]` is a `Host`. A context manager: `close()` stops the daemons
    (each must exit with 0 unless the test killed it), the agents and the namespaces.

    `burst`: hosts whose daemon gets a burst buffer on its private file system
    (`serve --burst`), with `durability` as its default. `same_paths`: every node's
    socket, region and key at the same paths (one identical cluster file for every host);
    by default the paths differ by node, and each host still gets its own copy of the file.
    `by_name`: peers' `rpc` addresses by host name (host<i>) instead of IP address.
    `etcd`: members of an etcd (`Etcd`, in the switch's namespace) that keeps the cluster's
    membership (`[cluster] membership`, `membership_ttl_ms`, `membership_grace_ms`): the
    file's nodes are then slots, and a node is a member from its start (a join) to its stop
    (a leave) or its lease's end; 0 (the default): the static file. Each daemon serves its
    metrics on its host's loopback (`Host.metric`). `shared_backing`: one directory of the
    test (`hosts.shared`) that every host sees at SHARED, a shared file system; each node's
    file entry names its backing store there (SHARED/n<i>) and a burst buffer on its host,
    so every node knows where the others' backing stores are (adoption: docs/cluster.md),
    each of `backing_capacity` bytes if given. `own_files` (with `etcd`): each host's file
    lists only its own node, as on hosts set up one at a time; the daemons learn the others
    from the records members publish in etcd (docs/cluster.md, "Nodes absent from the file").
    """

    def __init__(
        self,
        directory: Path,
        count: int = 3,
        *,
        heartbeat_ms: int = 200,
        lease_ms: int = 2000,
        linger_ms: int = 1000,
        region_size: str = "64MiB",
        burst: Iterable[int] = (),
        durability: str | None = None,
        same_paths: bool = False,
        by_name: bool = False,
        identities: bool = True,
        serve_args: Iterable[str] = (),
        start: bool = True,
        etcd: int = 0,
        membership_ttl_ms: int = 1000,
        membership_grace_ms: int = 0,
        shared_backing: bool = False,
        backing_capacity: str | None = None,
        own_files: bool = False,
        tls: bool = True,
    ) -> None:
        assert etcd or not own_files, "a file of one node needs a membership: etcd"
        self.directory = directory
        # Peer traffic between hosts over TLS with a CA made here, on the "operator's
        # machine"; tls=False writes insecure_cleartext = true instead.
        self.ca: Path | None = directory / "ca" if tls else None
        self.shared: Path | None = directory / "shared" if shared_backing else None
        self.backing_capacity = backing_capacity
        self.count = count
        self.heartbeat = heartbeat_ms / 1000
        self.lease = lease_ms / 1000
        self.same_paths = same_paths
        self.by_name = by_name
        self.burst = set(burst)
        self.durability = durability
        self.serve_args = list(serve_args)
        self.name = f"mh{secrets.token_hex(4)}"
        self.cluster_file = f"{RUN}/cluster.toml"
        self.hosts: list[Host] = []
        self._spawned: list[subprocess.Popen] = []
        directory.mkdir(parents=True, exist_ok=True)
        if self.shared is not None:
            self.shared.mkdir()
        self.network = Network(count, str(self.shared) if self.shared is not None else None)
        self.etcd: Etcd | None = None
        try:
            if etcd:
                self.etcd = Etcd(self.network, directory, etcd)
                self.serve_args += ["--metrics-addr", METRICS]
            self.membership_ttl_ms = membership_ttl_ms
            self.membership_grace_ms = membership_grace_ms
            self.hosts = [Host(self, i) for i in range(count)]
            for host in self.hosts:
                host.run("mkdir", "-p", "-m", "700", RUN)
            header, tables = self._cluster_text(heartbeat_ms, lease_ms, linger_ms, region_size, identities)
            text = header + "".join(tables)
            for i, host in enumerate(self.hosts):  # a copy per host: no file system is shared
                host.write(self.cluster_file, header + tables[i] if own_files else text)
            (directory / "cluster.toml").write_text(text)  # for the reader of a failure
            if start:
                for i in range(count):
                    self.start(i, wait=False)
                self.wait_whole(STARTUP)
        except BaseException:
            self.close(check=False)
            raise

    def path(self, what: str, node: int) -> str:
        """Where node `node` keeps `what` (socket, region, key) on its host."""
        suffix = "" if self.same_paths else f"-n{node}"
        return {
            "socket": f"{RUN}/shoal{suffix}.sock",
            "region": f"/dev/shm/shoal-{self.name}{suffix}",
            "key": f"{RUN}/node{suffix}.key",
            "cert": f"{RUN}/node{suffix}.crt",
            "tls": f"{RUN}/node{suffix}.tls",
        }[what]

    def _cluster_text(
        self, heartbeat_ms: int, lease_ms: int, linger_ms: int, region_size: str, identities: bool
    ) -> tuple[str, list[str]]:
        """The cluster file's `[cluster]` table and each node's `[[node]]` table; each host
        makes its own key pair and only its public key leaves it."""
        lines = [
            "[cluster]",
            f'name = "{self.name}"',
            f'token = "{secrets.token_hex(16)}"',
            f"heartbeat_ms = {heartbeat_ms}",
            f"lease_ms = {lease_ms}",
            f"linger_ms = {linger_ms}",
        ]
        if self.ca is not None:
            shoal_ok("cluster", "ca", "--out", str(self.ca))
            lines += [f'tls_ca = "{RUN}/ca.crt"', f'tls_crl = "{RUN}/revoked.crl"']
        else:
            lines.append("insecure_cleartext = true")
        if self.etcd is not None:
            lines += [
                f'membership = "{self.etcd.url(f"shoal/{self.name}")}"',
                f"membership_ttl_ms = {self.membership_ttl_ms}",
                f"membership_grace_ms = {self.membership_grace_ms}",
            ]
        header = "\n".join(lines) + "\n"
        tables = []
        for i, host in enumerate(self.hosts):
            lines = [
                "",
                "[[node]]",
                f"id = {i}",
                f'rpc = "{Network.name(i) if self.by_name else host.address}:{RPC_PORT}"',
                f'socket = "{self.path("socket", i)}"',
                f'region = "{self.path("region", i)}"',
                f'region_size = "{region_size}"',
                'access = "network"',
            ]
            if self.shared is not None:
                lines += [f'burst = "{BURST}"', f'backing = "{SHARED}/n{i}"']
                if self.backing_capacity:
                    lines.append(f'backing_capacity = "{self.backing_capacity}"')
            if identities:
                done = host.run(
                    sys.executable, "-m", "shoal", "cluster", "keygen", "--out", self.path("key", i)
                )
                assert done["returncode"] == 0, done["stderr"]
                lines += done["stdout"].strip().splitlines()  # public_key = ..., key_file = ...
            if self.ca is not None:
                lines += self._certificate(i, host, lines)
            tables.append("\n".join(lines) + "\n")
        return header, tables

    def _certificate(self, i: int, host: Host, lines: list[str]) -> list[str]:
        """Node `i`'s TLS certificate, issued here for the public key its host sent, copied
        to the host with the CA's certificate and the revocation list; its `tls_cert`/`tls_key`
        lines."""
        assert self.ca is not None
        key = next((line.split('"')[1] for line in lines if line.startswith("public_key")), None)
        out = self.issue_certificate(self.ca, i, key, self.directory / f"n{i}")
        if not (self.ca / "revoked.crl").exists():
            self._crl()  # the list every host reads, empty for now
        host.write(f"{RUN}/revoked.crl", (self.ca / "revoked.crl").read_text(), mode=0o644)
        self.install_certificate(i, self.ca, out)
        return [f'tls_cert = "{self.path("cert", i)}"', f'tls_key = "{self.path("tls", i)}"']

    @staticmethod
    def issue_certificate(ca: Path, node: int, public_key: str | None, out: Path) -> Path:
        """Node `node`'s certificate (bound to `public_key` if given) from the CA in `ca`,
        written here as `out`.crt and `out`.tls; returns `out`."""
        key = ["--public-key", public_key] if public_key else []
        shoal_ok("cluster", "cert", "--ca", str(ca), "--node", str(node), *key, "--out", str(out))
        return out

    def install_certificate(self, node: int, ca: Path, out: Path) -> None:
        """Gives node `node`'s host the certificate `out`.crt (and its key) and the CA
        certificate of `ca` to trust, at the paths its cluster file names."""
        host = self.hosts[node]
        host.write(f"{RUN}/ca.crt", (ca / "ca.crt").read_text(), mode=0o644)
        host.write(self.path("cert", node), out.with_suffix(".crt").read_text(), mode=0o644)
        host.write(self.path("tls", node), out.with_suffix(".tls").read_text())

    def _crl(self, cert: Path | None = None) -> None:
        """Writes the cluster's revocation list here, with `cert` added to it."""
        assert self.ca is not None, "a cluster without TLS"
        added = ["--cert", str(cert)] if cert is not None else []
        shoal_ok("cluster", "revoke", "--ca", str(self.ca), "--crl", str(self.ca / "revoked.crl"), *added)

    def revoke(self, node: int) -> None:
        """Revokes node `node`'s certificate and copies the list to every host (renamed into
        place: nodes read it again within a second)."""
        self._crl(self.directory / f"n{node}.crt")
        for host in self.hosts:
            host.write(f"{RUN}/revoked.crl.new", (self.ca / "revoked.crl").read_text(), mode=0o644)
            assert host.run("mv", f"{RUN}/revoked.crl.new", f"{RUN}/revoked.crl")["returncode"] == 0

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, host: int) -> Host:
        return self.hosts[host]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return self.count

    # -- daemons -------------------------------------------------------------------------------

    def start(self, host: int, wait: bool = True, timeout: float = STARTUP) -> None:
        """Starts host `host`'s daemon (again, after `kill`: same cluster file and burst
        directory); with `wait`, returns once it serves and sees every node it can reach."""
        h = self.hosts[host]
        assert h.daemon is None or h.daemon.poll() is not None, f"host {host}'s daemon runs"
        tiers = ["--burst", BURST, *(["--durability", self.durability] if self.durability else [])]
        command = [
            *(sys.executable, "-m", "shoal", "serve", "--cluster", self.cluster_file, "--node", str(host)),
            *(tiers if host in self.burst else []),
            *self.serve_args,
        ]
        env = dict(os.environ, NO_COLOR="1")
        env.pop("SHOAL_SOCKET", None)
        with open(h.daemon_log, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            h.daemon = subprocess.Popen(
                [*self.network.enter(host), *_dies_with_us(command)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
            )  # fmt: skip
        h.killed = h.stopped = False
        if wait:
            self.wait_serving(host, timeout)
            reachable = self.running() - set(self.network.down)
            if host not in self.network.down:
                wait_for(
                    lambda: h.sees() >= reachable,
                    timeout,
                    interval=0.05,
                    message=f"host {host} seeing {sorted(reachable)}",
                )

    def wait_serving(self, host: int, timeout: float = STARTUP) -> None:
        h = self.hosts[host]

        def serving() -> bool:
            assert h.daemon is not None
            if h.daemon.poll() is not None:
                raise AssertionError(f"host {host}'s daemon exited with {h.daemon.returncode}:\n{h.log()}")
            return h.serving()

        wait_for(serving, timeout, interval=0.05, message=f"host {host}'s daemon serving")
        h.agent.request(op="reconnect")  # a client of the daemon it ran before is gone

    def dead(self) -> set[int]:
        return {h.index for h in self.hosts if h.killed or h.stopped}

    def running(self) -> set[int]:
        """The hosts whose daemon was started and is neither killed nor stopped."""
        return {h.index for h in self.hosts if h.daemon is not None} - self.dead()

    def wait_whole(self, timeout: float = STARTUP) -> None:
        """Until every running host serves and sees every other one."""
        everyone = self.running()
        for i in sorted(everyone):
            self.wait_serving(i, timeout)
        wait_for(
            lambda: all(self.hosts[i].sees() == everyone for i in everyone),
            timeout,
            interval=0.05,
            message="every host seeing every host",
        )

    def spawn(self, host: int, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts a program on host `host` (a service beside its daemon: a coordinator, a
        worker); its output goes to a log beside the host's. Killed at `close` if it runs."""
        h = self.hosts[host]
        with open(h.directory / f"{Path(argv[0]).name}-{len(self._spawned)}.log", "ab") as log:
            process = subprocess.Popen(
                [*self.network.enter(host), *_dies_with_us(list(argv))],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True,
            )  # fmt: skip
        self._spawned.append(process)
        return process

    def signal(self, host: int, signum: int) -> None:
        daemon = self.hosts[host].daemon
        assert daemon is not None and daemon.poll() is None, f"host {host}'s daemon is not running"
        os.kill(daemon.pid, signum)

    def kill(self, host: int) -> None:
        """SIGKILL host `host`'s daemon (the host lives on: its files, its agent)."""
        h = self.hosts[host]
        self.signal(host, signal.SIGKILL)
        assert h.daemon is not None
        h.daemon.wait(10)
        h.killed, h.stopped = True, False

    def terminate(self, host: int, timeout: float) -> int | None:
        """SIGTERM host `host`'s daemon: its exit code, or None if it still runs after
        `timeout` s (then it is killed)."""
        h = self.hosts[host]
        self.signal(host, signal.SIGTERM)
        assert h.daemon is not None
        try:
            return h.daemon.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(host)
            return None
        finally:
            h.killed = True  # not running: nothing for `close` to stop

    def stop(self, host: int) -> None:
        """SIGSTOP host `host`'s daemon: it holds its connections and answers nothing. Its
        agent's client would wait for it: do not use it until `resume`."""
        self.signal(host, signal.SIGSTOP)
        self.hosts[host].stopped = True

    def resume(self, host: int) -> None:
        self.signal(host, signal.SIGCONT)
        self.hosts[host].stopped = False

    def cut(self, host: int, how: str = "link") -> None:
        self.network.cut(host, how)

    def heal(self, host: int | None = None) -> None:
        self.network.heal(host)

    # -- teardown ------------------------------------------------------------------------------

    def _stray(self) -> list[int]:
        """Processes still in our hosts' network namespaces (ours ended: none should be)."""
        ours, stray = self.network.namespaces(), []
        holders = {self.network.switch, *self.network.hosts}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in holders:
                try:
                    if os.readlink(f"/proc/{entry}/ns/net") in ours:
                        stray.append(int(entry))
                except OSError:
                    continue
        return stray

    def close(self, check: bool = True) -> None:
        """Stops every daemon (SIGTERM: each must exit with 0, no panic during the test, unless
        the test killed it), every agent, then the namespaces (their mounts go with them)."""
        failures = []
        if hasattr(self.network, "hosts"):
            # A daemon does not stop while a peer it knows neither answers nor refuses
            # (test_defect_a_daemon_stops_while_a_peer_is_cut_off): reconnect first.
            self.network.heal()
        for h in self.hosts:
            daemon = h.daemon
            if daemon is None:
                continue
            if daemon.poll() is None:
                if h.stopped:
                    os.kill(daemon.pid, signal.SIGCONT)
                daemon.send_signal(signal.SIGTERM)
                try:
                    code = daemon.wait(15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    code = daemon.wait(10)
                    failures.append(f"host {h.index}'s daemon ignored SIGTERM for 15 s")
                if code != 0:
                    failures.append(f"host {h.index}'s daemon exited with {code}:\n{h.log()[-4000:]}")
            elif not h.killed:
                failures.append(f"host {h.index}'s daemon died ({daemon.returncode}):\n{h.log()[-4000:]}")
        for process in self._spawned:
            if process.poll() is None:
                process.kill()
            process.wait(10)
        if self.etcd is not None:  # after the daemons: each leaves the membership as it stops
            self.etcd.close()
        for h in self.hosts:
            h.agent.close()
        stray = self._stray() if hasattr(self.network, "hosts") else []
        for pid in stray:  # started by us inside our namespaces; gone with them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.network.close()
        if check:
            assert not stray, f"processes left in the hosts' namespaces: {stray}"
            assert not failures, "\n".join(failures)
