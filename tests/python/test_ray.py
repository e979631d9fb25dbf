"""shoal beside Ray (shoal.ray), with a real Ray: a one-node Ray cluster over one store,
and two Ray nodes on this host over a two-node shoal cluster.

Measured: values through ShoalRefs equal Ray's own path (ray.put / task results) between
the driver, tasks and actors; a ref pickles to a few dozen bytes; the value a task or actor
gets lies in its mapping of the store, at the same offset in every process; a job's
objects go when its driver exits or is killed (kill -9), durable ones stay and a new driver
reads them by name; Ray Data writes and reads shoal tables with the rows of
`ray.data.from_arrow`, projection pushed down, parts of failed and replaced writes deleted.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _shoal_testing import Daemon, short_dir, wait_for

REASON = "no ray: scripts/setup-test-tools.sh installs it (pip install 'shoal[ray]')"
ray = pytest.importorskip("ray", reason=REASON)
pytest.importorskip("ray.data", reason=REASON)

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import shoal  # noqa: E402
import shoal.ray  # noqa: E402
from shoal.ray import ShoalDatasink, ShoalDatasource, ShoalRef  # noqa: E402

HERE = Path(__file__).parent


def table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "x": np.arange(rows, dtype=np.int64) + seed,
            "y": rng.random(rows),
            "s": pa.array([f"r{i % 97}" for i in range(rows)]),
        }
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    directory = short_dir(tmp_path_factory.mktemp("ray")) / "store"
    daemon = Daemon(directory, capacity="512MiB", args=["--burst", str(directory / "burst")])
    yield daemon
    daemon.teardown()


@pytest.fixture(scope="module")
def cluster(store: Daemon) -> Iterator[str]:
    """A one-node Ray cluster whose workers reach `store` (they inherit SHOAL_SOCKET from
    the raylet this process starts). Yields the GCS address, for other drivers."""
    saved = {key: os.environ.get(key) for key in ("SHOAL_SOCKET", "PYTHONPATH")}
    os.environ["SHOAL_SOCKET"] = store.socket
    # Workers import this module's remote functions by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), saved["PYTHONPATH"]]))
    shoal.ray.connect(store.socket)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shoal.ray.store.client().close()
        shoal.ray.store._client = None
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def arrow(dataset: Any) -> pa.Table:
    """A Dataset's rows as one Arrow table."""
    return pa.concat_tables(ray.get(dataset.to_arrow_refs()))


def region_offset(address: int) -> int:
    """Where `address` lies in this process's mapping of the store (fails if outside)."""
    client = shoal.ray.store.client()
    offset = address - client.region_address
    assert 0 <= offset < client.region_size, "not in the store's mapping"
    return offset


def summary(value: Any) -> Any:
    """What the tests compare: the value itself, made plain."""
    if isinstance(value, pa.Table):
        return value.to_pydict()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items()}
    return value


@ray.remote
def consume(value: Any) -> Any:
    """A task on Ray's own path: the value is the argument."""
    return summary(value)


@ray.remote
def consume_ref(ref: ShoalRef) -> Any:
    return summary(shoal.ray.get(ref))


@ray.remote
def produce(rows: int) -> ShoalRef:
    return shoal.ray.put(table(rows, seed=7))


@ray.remote
class Holder:
    def put(self, rows: int) -> ShoalRef:
        self.value = table(rows, seed=3)
        return shoal.ray.put(self.value)

    def build(self, rows: int) -> tuple[ShoalRef, int]:
        """A table built in place in the store (the producer copies nothing), shared as a
        ref; also where its column x was written."""
        client = shoal.ray.store.client()
        with client.create_table(pa.schema([("x", pa.int64())]), rows) as builder:
            column = builder["x"]
            column[:] = np.arange(rows)
            written = region_offset(column.ctypes.data)
        self.kept = column
        return shoal.ray.share(builder.id), written

    def where(self, ref: ShoalRef) -> dict[str, Any]:
        """Where the value's column buffers lie in this actor's mapping of the store."""
        value = shoal.ray.get(ref)
        self.kept = value  # held: the buffers stay mapped while the driver compares
        buffers = [b for column in value.columns for chunk in column.chunks for b in chunk.buffers() if b]
        return {
            "pid": os.getpid(),
            "offsets": [region_offset(b.address) for b in buffers],
            "addresses": [b.address for b in buffers],
            "rows": value.num_rows,
        }


