"""Zero-copy creation of Arrow tables: `client.create_table` lays columns out in store memory.

The proof of "no copy" is by address: the numpy views the builder hands out, and the
buffers of the pyarrow Table that `get` returns (in this process and in another), are
the same bytes inside the mapped region; and building a table allocates no private
memory of its size.
"""

from __future__ import annotations

import datetime
import decimal
import gc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _shoal_testing import MiB, in_region, needs_library, snapshot, wait_for

import shoal


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


FIXED_WIDTH = pa.schema(
    [
        ("i8", pa.int8()),
        ("u16", pa.uint16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("u64", pa.uint64()),
        ("f16", pa.float16()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("flag", pa.bool_()),
        ("ts", pa.timestamp("ns", tz="UTC")),
        ("ms", pa.timestamp("ms")),
        ("dur", pa.duration("us")),
        ("day", pa.date32()),
        ("day64", pa.date64()),
        ("t32", pa.time32("ms")),
        ("t64", pa.time64("ns")),
        ("dec", pa.decimal128(12, 3)),
        ("fsb", pa.binary(5)),
    ]
)


def fill(builder: shoal.TableBuilder, n: int) -> None:
    rows = np.arange(n)
    for name in ("i8", "u16", "i32", "i64", "u64", "f32", "f64"):
        builder[name][:] = rows
    builder["f16"][:] = (rows % 100).astype(np.float16)
    builder["flag"][:] = 0b01010101  # rows 0, 2, 4, ... are true (bit-packed, LSB first)
    builder["ts"][:] = np.datetime64("2026-11-21T00:00:00", "ns") + rows.astype("timedelta64[s]")
    builder["ms"][:] = np.datetime64("2020-02-29T12:00:00", "ms")
    builder["dur"][:] = rows.astype("timedelta64[us]")
    builder["day"][:] = rows
    builder["day64"][:] = rows * 86_400_000
    builder["t32"][:] = rows
    builder["t64"][:] = rows * 1000
    decimals = builder["dec"].view("<i8").reshape(n, 2)  # 128-bit little endian, scale 3
    decimals[:, 0] = rows * 1000 + 5
    decimals[:, 1] = 0
    builder["fsb"][:] = np.frombuffer(b"abcde", np.uint8)


def test_every_fixed_width_type_round_trips(store):
    client = store.client()
    n = 1000
    with client.create_table(FIXED_WIDTH, n) as builder:
        fill(builder, n)
    table = client.get(builder.id)
    assert isinstance(table, pa.Table) and table.schema == FIXED_WIDTH and table.num_rows == n
    table.validate(full=True)
    assert table["i64"].to_pylist() == list(range(n))
    assert table["i8"].to_pylist()[:128][-3:] == [125, 126, 127] and table["i8"][128].as_py() == -128
    assert table["f16"][7].as_py() == 7.0
    assert table["flag"].to_pylist()[:4] == [True, False, True, False]
    assert pc.sum(table["flag"]).as_py() == n // 2
    assert table["ts"][1].as_py() == datetime.datetime(2026, 11, 21, 0, 0, 1, tzinfo=datetime.UTC)
    assert table["ms"][0].as_py() == datetime.datetime(2020, 2, 29, 12)
    assert table["dur"][3].as_py() == datetime.timedelta(microseconds=3)
    assert table["day"][2].as_py() == datetime.date(1970, 1, 3)
    assert table["day64"][2].as_py() == datetime.date(1970, 1, 3)
    assert table["t32"][1500 % n].as_py() == datetime.time(0, 0, 0, 500_000)
    assert table["t64"][2].as_py() == datetime.time(0, 0, 0, 2)
    assert table["dec"][4].as_py() == decimal.Decimal("4.005")
    assert set(table["fsb"].to_pylist()) == {b"abcde"}


def test_columns_are_written_where_they_are_read(store):
    client = store.client()
    schema = pa.schema([("x", pa.int64()), ("y", pa.float64())])
    with client.create_table(schema, 4096) as builder:
        x, y = builder["x"], builder[1]
        x[:] = np.arange(4096)
        y[:] = 0.25
        addresses = (x.ctypes.data, y.ctypes.data)
        assert in_region(client, addresses[0], x.nbytes) and in_region(client, addresses[1], y.nbytes)
        assert x.flags.writeable
    table = client.get(builder.id)
    got = tuple(table[name].chunk(0).buffers()[1].address for name in ("x", "y"))
    assert got == addresses, "get returned other memory than the builder wrote"
    del x, y, table


def test_another_process_reads_the_built_table_in_place(store, python):
    client = store.client()
    n = 1 << 20
    with client.create_table(pa.schema([("v", pa.int64())]), n) as builder:
        builder["v"][:] = np.arange(n)
    report = python(
        """
        import pyarrow.compute as pc
        client = shoal.Client(sys.argv[1])
        table = client.get(shoal.ObjectID.from_hex(sys.argv[2]))
        buffer = table["v"].chunk(0).buffers()[1]
        start = client.region_address
        end = start + client.region_size
        emit({"inside": start <= buffer.address and buffer.address + buffer.size <= end,
              "sum": pc.sum(table["v"]).as_py()})
        """,
        store.socket,
        builder.id.hex(),
    )
    assert report == {"inside": True, "sum": n * (n - 1) // 2}


def test_building_allocates_no_private_memory(make_store):
    """A 256 MiB table goes straight into shared memory: private (anonymous) RSS stays flat."""
    daemon = make_store(capacity="320MiB")
    client = daemon.client()
    n = 256 * MiB // 8
    schema = pa.schema([("a", pa.int64())])
    gc.collect()
    before = rss_anon()
    with client.create_table(schema, n) as builder:
        column = builder["a"]
        step = 1 << 22
        for start in range(0, n, step):
            column[start : start + step] = 3
        del column
    grown = rss_anon() - before
    assert grown < 16 * MiB, f"RssAnon grew by {grown / MiB:.0f} MiB building a 256 MiB table"
    table = client.get(builder.id)
    assert pc.sum(table["a"]).as_py() == 3 * n


def test_an_exception_in_the_block_aborts(store):
    client = store.client()
    before = snapshot(client)
    with pytest.raises(RuntimeError):
        with client.create_table(pa.schema([("x", pa.int32())]), 100) as builder:
            builder["x"][:] = 1
            raise RuntimeError("half-built")
    assert not client.contains(builder.id)
    assert snapshot(client) == before


def test_explicit_seal_and_abort_and_their_misuse(store):
    client = store.client()
    schema = pa.schema([("x", pa.int32())])
    builder = client.create_table(schema, 3, oid=shoal.ObjectID(b"t" * 20))
    assert builder.id == shoal.ObjectID(b"t" * 20)
    with pytest.raises(shoal.ObjectExists):
        client.create_table(schema, 3, oid=builder.id)
    builder["x"][:] = [1, 2, 3]
    assert builder.seal() == builder.id
    with pytest.raises(shoal.InvalidArgument):
        builder.seal()
    with pytest.raises(shoal.InvalidArgument):
        builder["x"]
    assert client.get(builder.id)["x"].to_pylist() == [1, 2, 3]
    other = client.create_table(schema, 3)
    other.abort()
    assert not client.contains(other.id)


@pytest.mark.parametrize(
    "schema",
    [
        pa.schema([("s", pa.string())]),
        pa.schema([("ok", pa.int64()), ("l", pa.list_(pa.int64()))]),
        pa.schema([("d", pa.dictionary(pa.int32(), pa.string()))]),
        pa.schema([("st", pa.struct([("a", pa.int64())]))]),
        pa.schema([("n", pa.null())]),
    ],
    ids=["string", "list", "dictionary", "struct", "null"],
)
def test_variable_width_schemas_are_refused_before_creating(store, schema):
    client = store.client()
    before = snapshot(client)
    with pytest.raises(shoal.InvalidArgument, match="fixed-width"):
        client.create_table(schema, 10)
    assert snapshot(client) == before


@pytest.mark.parametrize("rows", [-1, 1.5, True, "3"])
def test_bad_row_counts_are_refused(store, rows):
    client = store.client()
    before = snapshot(client)
    with pytest.raises(shoal.InvalidArgument):
        client.create_table(pa.schema([("x", pa.int8())]), rows)
    with pytest.raises(TypeError):
        client.create_table({"x": "int8"}, 3)
    assert snapshot(client) == before


def test_zero_rows_and_odd_widths(store):
    client = store.client()
    with client.create_table(pa.schema([("x", pa.int64()), ("f", pa.bool_())]), 0) as empty:
        assert len(empty["x"]) == 0 and len(empty["f"]) == 0
    assert client.get(empty.id).num_rows == 0
    # 13 one-byte and bit-packed rows: buffers padded inside the IPC body, still exact.
    schema = pa.schema([("a", pa.int8()), ("b", pa.bool_()), ("c", pa.int16())])
    with client.create_table(schema, 13) as builder:
        builder["a"][:] = np.arange(13)
        builder["b"][:] = 0xFF
        builder["c"][:] = -np.arange(13)
    table = client.get(builder.id)
    table.validate(full=True)
    assert table["a"].to_pylist() == list(range(13))
    assert table["b"].to_pylist() == [True] * 13
    assert table["c"].to_pylist() == [-i for i in range(13)]


def test_column_views_kept_after_seal_keep_the_object(store):
    client = store.client()
    with client.create_table(pa.schema([("x", pa.int64())]), 8) as builder:
        kept = builder["x"]
        kept[:] = 9
    client.delete(builder.id)  # deferred: the kept view still references it
    assert client.stats()["objects"] == 1
    assert list(kept) == [9] * 8
    del kept
    gc.collect()
    wait_for(lambda: client.stats()["objects"] == 0, timeout=2)


def test_engines_query_the_built_table(store):
    duckdb = needs_library("duckdb")
    client = store.client()
    with client.create_table(pa.schema([("k", pa.int32()), ("v", pa.float64())]), 1000) as builder:
        builder["k"][:] = np.arange(1000) % 10
        builder["v"][:] = 1.0
    built = client.get(builder.id)  # noqa: F841 - duckdb finds it by name
    rows = duckdb.sql("select k, sum(v) as s from built group by k order by k").fetchall()
    assert rows == [(k, 100.0) for k in range(10)]
