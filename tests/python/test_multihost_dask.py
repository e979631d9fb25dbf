"""shoal.dask on two isolated hosts of the multi-host harness (tests/python/multihost.py):
a Dask scheduler and one `dask worker --worker-class shoal.dask.Worker` per host, each
worker a client of its own host's shoal daemon, the two daemons one shoal cluster
(network mode: neither maps the other's memory).

Checked: dataframe and array results equal stock Dask's; a large table handed from host
0's worker to host 1's crosses Dask's socket as its object id only (the `shoal` family
sees the receiver in the same shoal cluster), host 1's daemon pulls the object into a
copy in its own store, and the receiver's columns lie in that store; the same hand-off by
Dask's own path (the sender's value kept private) sends the table's bytes. The driver
(multihost_dask_driver.py) runs on host 0: the test's process cannot reach the hosts'
network. Skipped, with the reason, where namespaces cannot be made or Dask is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from multihost import Network

pytest.importorskip("distributed", reason="no dask: scripts/setup-test-tools.sh installs it")

# Times a hand-off: not beside other tests (conftest.py).
pytestmark = pytest.mark.alone

DRIVER = str(Path(__file__).with_name("multihost_dask_driver.py"))
PORT = 8786
ROWS = 4 << 20  # two 8-byte columns: a 64 MiB table


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (Dask's processes close their comms and exit), SIGKILL after 15 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def test_two_hosts_hand_off_through_their_shoal_cluster(make_hosts: Any) -> None:
    hosts = make_hosts(2, region_size="256MiB")
    scheduler = f"tcp://{Network.address(0)}:{PORT}"
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_SOCKET"}
    started = [
        hosts.spawn(
            0,
            *(sys.executable, "-m", "distributed.cli.dask_scheduler"),
            *("--host", Network.address(0), "--port", str(PORT), "--no-dashboard"),
            env=env,
        )
    ]
    try:
        for i in range(2):
            started.append(
                hosts.spawn(
                    i,
                    *(sys.executable, "-m", "distributed.cli.dask_worker", scheduler),
                    *("--host", Network.address(i), "--name", Network.name(i), "--nthreads", "1"),
                    *("--no-nanny", "--no-dashboard", "--local-directory", "/tmp/dask"),
                    *("--worker-class", "shoal.dask.Worker"),
                    env={**env, "DASK_SHOAL__SOCKET": hosts.path("socket", i)},
                )
            )
        done = hosts[0].run(sys.executable, DRIVER, scheduler, str(ROWS), timeout=240)
        assert done["returncode"] == 0, done["stderr"][-6000:]
        out = json.loads(done["stdout"].strip().splitlines()[-1])
    finally:
        for process in reversed(started):
            stop(process)

    # One worker per host, each on its own store, both in one shoal cluster.
    assert sorted(out["workers"].values()) == ["host0", "host1"]
    stores = list(out["stores"].values())
    assert stores[0]["store"] != stores[1]["store"]
    assert stores[0]["cluster"] is not None and stores[0]["cluster"] == stores[1]["cluster"]
    assert hosts.name in stores[0]["cluster"]

    assert out["results"] == {"groupby": True, "merge": True, "set_index": True, "array": True}

    table_bytes = 16 * ROWS
    ours, theirs = out["shoal"], out["dask"]
    for way in (ours, theirs):
        assert (way["sum_x"], way["sum_y"]) == (way["want_sum_x"], way["want_sum_y"])
    # Through shoal: the id crossed Dask's socket, host 1's daemon pulled the object into
    # its own store (the receiver's columns are views of it, the same id as the sender's).
    assert ours["socket_bytes"] < 64 * 1024, ours
    assert ours["sender_oid"] is not None and ours["receiver_oid"] == ours["sender_oid"], ours
    assert ours["in_store"], ours
    # Dask's own path, in the same cluster: the table's bytes through its socket; the
    # receiver put its copy in its store as a new object.
    assert theirs["sender_oid"] is None and theirs["socket_bytes"] >= table_bytes, theirs
    print(
        f"\n64 MiB table host0 -> host1: through shoal {ours['seconds'] * 1e3:.0f} ms, "
        f"{ours['socket_bytes']} B through Dask's socket; Dask's own {theirs['seconds'] * 1e3:.0f} ms, "
        f"{theirs['socket_bytes']} B"
    )