def test_put_and_get_between_driver_tasks_and_actors_equal_rays_own_path(cluster: str) -> None:
    values = {
        "table": table(200_000),
        "array": np.arange(1 << 20, dtype=np.float64),
        "dict": {"a": np.arange(300_000, dtype=np.int32), "b": np.ones((64, 64))},
        "small": {"k": [1, 2, 3], "s": "text"},
    }
    refs = {key: shoal.ray.put(value) for key, value in values.items()}
    for key, value in values.items():
        expected = ray.get(consume.remote(value))  # Ray's own path
        assert ray.get(consume_ref.remote(refs[key])) == expected, key
        assert summary(shoal.ray.get(refs[key])) == expected, key
        # A ref is a few dozen bytes whatever the value: Ray inlines it, plasma never sees it.
        assert len(pickle.dumps(refs[key])) < 100
    assert refs["table"].size >= values["table"].nbytes and refs["table"].node == 0

    # A task's result and an actor's value, read by the driver and by another task.
    produced = ray.get(produce.remote(50_000))
    assert shoal.ray.get(produced).equals(table(50_000, seed=7))
    holder = Holder.remote()
    held = ray.get(holder.put.remote(30_000))
    assert ray.get(consume_ref.remote(held)) == ray.get(consume.remote(table(30_000, seed=3)))
    # Object names: under the job's directory, found by `shoal ls`.
    scope = shoal.ray.store.scope()
    names = {row.name for row in shoal.ray.store.client().ls(scope.directory)}
    assert {scope.name(r.id.hex(), durable=False) for r in [*refs.values(), produced, held]} <= names
    ray.kill(holder)
    shoal.ray.delete([*refs.values(), produced, held])
    with pytest.raises(shoal.ObjectNotFound, match="gone"):
        shoal.ray.get(refs["table"])


def test_get_is_zero_copy_at_one_offset_in_every_process(cluster: str) -> None:
    a, b = Holder.remote(), Holder.remote()
    ref = ray.get(a.put.remote(400_000))  # 400k rows: ~11 MB of column buffers
    seen = ray.get([a.where.remote(ref), b.where.remote(ref)])
    here = shoal.ray.get(ref)
    mine = [
        region_offset(buf.address) for col in here.columns for ch in col.chunks for buf in ch.buffers() if buf
    ]
    # Two actor processes and the driver: each column buffer at the same offset of the
    # store in each, so every process reads the one copy the producer wrote.
    assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()
    assert seen[0]["offsets"] == seen[1]["offsets"] == mine
    assert seen[0]["rows"] == seen[1]["rows"] == 400_000

    # A producer that builds in place: the readers' column is the bytes it wrote.
    built, written = ray.get(a.build.remote(1_000_000))
    seen = ray.get(b.where.remote(built))
    assert seen["rows"] == 1_000_000 and written in seen["offsets"]
    assert shoal.ray.get(built).column("x").to_numpy().sum() == np.arange(1_000_000).sum()
    ray.kill(a)
    ray.kill(b)
    shoal.ray.delete([ref, built])


def test_locality_points_at_the_ray_node_of_the_bytes(cluster: str) -> None:
    ref = shoal.ray.put(np.zeros(1000))
    strategy = shoal.ray.locality([ref])
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    assert strategy.node_id == ray.get_runtime_context().get_node_id() and strategy.soft
    assert [n.shoal_node for n in shoal.ray.node_map()] == [0]
    assert shoal.ray.locality(shoal.ray.ref(shoal.ray.store.scope().name(ref.id.hex(), durable=False))) == (
        "DEFAULT"
    )  # a ref made from a name does not know its node
    shoal.ray.delete(ref)


