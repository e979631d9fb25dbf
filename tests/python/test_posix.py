"""Names from Python and the POSIX view (`python -m shoal mount`): a value put under a name is
a file on the mount, a file written through the mount is gettable by name (an Arrow IPC file
zero-copy), and unmodified libraries (pyarrow, DuckDB, h5py, netCDF4) read and write files on it.

Mount tests need an extension built with the `fuse` feature (the test command's build; the
quick start's leaves it out), /dev/fuse and root or fusermount3 (`SHOAL_FEATURES=full
./scripts/setup.sh` installs fuse3); they skip saying so where one is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _shoal_testing import Daemon, in_region, needs_library, wait_for

import shoal


def _fuse_missing() -> str | None:
    if "fuse" not in shoal.features():
        return "the extension was built without the `fuse` feature (SHOAL_FEATURES=full ./scripts/setup.sh)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 (SHOAL_FEATURES=full ./scripts/setup.sh installs fuse3)"
    return None


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split(" ")[4] == str(path) for line in table)


class Mount:
    """A `python -m shoal mount` subprocess over `daemon`, owned by one test."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        path.mkdir()
        self.path = path
        self.log_path = path.parent / "mount.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shoal", "mount", "--socket", daemon.socket, str(path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 20
        while not _mounted(path):
            assert self.process.poll() is None, f"mount exited: {self.log_path.read_text()}"
            assert time.monotonic() < deadline, f"mount did not come up: {self.log_path.read_text()}"
            time.sleep(0.01)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        assert not _mounted(self.path), "the mount point is still mounted"


@pytest.fixture
def mount(store: Daemon, tmp_path: Path) -> Iterator[Mount]:
    why = _fuse_missing()
    if why is not None:
        pytest.skip(why)
    mounted = Mount(store, tmp_path / "mnt")
    yield mounted
    mounted.stop()


def test_names_put_get_ls_stat_rename_unlink(store: Daemon) -> None:
    client = store.client()
    table = pa.table({"x": np.arange(100, dtype=np.int64)})
    oid = client.put(table, name="runs/1/table")
    client.put(b"raw bytes", name="runs/1/raw")
    client.put({"a": 1}, name="runs/2/obj")
    assert client.get_named("runs/1/table").equals(table)
    assert client.get_named("runs/2/obj") == {"a": 1}
    rows = client.ls("runs/1")
    assert [r.name for r in rows] == ["runs/1/raw", "runs/1/table"]
    assert rows[1].id == oid and rows[1].size > 0 and rows[1].mtime > time.time() - 60
    assert client.stat("runs/1/raw").size == len(b"raw bytes")
    # A new value under the same name replaces the old object.
    newer = client.put(b"second", name="runs/1/raw")
    assert bytes(client.get_named("runs/1/raw")) == b"second"
    assert client.stat("runs/1/raw").id == newer
    # A name's time is settable (as utime on the mount) and moves with the name.
    client.set_mtime("runs/1/table", 1_000_000.5)
    client.rename("runs/1", "done")
    assert [r.name for r in client.ls()] == ["done/raw", "done/table", "runs/2/obj"]
    assert client.stat("done/table").mtime == 1_000_000.5
    with pytest.raises(shoal.ObjectNotFound):
        client.set_mtime("runs/1/table", 0)
    client.unlink("done/raw")
    with pytest.raises(shoal.ObjectNotFound):
        client.get_named("done/raw")
    assert not client.contains(newer)


def test_names_are_one_namespace_across_a_clusters_nodes(mapped_cluster) -> None:
    """A name bound on one node is read, listed, replaced, renamed and unlinked from the
    others; a named Arrow table put on node 0 is read on node 1 in node 0's memory."""
    c0, c1, c2 = (mapped_cluster.client(i) for i in range(3))
    table = pa.table({"x": np.arange(50_000, dtype=np.int64)})
    oid = c0.put(table, name="runs/t")
    c2.put(b"from node 2", name="runs/raw")
    got = c1.get_named("runs/t")
    assert got.equals(table)
    address = got["x"].chunk(0).buffers()[1].address
    assert not in_region(c1, address), "node 1 copied the table into its own memory"
    assert c1.stats()["objects"] == 0
    del got
    for client in (c0, c1, c2):
        assert [r.name for r in client.ls("runs")] == ["runs/raw", "runs/t"]
    assert c1.stat("runs/t").id == oid
    # A newer object under the name, on another node: every node reads the newer one.
    newer = c2.put(b"second", name="runs/t")
    for client in (c0, c1, c2):
        assert bytes(client.get_named("runs/t")) == b"second"
        assert [r.name for r in client.ls("runs")] == ["runs/raw", "runs/t"]
    assert wait_for(lambda: not c0.contains(oid)), "the superseded object stays"
    # A directory rename from node 1 moves names held by nodes 0 and 2 alike.
    c0.put(b"zero", name="runs/zero")
    c1.rename("runs", "done")
    for client in (c0, c1, c2):
        assert [r.name for r in client.ls()] == ["done/raw", "done/t", "done/zero"]
    assert c0.stat("done/t").id == newer
    c0.unlink("done/raw")
    for client in (c0, c1, c2):
        with pytest.raises(shoal.ObjectNotFound):
            client.get_named("done/raw")
    assert [r.name for r in c2.ls()] == ["done/t", "done/zero"]


def test_bad_names_raise_typed_errors_and_store_nothing(store: Daemon) -> None:
    client = store.client()
    for name in ["", "a/../b", "/abs", "a//b", "nul\0"]:
        with pytest.raises(shoal.InvalidArgument):
            client.put(b"x", name=name)
    with pytest.raises(shoal.NameTooLong):
        client.put(b"x", name="x" * 256)
    assert client.ls() == []
    assert client.list() == [], "a refused name aborts the object"


def test_a_named_put_is_a_file_and_a_file_is_gettable_by_name(store: Daemon, mount: Mount) -> None:
    client = store.client()
    client.put(b"hello from python", name="py/hello.txt")
    assert (mount.path / "py" / "hello.txt").read_bytes() == b"hello from python"
    data = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8).tobytes()
    (mount.path / "files").mkdir()
    (mount.path / "files" / "data.bin").write_bytes(data)
    got = client.get_named("files/data.bin")
    assert bytes(got) == data
    # After a small object: a file, and a large put, still start on a page
    # (the kernel's copies of a file are page by page).
    assert got.address % 4096 == 0
    client.put(data, name="py/large.bin")
    assert client.get_named("py/large.bin").address % 4096 == 0
    assert [r.name for r in client.ls("files")] == ["files/data.bin"]
    assert sorted(os.listdir(mount.path)) == ["files", "py"]
    assert sorted(os.listdir(mount.path / "py")) == ["hello.txt", "large.bin"]


