"""shoal.connect(): the embedded daemon started on demand, shared, and gone when idle."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from _shoal_testing import MiB, region_files_in_log, short_dir, wait_for

import shoal


def daemons_serving(socket: str) -> list[int]:
    """Pids of processes whose command line names this (unique) socket."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and socket.encode() in argv:
            pids.append(int(entry))
    return pids


@pytest.fixture
def embedded_socket(tmp_path: Path, monkeypatch) -> str:
    """$SHOAL_SOCKET for this test, in a directory that does not exist yet."""
    socket = str(short_dir(tmp_path) / "embedded" / "shoal.sock")
    monkeypatch.setenv("SHOAL_SOCKET", socket)
    yield socket
    leftovers = daemons_serving(socket)
    for pid in leftovers:  # only if a test failed: never leave a daemon behind
        os.kill(pid, signal.SIGTERM)
    if leftovers:
        wait_for(lambda: not daemons_serving(socket), timeout=10)
    log = Path(socket + ".log")
    regions = region_files_in_log(log.read_text(errors="replace")) if log.exists() else []
    for region in regions:
        if os.path.exists(region):
            os.unlink(region)
    assert not leftovers, f"embedded daemon(s) {leftovers} still running"
    assert not [r for r in regions if os.path.exists(r)], "an embedded daemon left its region behind"


def test_connect_starts_a_shared_daemon_that_exits_when_idle(embedded_socket, python):
    assert not os.path.exists(embedded_socket)
    client = shoal.connect(capacity="64MiB")
    assert os.path.exists(embedded_socket)
    assert client.socket == embedded_socket
    assert client.capacity == 64 * MiB
    assert len(daemons_serving(embedded_socket)) == 1
    oid = client.put(pa.table({"x": [1, 2, 3]}))

    # A second process finds the same daemon through $SHOAL_SOCKET (it would otherwise
    # start a 1 GiB one) and sees the object.
    report = python(
        """
        client = shoal.connect()
        table = client.get(bytes.fromhex(sys.argv[1]), timeout_ms=5000)
        emit({"socket": client.socket, "capacity": client.capacity,
              "clients": client.stats()["clients"], "x": table.column("x").to_pylist()})
        """,
        oid.hex(),
    )
    assert report == {"socket": embedded_socket, "capacity": 64 * MiB, "clients": 2, "x": [1, 2, 3]}
    assert len(daemons_serving(embedded_socket)) == 1

    # While a client is connected the daemon stays, however long it idles.
    time.sleep(1.5)
    assert os.path.exists(embedded_socket)
    assert client.get(oid).column("x").to_pylist() == [1, 2, 3]

    client.close()
    start = time.monotonic()
    wait_for(lambda: not os.path.exists(embedded_socket), timeout=5, message="the idle daemon to exit")
    wait_for(lambda: not daemons_serving(embedded_socket), timeout=5)
    assert time.monotonic() - start < 5
    assert not os.path.exists(embedded_socket + ".lock")
    log = Path(embedded_socket + ".log").read_text(errors="replace")
    assert "no clients" in log
    with pytest.raises(shoal.Disconnected):
        shoal.Client(embedded_socket)


def test_connect_reuses_a_running_daemon(store, monkeypatch):
    monkeypatch.setenv("SHOAL_SOCKET", store.socket)
    client = shoal.connect(capacity="1GiB")  # ignored: the daemon exists
    assert client.socket == store.socket
    assert client.capacity == 64 * MiB
    assert daemons_serving(store.socket) == [store.pid]
    client.close()


def test_processes_racing_to_start_share_one_daemon(embedded_socket, spawn):
    code = """
    emit("ready")
    sys.stdin.readline()
    client = shoal.connect(capacity="64MiB")
    me = int(sys.argv[1])
    client.put(f"racer {me}".encode(), hashlib.sha1(str(me).encode()).digest())
    ids = [hashlib.sha1(str(p).encode()).digest() for p in range(3)]
    found = [None if v is None else v.to_pybytes().decode() for v in client.get(ids, timeout_ms=20_000)]
    emit(found)
    sys.stdin.readline()
    client.close()
    """
    racers = [spawn(code, str(p)) for p in range(3)]
    for racer in racers:
        assert racer.json() == "ready"
    for racer in racers:
        racer.send("go")
    for racer in racers:
        assert racer.json() == ["racer 0", "racer 1", "racer 2"]
    wait_for(lambda: len(daemons_serving(embedded_socket)) == 1, timeout=5, message="losers to exit")
    for racer in racers:
        racer.send("done")
        racer.finish()
    wait_for(lambda: not os.path.exists(embedded_socket), timeout=5, message="the idle daemon to exit")
    wait_for(lambda: not daemons_serving(embedded_socket), timeout=5)


def test_connect_to_explicit_missing_socket_raises_disconnected(tmp_path, monkeypatch):
    monkeypatch.delenv("SHOAL_SOCKET", raising=False)
    missing = str(short_dir(tmp_path) / "nobody-here.sock")
    with pytest.raises(shoal.Disconnected) as info:
        shoal.connect(missing)
    assert isinstance(info.value, ConnectionError)
    assert missing in str(info.value)
    with pytest.raises(ConnectionError):
        shoal.Client(missing)
    assert not os.path.exists(missing)  # and nothing was started there
    assert not daemons_serving(missing)


def test_connect_explicit_socket_with_start(embedded_socket, monkeypatch):
    monkeypatch.delenv("SHOAL_SOCKET")  # the path comes from the argument alone
    client = shoal.connect(embedded_socket, capacity=32 * MiB, start=True)
    assert client.socket == embedded_socket
    assert client.capacity == 32 * MiB
    assert client.get(client.put(b"x")).to_pybytes() == b"x"
    client.close()
    wait_for(lambda: not os.path.exists(embedded_socket), timeout=5, message="the idle daemon to exit")
    wait_for(lambda: not daemons_serving(embedded_socket), timeout=5)


def test_default_socket_follows_environment(monkeypatch):
    monkeypatch.setenv("SHOAL_SOCKET", "/tmp/somewhere/else.sock")
    from shoal import _embedded

    assert _embedded.default_socket() == "/tmp/somewhere/else.sock"
    monkeypatch.delenv("SHOAL_SOCKET")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)  # else $XDG_RUNTIME_DIR/shoal/
    assert _embedded.default_socket() == f"/tmp/shoal-{os.getuid()}/default.sock"
