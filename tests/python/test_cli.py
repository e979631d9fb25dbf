"""The command line: python -m shoal {serve, stat, ls, --help}."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _shoal_testing import ANSI, Daemon, MiB, shoal_command, short_dir, wait_for

import shoal


def test_help():
    result = shoal_command("--help")
    assert result.returncode == 0, result.stderr
    for command in ("serve", "stat", "ls"):
        assert command in result.stdout
    serve = shoal_command("serve", "--help")
    assert serve.returncode == 0
    for option in ("--socket", "--capacity", "--idle-exit", "--line-size", "--no-prefault"):
        assert option in serve.stdout


def test_version():
    result = shoal_command("--version")
    assert result.returncode == 0
    assert shoal.__version__ in result.stdout


def test_a_binding_without_the_command_line_runs_shoal_bin(tmp_path):
    """An extension built without its `cli` feature (py -> client -> core only) has no
    `cli_main`: the `shoal` script then runs $SHOAL_BIN, or says how to get one."""
    without_cli = "import shoal._internal as i; del i.cli_main; import shoal._cli as c; c.main()"
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SHOAL_BIN", None)
    refused = subprocess.run(
        [sys.executable, "-c", without_cli, "--version"], capture_output=True, text=True, env=env
    )
    assert refused.returncode == 1
    assert "SHOAL_BIN" in refused.stderr and "cli" in refused.stderr
    echo = tmp_path / "shoal"
    echo.write_text('#!/bin/sh\necho ran "$@"\n')
    echo.chmod(0o755)
    ran = subprocess.run(
        [sys.executable, "-c", without_cli, "stat", "--json"],
        capture_output=True,
        text=True,
        env=dict(env, SHOAL_BIN=str(echo)),
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ran stat --json"


@pytest.mark.parametrize(
    ("feature", "command", "needed_for"),
    [
        ("s3", ["serve", "--socket", "{dir}/s.sock", "--capacity", "16MiB", "--no-prefault",
                "--backing", "s3://bucket/prefix"], "the backing store s3://bucket/prefix"),
        ("fuse", ["mount", "--socket", "{dir}/s.sock", "{dir}/mnt"], "`shoal mount`"),
        ("top", ["top", "--dir", "{dir}/no-cluster"], "`shoal top`"),
    ],
)  # fmt: skip
def test_an_optional_part_refuses_naming_its_feature_in_a_build_without_it(
    tmp_path, monkeypatch, feature, command, needed_for
):
    """The quick start's build leaves out the optional parts: what needs one exits 1 with a
    message naming the feature and how to build with it, having started nothing. In a build
    with the part (the test command's), the same command gets past that point and fails for
    want of an S3 endpoint, a daemon or a cluster instead."""
    (tmp_path / "mnt").mkdir()
    for name in ("SHOAL_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    result = shoal_command(*(part.format(dir=tmp_path) for part in command))
    assert result.returncode == 1, result.stderr
    refusal = f"shoal: {needed_for} needs the `{feature}` feature, which this build of shoal leaves out"
    if feature in shoal.features():
        assert refusal not in result.stderr
    else:
        assert refusal in result.stderr
        assert "SHOAL_FEATURES=full ./scripts/setup.sh" in result.stderr
    assert not (tmp_path / "s.sock").exists(), "nothing started"


def test_unknown_command_fails():
    result = shoal_command("frobnicate")
    assert result.returncode != 0
    assert "frobnicate" in result.stderr


def test_stat(store):
    client = store.client()
    client.put(b"x" * 1000)
    result = shoal_command("stat", "--socket", store.socket)
    assert result.returncode == 0, result.stderr
    assert store.socket in result.stdout
    assert "capacity" in result.stdout and "64.00 MiB" in result.stdout
    assert "objects     1" in result.stdout


def test_stat_json(store):
    client = store.client()
    oids = [client.put(b"x" * n) for n in (10, 100, 1000)]
    held = client.get_buffer(oids[0])
    result = shoal_command("stat", "--json", "--socket", store.socket)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["capacity"] == 64 * MiB
    assert stats["objects"] == stats["sealed"] == 3
    assert stats["referenced"] == 1
    assert stats["used"] == 64 + 128 + 1024  # data + 11 bytes of metadata, in 64-byte lines
    assert stats["clients"] == 1  # the CLI does not count itself
    assert stats["line_size"] == 64 and stats["policy"] == "lru"
    own = client.stats()
    assert stats["tiers"]["levels"] == [] and stats["tiers"]["default_durability"] == "memory"
    assert stats["controller"]["enabled"] is False  # a static store: no --elastic
    assert stats["peer_encryption"] is None  # no cluster, no peers
    extra = ("clients", "tiers", "controller", "peer_encryption")
    assert {k: v for k, v in stats.items() if k not in extra} == {
        k: v for k, v in own.items() if k != "clients"
    }
    del held


def test_ls_json(store):
    client = store.client()
    sealed = {client.put(b"x" * n): n for n in (1, 500, 70_000)}
    unsealed = shoal.ObjectID.from_random()
    buffer = client.create(unsealed, 33, metadata=b"meta")
    result = shoal_command("ls", "--json", "--socket", store.socket)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == {o.hex() for o in sealed} | {unsealed.hex()}
    for oid, size in sealed.items():
        row = by_id[oid.hex()]
        assert (row["data_size"], row["meta_size"], row["state"], row["refs"]) == (size, 11, "sealed", 0)
    assert (by_id[unsealed.hex()]["state"], by_id[unsealed.hex()]["data_size"]) == ("created", 33)
    assert by_id[unsealed.hex()]["meta_size"] == 4
    offsets = [row["offset"] for row in rows]
    assert offsets == sorted(offsets)
    del buffer


def test_ls_plain(store):
    client = store.client()
    oid = client.put(b"hello")
    result = shoal_command("ls", "--socket", store.socket)
    assert result.returncode == 0, result.stderr
    assert "ID" in result.stdout.splitlines()[0]
    assert oid.hex() in result.stdout and "sealed" in result.stdout


def test_ls_empty_store(store):
    result = shoal_command("ls", "--json", "--socket", store.socket)
    assert result.returncode == 0 and result.stdout.strip() == ""


def test_stat_without_daemon_fails_clearly(tmp_path):
    missing = str(short_dir(tmp_path) / "none.sock")
    for command in ("stat", "ls"):
        result = shoal_command(command, "--socket", missing)
        assert result.returncode != 0
        assert missing in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("capacity", ["lots", "12 parsecs", "-1G", "", "1.2.3MiB"])
def test_serve_rejects_a_bad_capacity(tmp_path, capacity):
    socket = str(short_dir(tmp_path) / "bad.sock")
    result = shoal_command("serve", "--socket", socket, f"--capacity={capacity}", "--no-prefault", timeout=15)
    assert result.returncode != 0
    assert "capacity" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(socket)


@pytest.mark.parametrize("line_size", ["100", "0", "4"])
def test_serve_rejects_a_bad_line_size(tmp_path, line_size):
    socket = str(short_dir(tmp_path) / "bad.sock")
    result = shoal_command(
        "serve", "--socket", socket, "--line-size", line_size, "--capacity", "1MiB", timeout=15
    )
    assert result.returncode != 0
    assert "line size" in result.stderr
    assert not os.path.exists(socket)


@pytest.mark.parametrize(
    ("text", "size"), [("4GiB", 4 << 30), ("1.5G", 1_500_000_000), ("3000000", 3_000_000)]
)
def test_serve_accepts_human_sizes(tmp_path, text, size):
    # Checked from the daemon's start-up log: a client would map (and fault in) it all.
    daemon = Daemon(short_dir(tmp_path) / "sizes", capacity=text, connect=False)
    try:
        log = ANSI.sub("", daemon.log())
        assert f"capacity={size}" in log, log
        assert f"region_size={size}" in log, log
        assert daemon.process.poll() is None
    finally:
        daemon.teardown()


def test_small_capacity_through_the_client(make_store):
    client = make_store(capacity="3000000").client()
    assert client.capacity == 3_000_000
    assert client.stats()["capacity"] == 3_000_000
    with pytest.raises(shoal.ObjectTooLarge):
        client.create(shoal.ObjectID.from_random(), 3_000_001)


def test_second_daemon_on_the_same_socket_refuses(store):
    result = shoal_command(
        "serve", "--socket", store.socket, "--capacity", "1MiB", "--no-prefault", timeout=15
    )
    assert result.returncode != 0
    assert "another shoal daemon" in result.stderr
    # The first one is untouched.
    client = store.client()
    assert client.get(client.put(b"still here")).to_pybytes() == b"still here"


def test_serve_runs_until_sigterm_with_clients_connected(store):
    client = store.client()
    client.put(b"x")
    assert store.stop() == 0
    assert not os.path.exists(store.socket)


def test_the_command_line_does_not_import_numpy_or_pyarrow():
    """`python -m shoal serve` is how the embedded daemon starts: keep it quick."""
    code = "import sys, shoal._cli; print(sorted({'numpy', 'pyarrow'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    # The lazy names still resolve.
    assert shoal.Client.__name__ == "Client" and shoal.Subscription.__name__ == "Subscription"
    with pytest.raises(AttributeError):
        shoal.no_such_name  # noqa: B018


def test_daemon_logs_have_no_colour_codes_when_not_a_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    socket_path = str(short_dir(tmp_path) / "s.sock")
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "shoal", "serve", "--socket", socket_path, "--capacity", "8MiB"],
            stderr=log,
            env=env,
        )
        try:
            # The socket's file appears at bind, a moment before the daemon listens.
            wait_for(lambda: _wait_for_socket(socket_path) and _connects(socket_path), timeout=10)
        finally:
            daemon.terminate()
            assert daemon.wait(timeout=10) == 0
    text = log_path.read_text()
    assert "shoal daemon serving" in text
    assert not ANSI.search(text), f"escape codes in a log file: {text[:200]!r}"


def _connects(path: str) -> bool:
    try:
        shoal.Client(path).close()
        return True
    except shoal.Disconnected:
        return False


def _wait_for_socket(path: str, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_quick_starts_cluster_example_runs():
    """`scripts/run-example.sh` runs it: three daemons, remote reads in place, a HugeTable."""
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "cluster.py")
    env = dict(os.environ, NO_COLOR="1")
    env.pop("SHOAL_SOCKET", None)
    result = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    out = result.stdout
    assert "in place: True" in out and "held by node 2: True" in out, out
    assert "300,000 rows from 3 nodes' memory" in out and out.rstrip().endswith("done: cluster stopped"), out