def test_an_arrow_file_written_through_the_mount_is_read_zero_copy(store: Daemon, mount: Mount) -> None:
    client = store.client()
    table = pa.table({"a": np.arange(1 << 16, dtype=np.float64), "b": np.arange(1 << 16) % 7})
    with pa.OSFile(str(mount.path / "t.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    got = client.get_named("t.arrow")
    assert isinstance(got, pa.Table) and got.equals(table)
    for column in got.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None and buffer.size:
                    assert in_region(client, buffer.address, buffer.size), "copied out of the store"


def test_pyarrow_and_duckdb_read_parquet_from_the_mount(store: Daemon, mount: Mount) -> None:
    duckdb = needs_library("duckdb")
    table = pa.table({"k": np.arange(10_000) % 10, "v": np.arange(10_000, dtype=np.float64)})
    path = mount.path / "pq" / "t.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    assert pq.read_table(path).equals(table)
    total = duckdb.sql(f"select sum(v) from read_parquet('{path}') where k = 3").fetchall()[0][0]
    assert total == float(np.arange(3, 10_000, 10).sum())


def test_h5py_and_netcdf4_write_and_read_on_the_mount(store: Daemon, mount: Mount) -> None:
    h5py = needs_library("h5py")
    netCDF4 = needs_library("netCDF4")
    values = np.arange(50_000, dtype=np.float32).reshape(500, 100)
    with h5py.File(mount.path / "a.h5", "w") as f:
        f.create_dataset("values", data=values, chunks=(50, 100))
        f["values"].attrs["unit"] = "m"
    with h5py.File(mount.path / "a.h5", "r") as f:
        assert np.array_equal(f["values"][...], values) and f["values"].attrs["unit"] == "m"
    with netCDF4.Dataset(mount.path / "b.nc", "w") as nc:
        nc.createDimension("t", 500)
        nc.createDimension("x", 100)
        var = nc.createVariable("temp", "f4", ("t", "x"))
        var[:] = values
    with netCDF4.Dataset(mount.path / "b.nc", "r") as nc:
        assert np.array_equal(nc["temp"][:], values)
    names = [r.name for r in store.client().ls()]
    assert names == ["a.h5", "b.nc"]
