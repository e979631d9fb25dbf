"""shoal.ray on two isolated hosts of the multi-host harness (tests/python/multihost.py): a
Ray head on host 0 and a Ray worker node on host 1 (`ray start`, each in its host's
namespaces), each Ray node's workers clients of their own host's shoal daemon, the two
daemons one shoal cluster (network mode: neither maps the other's memory).

Checked: each Ray node reaches its own host's shoal node and `node_map` pairs them; a
table put on host 1 and read on host 0 equals Ray's own path (`ray.put` there, `ray.get`
here), and the shoal value's columns lie in host 0's store (host 0's daemon pulled it); a
durable value put on host 1 is read by name on host 0; `locality` sends tasks to host 1.
The driver (multihost_ray_driver.py) runs on host 0: the test's process cannot reach the
hosts' network. Skipped, with the reason, where namespaces cannot be made or Ray is missing.

Ray 2.60's `ray start --head` turns on token authentication and keeps the token in
~/.ray/auth_token, which every emulated host shares with the real machine (the home
directory is not one of a host's private mounts): the test runs Ray with
RAY_AUTH_MODE=disabled rather than write a token there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from multihost import Network, until

pytest.importorskip(
    "ray", reason="no ray: scripts/setup-test-tools.sh installs it (pip install 'shoal[ray]')"
)
psutil = pytest.importorskip("psutil", reason="no psutil (a dependency of ray)")

# Two Ray nodes start on the 2-core machine: not beside other tests (conftest.py).
pytestmark = pytest.mark.alone

DRIVER = str(Path(__file__).with_name("multihost_ray_driver.py"))
RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6379
ROWS = 4 << 20  # two 8-byte columns: a 64 MiB table
RAY_STORE = 100 << 20  # plasma's bytes per node (Ray's minimum is 75 MiB): a host's /dev/shm is 512 MiB


def ray_start(hosts: Any, host: int, *args: str) -> subprocess.Popen:
    """`ray start --block` on `host`, its workers clients of that host's shoal daemon."""
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_SOCKET"}
    env.update(SHOAL_SOCKET=hosts.path("socket", host), RAY_AUTH_MODE="disabled")
    return hosts.spawn(
        host,
        *(RAY, "start", "--block", "--node-ip-address", Network.address(host), "--num-cpus", "1"),
        *("--object-store-memory", str(RAY_STORE), "--disable-usage-stats", *args),
        env=env,
    )


def stop(processes: list[subprocess.Popen]) -> None:
    """Ends every `ray start` and what it started (GCS, raylet, workers, agents): the whole
    tree, taken before any of it dies (a dying raylet's workers would be reparented), then
    SIGKILL. Ray's own `ray stop` would stop every Ray process of the machine."""
    tree = []
    for process in processes:
        try:
            root = psutil.Process(process.pid)
            tree += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=15)


def test_ray_nodes_on_two_hosts_read_each_others_values_through_shoal(make_hosts: Any) -> None:
    if not Path(RAY).exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    hosts = make_hosts(2, region_size="256MiB")
    started = [ray_start(hosts, 0, "--head", "--port", str(PORT), "--include-dashboard", "false")]
    try:
        head_log = next(Path(hosts[0].directory).glob("ray-*.log"))
        try:
            until(
                lambda: "Ray runtime started" in head_log.read_text(errors="replace"),
                60,
                "Ray's head started",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}; its log:\n{head_log.read_text(errors='replace')[-4000:]}") from None
        started.append(ray_start(hosts, 1, "--address", f"{Network.address(0)}:{PORT}"))
        done = hosts[0].run(
            sys.executable,
            DRIVER,
            f"{Network.address(0)}:{PORT}",
            hosts.path("socket", 0),
            str(ROWS),
            timeout=240,
        )
        assert done["returncode"] == 0, done["stderr"][-6000:]
        out = json.loads(done["stdout"].strip().splitlines()[-1])
    finally:
        stop(started)

    # Each Ray node on its own host, its workers on that host's shoal node.
    assert [(w["host"], w["shoal_node"]) for w in out["where"]] == [("host0", 0), ("host1", 1)]
    assert out["node_map"] == [[True, 0], [False, 1]]

    # Put on host 1, read on host 0: equal to Ray's own path, pulled into host 0's store.
    handoff = out["handoff"]
    assert out["ref_node"] == 1 and handoff["host"] == "host0"
    assert handoff["equal"], handoff
    assert handoff["sums"] == [out["expected_sums"]] * 2
    assert handoff["in_store"], handoff
    assert handoff["durable_equal"]

    assert out["locality_node_is_host1"] and out["locality_hosts"] == ["host1"] * 3
    print(
        f"\n64 MiB table host1 -> host0: shoal.ray.get {handoff['shoal_get_s'] * 1e3:.0f} ms, "
        f"ray.get {handoff['ray_get_s'] * 1e3:.0f} ms (first gets)"
    )
