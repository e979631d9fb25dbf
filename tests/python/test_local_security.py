"""Local security (docs/security.md): another user of the host cannot impersonate a
store, redirect its logs, or get `cluster down` to kill its processes.

The multi-user tests need root, to make entries another user owns and to run that
user's processes (`nobody`, else a user made with `useradd`); elsewhere they skip and
say so. The attackers run the system Python (`-I`), which needs nothing of this tree.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _shoal_testing import PROTOCOL_VERSION, Daemon, shoal_command, short_dir, wait_for

import shoal

SYSTEM_PYTHON = "/usr/bin/python3"
OTHER_USER = "shoal-test-other"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def other_uid() -> int:
    """A uid of another, unprivileged user (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only root can make a directory another user owns or run a process as them")
    for name in ("nobody", OTHER_USER):
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            pass
    made = subprocess.run(["useradd", "--system", "--no-create-home", OTHER_USER], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no user `nobody` and useradd failed: {made.stderr.decode(errors='replace')}")
    return pwd.getpwnam(OTHER_USER).pw_uid


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory both users can reach (short paths: sockets), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="shoal-sec-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as_user(uid: int, code: str, timeout: float = 20) -> subprocess.Popen:
    """Runs `code` as `uid` under the system Python, stdout piped."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to run another user's process")
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-I", "-c", textwrap.dedent(code)],
        user=uid,
        group=pwd.getpwuid(uid).pw_gid,
        extra_groups=[],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# --- 1. squatted socket directories and daemons of other users --------------------


def test_a_socket_directory_another_user_made_is_refused(other_uid, shared_dir):
    # The attacker made the directory (as it would /tmp/shoal-<victim uid>) and opened it up.
    squatted = shared_dir / "shoal-squatted"
    squatted.mkdir()
    os.chown(squatted, other_uid, -1)
    squatted.chmod(0o777)
    socket = squatted / "default.sock"
    with pytest.raises(shoal.ShoalError) as refused:
        shoal.connect(str(socket), start=True)
    assert isinstance(refused.value, PermissionError), refused.value
    assert f"owned by uid {other_uid}" in str(refused.value)
    assert sorted(os.listdir(squatted)) == [], "nothing may be created in it"
    # `shoal serve` refuses it too.
    served = shoal_command("serve", "--socket", str(socket), "--capacity", "8MiB", timeout=30)
    assert served.returncode != 0 and f"owned by uid {other_uid}" in served.stderr, served.stderr
    assert sorted(os.listdir(squatted)) == []


def test_a_daemon_another_user_runs_is_refused(other_uid, shared_dir, monkeypatch):
    """The issue's attack: another user squats the directory, listens on the socket and
    opens it to all; the victim's client must not send it a byte."""
    squatted = shared_dir / "shoal-squatted"
    squatted.mkdir()
    os.chown(squatted, other_uid, -1)
    socket = squatted / "default.sock"
    impostor = _as_user(
        other_uid,
        f"""
        import os, socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.bind({str(socket)!r})
        os.chmod({str(socket)!r}, 0o666)
        s.listen(8)
        print("ready", flush=True)
        s.settimeout(10)
        for _ in range(2):  # the victim's two connects
            c, _ = s.accept()
            c.settimeout(2)
            try:
                data = c.recv(4096)
            except OSError:
                data = b""
            print("received", len(data), flush=True)
            c.close()
        """,
    )
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline().strip() == "ready", (
            impostor.stderr.read() if impostor.stderr else ""
        )
        with pytest.raises(shoal.ShoalError) as refused:
            shoal.connect(str(socket))
        assert isinstance(refused.value, PermissionError), refused.value
        assert f"uid {other_uid}" in str(refused.value)
        # Through the default socket ($SHOAL_SOCKET) too: refused, no embedded start.
        monkeypatch.setenv("SHOAL_SOCKET", str(socket))
        with pytest.raises(shoal.ShoalError) as refused:
            shoal.connect()
        assert isinstance(refused.value, PermissionError), refused.value
        output, err = impostor.communicate(timeout=30)
    finally:
        impostor.kill()
        impostor.wait()
    received = [int(line.split()[1]) for line in output.splitlines() if line.startswith("received")]
    assert received == [0, 0], f"the impostor got data: {output} {err}"


HANDSHAKE = """
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket!r})
s.settimeout(5)
try:
    s.sendall(struct.pack("<IHHII", 8, 1, 0, {version}, 1))  # Hello
except OSError:
    pass  # refused and closed before our Hello
try:
    data = s.recv(65536)
except TimeoutError:
    print("timeout", flush=True)
    sys.exit(0)
if len(data) >= 8:
    length, opcode = struct.unpack_from("<IH", data)
    print(hex(opcode), data[8:].decode(errors="replace"), flush=True)
else:
    print("closed", flush=True)
"""


def test_the_daemon_refuses_clients_of_other_users(other_uid, shared_dir):
    ours = Daemon(shared_dir / "ours", capacity="8MiB")
    try:
        Path(ours.socket).chmod(0o666)  # the file mode alone would let them in
        refused = _as_user(other_uid, HANDSHAKE.format(socket=ours.socket, version=PROTOCOL_VERSION))
        out, err = refused.communicate(timeout=30)
        # 0x81: an Error frame, naming the refused uid.
        assert out.startswith("0x81") and f"uid {other_uid}" in out, out + err
        assert "client refused" in ours.log()
        # Our own clients are served as before.
        ours.client().close()
    finally:
        assert ours.stop() == 0


def test_the_daemon_serves_users_it_is_told_to_allow(other_uid, shared_dir):
    allowing = Daemon(shared_dir / "allowing", capacity="8MiB", args=["--allow-uid", str(other_uid)])
    try:
        Path(allowing.socket).chmod(0o666)
        admitted = _as_user(other_uid, HANDSHAKE.format(socket=allowing.socket, version=PROTOCOL_VERSION))
        out, err = admitted.communicate(timeout=30)
        assert out.startswith("0x82"), out + err  # Welcome
    finally:
        assert allowing.stop() == 0


def test_the_default_socket_prefers_a_trusted_runtime_directory(tmp_path):
    def default_socket(runtime: Path | None) -> str:
        env = dict(os.environ)
        env.pop("XDG_RUNTIME_DIR", None)
        if runtime is not None:
            env["XDG_RUNTIME_DIR"] = str(runtime)
        code = "from shoal import _internal; print(_internal.default_socket())"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    fallback = f"/tmp/shoal-{os.geteuid()}/default.sock"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    assert default_socket(runtime) == str(runtime / "shoal" / "default.sock")
    assert default_socket(None) == fallback
    runtime.chmod(0o777)  # not trusted: others could plant entries
    assert default_socket(runtime) == fallback
    assert default_socket(Path("relative")) == fallback


# --- 2. planted log symlinks -------------------------------------------------------


def test_the_embedded_start_never_follows_a_planted_log_symlink(tmp_path):
    directory = short_dir(tmp_path) / "embedded"
    directory.mkdir(mode=0o700)
    precious = tmp_path / "precious.txt"
    precious.write_text("the victim's file\n")
    socket = directory / "default.sock"
    (directory / "default.sock.log").symlink_to(precious)
    with pytest.raises(shoal.ShoalError) as refused:
        shoal.connect(str(socket), start=True)
    assert isinstance(refused.value, PermissionError), refused.value
    assert "symbolic link" in str(refused.value)
    assert precious.read_text() == "the victim's file\n"
    assert not socket.exists()


def test_the_daemon_never_creates_its_lock_through_a_planted_link(tmp_path):
    directory = short_dir(tmp_path) / "locked"
    directory.mkdir(mode=0o700)
    target = tmp_path / "created-through-the-link"
    (directory / "x.sock.lock").symlink_to(target)
    served = shoal_command(
        "serve", "--socket", str(directory / "x.sock"), "--capacity", "8MiB", "--no-prefault",
        "--idle-exit", "0.2",
    )  # fmt: skip
    assert served.returncode != 0, served.stderr
    assert not target.exists()


# --- 7. modes of what the daemon and the embedded start create ----------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common umask, under which the old code made 0755 directories and 0644 logs."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_daemon_creates_its_socket_directory_owner_only(tmp_path, umask_022):
    nested = short_dir(tmp_path) / "made-by-daemon" / "x.sock"
    served = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "serve",
            "--socket",
            str(nested),
            "--capacity",
            "8MiB",
            "--no-prefault",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(nested.exists, timeout=15, message="the daemon's socket")
        assert _mode(nested.parent) == 0o700
        assert _mode(nested) == 0o600
    finally:
        served.terminate()
        assert served.wait(15) == 0


def test_the_embedded_start_creates_its_directory_and_log_owner_only(tmp_path, umask_022):
    socket = short_dir(tmp_path) / "emb" / "default.sock"
    client = shoal.connect(str(socket), start=True)
    client.close()
    assert _mode(socket.parent) == 0o700
    log = Path(str(socket) + ".log")
    assert _mode(log) == 0o600
    wait_for(lambda: not socket.exists(), timeout=15, message="the embedded daemon's idle exit")


def test_cluster_up_creates_its_directory_and_logs_owner_only(tmp_path, umask_022):
    directory = short_dir(tmp_path) / "c"
    up = shoal_command("cluster", "up", "--nodes", "1", "--dir", str(directory), "--capacity", "8MiB",
                       "--name", f"sec{os.getpid()}")  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert _mode(directory) == 0o700
        assert _mode(directory / "n0.log") == 0o600
        assert _mode(directory / "cluster.toml") == 0o600
        # Per-node identities (issue 15 item 8): a private key per node, its
        # public half in the cluster file.
        assert _mode(directory / "n0.key") == 0o600
        assert "public_key = " in (directory / "cluster.toml").read_text()
        status = shoal_command("cluster", "status", "--dir", str(directory), "--json")
        assert status.returncode == 0 and '"up"' in status.stdout, status.stderr + status.stdout
    finally:
        down = shoal_command("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
    assert not (directory / "n0.key").exists(), "cluster down removes the node keys"


def test_cluster_keygen_writes_a_private_key_and_prints_its_public_half(tmp_path):
    key = tmp_path / "node.key"
    made = shoal_command("cluster", "keygen", "--out", str(key))
    assert made.returncode == 0, made.stderr
    assert _mode(key) == 0o600
    assert len(key.read_text().strip()) == 64
    line = made.stdout.splitlines()[0]
    assert line.startswith('public_key = "') and len(line) == len('public_key = ""') + 64, line
    again = shoal_command("cluster", "keygen", "--out", str(key))
    assert again.returncode != 0, "an existing key is never overwritten"


# --- 5. cluster down signals only its own nodes ------------------------------------


def test_cluster_down_spares_processes_that_planted_or_stale_pid_files_name(tmp_path):
    directory = short_dir(tmp_path) / "c"
    up = shoal_command("cluster", "up", "--nodes", "1", "--dir", str(directory), "--capacity", "8MiB",
                       "--name", f"pid{os.getpid()}")  # fmt: skip
    assert up.returncode == 0, up.stderr + up.stdout
    node = int((directory / "n0.pid").read_text())
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        # Planted: a pid file for a node that does not exist, naming an unrelated process.
        (directory / "n5.pid").write_text(str(bystander.pid))
        down = shoal_command("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        assert f"not stopping pid {bystander.pid}" in down.stderr, down.stderr
        assert "stopped 1 daemons" in down.stdout, down.stdout
        assert bystander.poll() is None, "cluster down killed an unrelated process"
        wait_for(lambda: not os.path.exists(f"/proc/{node}"), timeout=15, message="node 0 to stop")
        # Stale: node 0's pid file left behind, its number now someone else's.
        (directory / "n0.pid").write_text(str(bystander.pid))
        down = shoal_command("cluster", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        time.sleep(0.2)
        assert bystander.poll() is None, "cluster down killed an unrelated process"
    finally:
        bystander.kill()
        bystander.wait()


def test_cluster_down_refuses_a_directory_others_can_write(tmp_path):
    directory = short_dir(tmp_path) / "open"
    directory.mkdir()
    directory.chmod(0o777)
    down = shoal_command("cluster", "down", "--dir", str(directory))
    assert down.returncode != 0 and "writable by other users" in down.stderr, down.stderr
