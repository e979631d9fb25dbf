"""The Ray drivers of bench/ray/ (run.py starts each in a process group of its own and
reads its JSON result). Each phase starts its shoal store(s) and Ray cluster, measures,
and stops them:

    drivers.py local TMP OUT     one Ray node over one `shoal serve`: actor to actor,
                                 Ray Data, kill -9 of a writing driver
    drivers.py nodes TMP OUT     two Ray nodes over a 2-node shoal cluster in network mode:
                                 actor to actor across them, beside raw TCP
    drivers.py writer ADDRESS N  (the driver killed) puts N named objects both ways
    drivers.py reader ADDRESS    (the new driver) reads what the writer's output names

Options come as JSON in $BENCH_RAY_ARGS (run.py's). What each number means: run.py's
docstring and bench/README.md, "Ray benchmark".
"""

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path[:0] = [HERE, BENCH]

from network import RawPair, json_out, ray_environment  # noqa: E402

GiB = 2**30
MiB = 2**20
KILL_NAMES = "bench/ray-kill"
DATA_NAME = "bench/ray-data"
WARM_ROWS = 4096  # the discarded hand-off before the measured ones


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def shmem_bytes():
    """/proc/meminfo's Shmem: every shared-memory page of the host (shoal's region when
    not prefaulted, plasma's), whoever maps it."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Shmem in /proc/meminfo")


def ray_env(tmp):
    """Environment for Ray (before it is imported) and for its workers: bench/ray/ on the
    path, so they import `actors`."""
    ray_environment(tmp)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))


# ---------------------------------------------------------------- actor to actor


def actor_pair(ray, producer_node=None, consumer_node=None):
    from actors import Consumer, Producer
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def on(node):
        return "DEFAULT" if node is None else NodeAffinitySchedulingStrategy(node, soft=False)

    producer = Producer.options(scheduling_strategy=on(producer_node)).remote()
    consumer = Consumer.options(scheduling_strategy=on(consumer_node)).remote()
    where = ray.get([producer.where.remote(), consumer.where.remote()])
    assert where[0]["pid"] != where[1]["pid"], "producer and consumer share a process"
    return producer, consumer, where


def one_hand_off(ray, kind, producer, consumer, rows, seed, reps, store):
    """The producer makes the table, the consumer gets it (timed there); memory is read
    while the consumer holds it. Then both let go and the object is deleted."""
    shm0 = shmem_bytes()
    anon0 = ray.get([producer.anonymous.remote(), consumer.anonymous.remote()])
    used0 = store.stats()["used"] if store is not None else None
    made = ray.get((producer.build_shoal if kind == "shoal" else producer.build_ray).remote(rows, seed))
    got = ray.get(consumer.get.remote(kind, made["ref"], reps, rows, seed))
    shm1 = shmem_bytes()
    anon1 = ray.get([producer.anonymous.remote(), consumer.anonymous.remote()])
    sample = {
        **{k: v for k, v in made.items() if k != "ref"},
        **got,
        "shmem_growth": shm1 - shm0,
        "producer_anon_growth": anon1[0] - anon0[0],
        "consumer_anon_growth": anon1[1] - anon0[1],
    }
    if store is not None:
        sample["store_used_growth"] = store.stats()["used"] - used0
    if kind == "shoal":
        sample["size"] = made["ref"].size
        sample["copies"] = 0 if made["written_offsets"] == got["offsets"] else None
    ray.get(consumer.release.remote())
    if kind == "shoal":
        import shoal.ray

        shoal.ray.delete(made["ref"])
    del made
    return sample


def actor_to_actor(ray, args, store, producer_node=None, consumer_node=None):
    producer, consumer, where = actor_pair(ray, producer_node, consumer_node)
    samples = {"shoal": [], "ray": []}
    kinds = ["shoal", "ray"]
    for kind in kinds:  # discarded: each process's first use of a path imports and sets up
        one_hand_off(ray, kind, producer, consumer, WARM_ROWS, 0, 1, store)
    for rnd in range(args["rounds"]):
        for kind in kinds[rnd % 2 :] + kinds[: rnd % 2]:
            log(f"actor to actor: {kind}, round {rnd}")
            samples[kind].append(
                one_hand_off(ray, kind, producer, consumer, args["rows"], rnd, args["get_reps"], store)
            )
            time.sleep(args["settle_s"])  # plasma frees asynchronously
    ray.kill(producer)
    ray.kill(consumer)
    return {"where": where, **samples}


# ---------------------------------------------------------------- Ray Data


def ray_data(ray, args):
    import numpy as np
    import pyarrow as pa
    from actors import derive

    import shoal.ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    rows = args["data_rows"]
    tables = [
        pa.table({"x": np.arange(rows, dtype=np.int64) + t * rows, "y": np.full(rows, 0.5)})
        for t in range(args["data_tables"])
    ]
    total = rows * len(tables)
    log("ray data: writing the shoal table (ShoalDatasink), materializing from_arrow")
    ray.data.from_arrow(tables).write_datasink(shoal.ray.ShoalDatasink(DATA_NAME))
    at_rest = ray.data.from_arrow(tables)  # the tables in plasma, as Ray Data holds them

    chunks = len(shoal.ray.ShoalDatasource(DATA_NAME).get_read_tasks(1))

    def pipeline(kind):
        if kind == "shoal":
            ds = ray.data.read_datasource(shoal.ray.ShoalDatasource(DATA_NAME))
        elif kind == "shoal_blocks":  # one block per chunk: Ray Data does not split them
            ds = ray.data.read_datasource(shoal.ray.ShoalDatasource(DATA_NAME), override_num_blocks=chunks)
        elif kind == "from_arrow":
            ds = ray.data.from_arrow(tables)
        else:
            ds = at_rest
        return ds.map_batches(derive, batch_format="pyarrow", batch_size=None)

    kinds = ["shoal", "shoal_blocks", "at_rest", "from_arrow"]
    samples = {k: [] for k in kinds}
    for rnd in range(args["data_warmup"] + args["rounds"]):
        for kind in kinds[rnd % len(kinds) :] + kinds[: rnd % len(kinds)]:
            t0 = time.perf_counter()
            n = pipeline(kind).count()
            elapsed = time.perf_counter() - t0
            assert n == total, f"{kind}: counted {n} rows, expected {total}"
            if rnd >= args["data_warmup"]:
                samples[kind].append(elapsed)
        log(f"ray data: round {rnd} done")
    made = blocks(ray, DATA_NAME)
    client = shoal.ray.store.client()
    for row in client.ls(DATA_NAME + ".parts"):
        client.unlink(row.name)
    client.unlink(DATA_NAME)
    return {
        "rows": total,
        "tables": len(tables),
        "chunks": chunks,
        "blocks": made,
        "bytes": sum(t.nbytes for t in tables),
        "warmup": args["data_warmup"],
        **samples,
    }


def blocks(ray, name):
    """How many blocks Ray Data makes of a default `read_datasource` of the table: its
    read parallelism (`read_op_min_num_blocks`, 200) over the read tasks, each task's
    output split to reach it."""
    import shoal.ray

    return ray.data.read_datasource(shoal.ray.ShoalDatasource(name)).materialize().num_blocks()


# ---------------------------------------------------------------- kill -9


def writer_main(address, n):
    """Puts n tables with shoal (durable, named) and n with ray.put; prints where to find
    them, then waits to be killed."""
    out = json_out()
    ray_env(os.environ["BENCH_RAY_TMP"])
    import numpy as np
    import pyarrow as pa
    import ray
    import ray.cloudpickle
    from actors import SCHEMA, fill

    import shoal.ray

    ray.init(address=address, log_to_driver=False)
    rows = json.loads(os.environ["BENCH_RAY_ARGS"])["kill_rows"]
    names, refs = [], []
    for i in range(n):
        columns = []
        for c in range(len(SCHEMA)):
            column = np.empty(rows, np.int64)
            fill(column, i, c)
            columns.append(column)
        table = pa.table(columns, schema=SCHEMA)
        name = f"{KILL_NAMES}/{i}"
        names.append(shoal.ray.put(table, durability="memory", name=name).name)
        refs.append(ray.put(table))
    # ObjectRefs pickled out of band carry their owner's address: the reader's gets ask it.
    out.write(json.dumps({"names": names, "ray_refs": ray.cloudpickle.dumps(refs).hex()}) + "\n")
    out.flush()
    time.sleep(600)


def reader_main(address):
    """Reads what the killed writer named: the shoal objects by name, the Ray objects by
    their pickled refs. Prints counts and the errors met."""
    out = json_out()
    ray_env(os.environ["BENCH_RAY_TMP"])
    import ray
    import ray.cloudpickle
    from actors import expected_sample, touch

    import shoal.ray

    ray.init(address=address, log_to_driver=False)
    written = json.loads(sys.stdin.read())
    rows = json.loads(os.environ["BENCH_RAY_ARGS"])["kill_rows"]
    timeout = json.loads(os.environ["BENCH_RAY_ARGS"])["kill_get_timeout_s"]
    result = {"shoal_ok": 0, "ray_ok": 0, "shoal_errors": {}, "ray_errors": {}}
    for i, name in enumerate(written["names"]):
        try:
            value = shoal.ray.get(shoal.ray.ref(name))
            assert touch(value) == expected_sample(rows, i), "wrong contents"
            result["shoal_ok"] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            result["shoal_errors"][type(e).__name__] = result["shoal_errors"].get(type(e).__name__, 0) + 1
    refs = ray.cloudpickle.loads(bytes.fromhex(written["ray_refs"]))
    t0 = time.perf_counter()
    for i, ref in enumerate(refs):
        try:
            value = ray.get(ref, timeout=timeout)
            assert touch(value) == expected_sample(rows, i), "wrong contents"
            result["ray_ok"] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            result["ray_errors"][type(e).__name__] = result["ray_errors"].get(type(e).__name__, 0) + 1
    result["ray_gets_s"] = time.perf_counter() - t0
    for name in written["names"]:
        shoal.ray.store.client().unlink(name)
    out.write(json.dumps(result) + "\n")
    out.flush()


def kill_nine(ray, args, tmp):
    env = dict(os.environ, BENCH_RAY_TMP=tmp)
    address = ray.get_runtime_context().gcs_address
    n = args["kill_objects"]
    writer = subprocess.Popen(
        [sys.executable, __file__, "writer", address, str(n)],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        env=env,
    )
    line = writer.stdout.readline()
    if not line:
        writer.kill()
        raise RuntimeError("the writing driver printed nothing")
    log(f"kill -9: writer {writer.pid} wrote {n} + {n} objects; killing it")
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(30)
    time.sleep(args["settle_s"])
    reader = subprocess.run(
        [sys.executable, __file__, "reader", address],
        input=line,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        env=env,
        timeout=60 + n * args["kill_get_timeout_s"],
    )
    assert reader.returncode == 0, f"the reading driver failed ({reader.returncode})"
    return {"objects": n, "bytes_each": args["kill_rows"] * 8 * 4, **json.loads(reader.stdout)}


# ---------------------------------------------------------------- phases


def local_main(tmp, out, args):
    """One Ray node over one store (not prefaulted: its pages show in Shmem as written)."""
    from pathlib import Path

    from shoal.testing import Daemon

    store = Daemon(Path(tmp) / "store", capacity=args["local_capacity"])
    os.environ["SHOAL_SOCKET"] = store.socket
    ray_env(tmp)
    import ray
    import ray.data  # noqa: F401 - loaded before the measurements

    import shoal.ray

    result = {}
    try:
        shoal.ray.connect(store.socket)
        ray.init(
            num_cpus=args["local_cpus"],
            include_dashboard=False,
            object_store_memory=args["local_ray_store"],
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=os.path.join(tmp, "ray"),
        )
        client = store.client()
        result["actor_to_actor"] = actor_to_actor(ray, args, client)
        result["ray_data"] = ray_data(ray, args)
        result["kill_nine"] = kill_nine(ray, args, tmp)
    finally:
        ray.shutdown()
        shoal.ray.store.client().close()
        store.teardown(check=False)
    with open(out, "w") as f:
        json.dump(result, f)


def nodes_main(tmp, out, args):
    """Two Ray nodes over a 2-node shoal cluster in network mode (test_ray_nodes.py's set-up)
    and the raw TCP pair between two processes of this host."""
    from cluster import cluster_up

    ray_env(tmp)
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    import shoal.ray

    errlog = sys.stderr
    cluster = cluster_up(
        os.path.join(tmp, "c"), errlog, nodes=2, modes="network", capacity=args["node_capacity"], tiers=False
    )
    common = {
        "num_cpus": 1,
        "object_store_memory": args["nodes_ray_store"],
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
    }
    ray_cluster = raw = None
    result = {}
    try:
        ray_cluster = RayCluster(
            initialize_head=True,
            head_node_args={
                **common,
                "temp_dir": os.path.join(tmp, "ray"),
                "env_vars": {"SHOAL_SOCKET": cluster.socket(0)},
            },
        )
        second = ray_cluster.add_node(**common, env_vars={"SHOAL_SOCKET": cluster.socket(1)})
        shoal.ray.connect(cluster.socket(0))
        ray.init(address=ray_cluster.address, log_to_driver=False, _node_ip_address="127.0.0.1")
        head = ray.get_runtime_context().get_node_id()
        table_bytes = args["rows"] * 8 * 4
        raw = RawPair(os.path.basename(tmp), errlog, size=table_bytes)
        from actors import Consumer, Producer  # noqa: F401 - workers import it too
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def on(node):
            return NodeAffinitySchedulingStrategy(node, soft=False)

        producer = Producer.options(scheduling_strategy=on(second.node_id)).remote()
        consumer = Consumer.options(scheduling_strategy=on(head)).remote()
        where = ray.get([producer.where.remote(), consumer.where.remote()])
        assert [w["shoal_node"] for w in where] == [1, 0], f"stores reached: {where}"
        steps = ["shoal", "ray", *(f"tcp {s} {int(b)}" for s, b in args["tcp"])]
        samples = {step: [] for step in steps}
        for rnd in range(args["nodes_warmup"] + args["nodes_rounds"]):
            k = rnd % len(steps)
            for step in steps[k:] + steps[:k]:
                seed = 100 + rnd
                if step.startswith("tcp"):
                    _, streams, rcvbuf = step.split()
                    elapsed, _cpu = raw.pull(table_bytes, int(streams), bool(int(rcvbuf)))
                    got = {"pull_s": elapsed}
                elif step == "shoal":
                    made = ray.get(producer.build_shoal.remote(args["rows"], seed))
                    got = ray.get(consumer.get.remote("shoal", made["ref"], 0, args["rows"], seed))
                    got.update(pull_s=got["first_get_s"] + got["touch_s"], size=made["ref"].size)
                    assert got["in_region"], "the consumer's table is not in node 0's region"
                    ray.get(consumer.release.remote())
                    shoal.ray.delete(made["ref"])  # through node 0: the copy and the primary
                else:
                    made = ray.get(producer.build_ray.remote(args["rows"], seed))
                    got = ray.get(consumer.get.remote("ray", made["ref"], 0, args["rows"], seed))
                    got["pull_s"] = got["first_get_s"] + got["touch_s"]
                    ray.get(consumer.release.remote())
                    del made
                    time.sleep(args["settle_s"])
                if rnd >= args["nodes_warmup"]:
                    samples[step].append(got)
            log(f"nodes: round {rnd} done")
        raw.verify(table_bytes)
        result = {"where": where, "table_bytes": table_bytes, **samples}
    finally:
        if raw is not None:
            raw.stop()
        ray.shutdown()
        if ray_cluster is not None:
            ray_cluster.shutdown()
        shoal.ray.store.client().close()
        cluster.down(check=False)
    with open(out, "w") as f:
        json.dump(result, f)


def main():
    phase = sys.argv[1]
    if phase == "writer":
        return writer_main(sys.argv[2], int(sys.argv[3]))
    if phase == "reader":
        return reader_main(sys.argv[2])
    args = json.loads(os.environ["BENCH_RAY_ARGS"])
    from shoal.testing import require_optimized_build

    require_optimized_build()
    {"local": local_main, "nodes": nodes_main}[phase](sys.argv[2], sys.argv[3], args)


if __name__ == "__main__":
    main()
