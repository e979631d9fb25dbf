"""Elastic capacity from Python: `Client.controller()` shows the controller's state and its
capacity-over-time trace as a pyarrow.Table, while a node's memory (a meminfo file the
daemon reads, written here) rises and falls; every object stays gettable with its bytes."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

import shoal

MIB = 1 << 20
GIB = 1 << 30


def write_meminfo(path, total: int, used: int) -> None:
    """A /proc/meminfo the daemon reads, written aside and renamed (never half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"MemTotal: {total // 1024} kB\nMemFree: 0 kB\nMemAvailable: {(total - used) // 1024} kB\n")
    os.replace(tmp, path)


def wait_for(client: shoal.Client, what: str, done, within: float = 10.0) -> dict:
    deadline = time.monotonic() + within
    while True:
        state = client.controller()
        if done(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s; last state {state}")
        time.sleep(0.02)


def test_a_static_store_says_it_has_no_controller(store):
    state = store.client().controller()
    assert state["enabled"] is False
    assert state["steps"] == 0
    assert state["capacity"] == state["target"] == 64 * MIB
    assert "trace" not in state


def test_the_controller_shrinks_and_regrows_the_store_and_its_trace_is_a_table(make_store, tmp_path):
    meminfo = tmp_path / "meminfo"
    write_meminfo(meminfo, GIB, 300 * MIB)
    store = make_store(
        capacity="64MiB",
        args=[
            "--elastic",
            "--elastic-source",
            f"meminfo:{meminfo}",
            "--elastic-interval-ms",
            "20",
            "--elastic-max-fraction",
            "1",
            "--burst",
            str(tmp_path / "burst"),
        ],
    )
    client = store.client()
    state = wait_for(client, "first steps", lambda s: s["steps"] >= 3)
    assert state["enabled"] is True
    assert state["source"] == f"meminfo {meminfo}"
    assert state["capacity"] == 64 * MIB and state["node_total"] == GIB
    assert state["threshold"] == pytest.approx(0.95) and state["gain"] == pytest.approx(0.5)
    values = [bytes([i]) * (2 * MIB) for i in range(16)]
    ids = [client.put(v, durability="local") for v in values]

    # The node's memory jumps to 99 %: the store gives its memory back.
    write_meminfo(meminfo, GIB, GIB * 99 // 100)
    shrunk = wait_for(client, "shrunk to nothing", lambda s: s["target"] == 0 and s["used"] == 0)
    assert shrunk["last_step"] <= 0 and shrunk["ratio"] > 0.95
    assert shrunk["released_bytes"] > 0
    assert client.controller(trace_since=0)["trace"].num_rows >= shrunk["steps"] - 1

    # Back down: it grows again, and every object comes back with its bytes.
    write_meminfo(meminfo, GIB, 300 * MIB)
    wait_for(client, "grown back", lambda s: s["capacity"] == 64 * MIB)
    for oid, value in zip(ids, values, strict=True):
        assert bytes(client.get(oid)) == value

    trace = client.controller(trace_since=0)["trace"]
    assert isinstance(trace, pa.Table)
    assert trace.column_names == [
        "time_s",
        "target",
        "capacity",
        "store_used",
        "node_used",
        "node_total",
        "ratio",
    ]
    assert trace.schema.field("capacity").type == pa.uint64()
    capacity = trace.column("capacity").to_pylist()
    assert max(capacity) == 64 * MIB and min(capacity) == 0, "the shrink and the regrowth"
    times = trace.column("time_s").to_pylist()
    assert times == sorted(times)
    # Only what came after the time asked for.
    later = client.controller(trace_since=times[-1] - 0.1)["trace"]
    assert 0 < later.num_rows < trace.num_rows


def test_a_bad_trace_time_is_a_typed_error(store):
    with pytest.raises(shoal.InvalidArgument):
        store.client().controller(trace_since=-1.0)