DRIVER = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np, pyarrow as pa, ray
    import shoal.ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    x = pa.table({"x": np.arange(100_000, dtype=np.int64), "y": np.arange(100_000) * 0.5})
    job = shoal.ray.put(x)
    named = shoal.ray.put(x, durability="local", name="results/run1/x.arrow")
    unnamed = shoal.ray.put({"a": np.arange(50_000)}, durability="memory")

    @ray.remote
    def part(i):
        value = pa.table({"i": np.full(10_000, i)})
        return shoal.ray.put(value, durability="local", name=f"results/run1/part-{i}")

    parts = ray.get([part.remote(i) for i in range(3)])
    task_job = ray.get(ray.remote(lambda: shoal.ray.put(np.ones(20_000))).remote())
    scope = shoal.ray.store.scope()
    print(json.dumps({
        "job": scope.job, "directory": scope.directory,
        "job_names": [scope.name(r.id.hex(), durable=False) for r in (job, task_job)],
        "durable": [r.name for r in (named, unnamed, *parts)],
    }), flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)
    """
)

READER = textwrap.dedent(
    """
    import json, sys
    import numpy as np, ray
    import shoal.ray
    ray.init(address=sys.argv[1], log_to_driver=False)

    @ray.remote
    def total(ref):
        value = shoal.ray.get(ref)
        if isinstance(value, dict):
            return int(value["a"].sum())
        return int(sum(int(np.asarray(c).sum()) for c in value.columns))

    refs = [shoal.ray.ref(name) for name in json.loads(sys.argv[2])]
    print(json.dumps(ray.get([total.remote(r) for r in refs])), flush=True)
    """
)


def run_driver(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_killed_drivers_job_objects_go_its_durable_ones_stay_for_a_new_driver(
    cluster: str, store: Daemon
) -> None:
    client = store.client()
    writer = run_driver(DRIVER, cluster, "hang")
    assert writer.stdout is not None
    line = writer.stdout.readline()
    assert line, writer.stderr.read() if writer.stderr else ""
    written = json.loads(line)
    names = {row.name for row in client.ls("")}
    assert set(written["job_names"]) | set(written["durable"]) <= names
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(10)

    # The janitor sees the job dead and deletes its own objects; the durable ones stay.
    def swept() -> bool:
        left = {row.name for row in client.ls("")}
        return not set(written["job_names"]) & left

    wait_for(swept, timeout=30, interval=0.1, message="the killed job's objects deleted")
    left = {row.name for row in client.ls("")}
    assert set(written["durable"]) <= left
    # The janitor records a sweep once it deleted every name: a moment after they are gone.
    janitor = ray.get_actor("janitor", namespace="shoal")
    wait_for(
        lambda: written["job"] in ray.get(janitor.swept.remote()),
        timeout=10,
        interval=0.1,
        message="the janitor's record of the sweep",
    )
    assert ray.get(janitor.swept.remote())[written["job"]] == 2

    reader = run_driver(READER, cluster, json.dumps(written["durable"]))
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    x = np.arange(100_000, dtype=np.int64)
    expected = [int(x.sum() + (x * 0.5).sum()), int(np.arange(50_000).sum())] + [i * 10_000 for i in range(3)]
    assert json.loads(out) == expected

    # A driver that exits on its own deletes its job's objects as it goes.
    clean = run_driver(DRIVER, cluster, "exit")
    out, err = clean.communicate(timeout=60)
    assert clean.returncode == 0, err
    written = json.loads(out)
    left = {row.name for row in client.ls("")}
    assert not set(written["job_names"]) & left and set(written["durable"]) <= left
    for name in written["durable"]:
        client.unlink(name)


def test_ray_data_writes_and_reads_shoal_tables_like_from_arrow(cluster: str, store: Daemon) -> None:
    client = store.client()
    tables = [table(20_000, seed=s) for s in range(4)]
    expected = arrow(ray.data.from_arrow(tables))  # Ray's own path

    sink = ShoalDatasink("tables/rt")
    ray.data.from_arrow(tables).write_datasink(sink)
    stored = client.get_named("tables/rt")  # the manifest's chunks, as one table, no copy
    assert stored.equals(expected)
    parts = client.ls("tables/rt.parts")
    assert len(parts) == 4 and all(r.name.startswith("tables/rt.parts/") for r in parts)

    source = ShoalDatasource("tables/rt")
    tasks = source.get_read_tasks(1)
    assert len(tasks) == 4 and [t.metadata.num_rows for t in tasks] == [t.num_rows for t in tables]
    assert source.estimate_inmemory_data_size() == sum(r.size for r in parts)
    read = ray.data.read_datasource(source)
    assert read.count() == 80_000
    assert arrow(read).sort_by("x").equals(expected.sort_by("x"))
    # shoal.ray.read: one block per chunk (Ray Data's default would split each read).
    blocks = shoal.ray.read("tables/rt").materialize()
    assert blocks.num_blocks() == 4 and arrow(blocks).sort_by("x").equals(expected.sort_by("x"))
    # Projection pushdown: Ray Data's optimizer folds the column select into the read (the
    # read tasks select the column over store memory), leaving no Project operator.
    projected = ray.data.read_datasource(ShoalDatasource("tables/rt")).select_columns(["y"])
    plan = io.StringIO()
    with contextlib.redirect_stdout(plan):
        projected.explain()
    optimized = plan.getvalue().split("Logical Plan (Optimized)")[1].split("Physical Plan")[0]
    assert "Read[ReadShoal]" in optimized and "Project" not in optimized
    assert arrow(projected).column("y").to_pylist() == pytest.approx(expected.column("y").to_pylist())
    narrow = ShoalDatasource("tables/rt", columns=["x"])
    assert (
        narrow.schema.names == ["x"]
        and narrow.estimate_inmemory_data_size() < source.estimate_inmemory_data_size()
    )

    # A rewrite replaces the table whole and leaves only its own parts.
    ray.data.from_arrow(tables[:2]).write_datasink(ShoalDatasink("tables/rt"))
    assert client.get_named("tables/rt").num_rows == 40_000
    assert len(client.ls("tables/rt.parts")) == 2

    # A failed write deletes what it wrote; the previous version stays.
    def boom(batch: dict[str, Any]) -> dict[str, Any]:
        if batch["x"][0] == 3:  # the block of seed 3 fails
            raise ValueError("boom")
        return batch

    with pytest.raises(Exception, match="boom"):
        ray.data.from_arrow(tables).map_batches(boom, batch_size=None).write_datasink(
            ShoalDatasink("tables/rt")
        )
    assert client.get_named("tables/rt").num_rows == 40_000
    assert len(client.ls("tables/rt.parts")) == 2

    # An Arrow table put under a name (one read task per record batch) and a HugeTable.
    client.put(pa.Table.from_batches(expected.to_batches(max_chunksize=25_000)), name="tables/plain")
    plain = ShoalDatasource("tables/plain")
    assert len(plain.get_read_tasks(1)) == 4
    assert arrow(ray.data.read_datasource(plain)).sort_by("x").equals(expected.sort_by("x"))
    for i, t in enumerate(tables):
        client.put_chunk("huge-rt", i, t)
    huge = ray.data.read_datasource(ShoalDatasource(hugetable="huge-rt", parts=4))
    assert arrow(huge).sort_by("x").equals(expected.sort_by("x"))
    client.delete_table("huge-rt", 4)
    for name in ("tables/rt", "tables/plain"):
        client.unlink(name)
