"""Values through client.put / client.get: every Arrow type family, numpy, bytes, pickles.

Arrow results must be equal to what was put AND be views of store memory: every
buffer of the result (children, dictionaries included) lies inside the mapped
region, so nothing was copied on the way out.
"""

from __future__ import annotations

import datetime
import decimal
import gc
import pickle
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from _shoal_testing import in_region

import shoal


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One daemon for the whole module: these tests only add objects."""
    from _shoal_testing import Daemon, short_dir

    daemon = Daemon(short_dir(tmp_path_factory.mktemp("arrow")), capacity="256MiB")
    yield daemon
    gc.collect()
    daemon.teardown()


@pytest.fixture
def client(shared_store):
    client = shoal.Client(shared_store.socket)
    yield client
    client.close()


# -- zero-copy checks --------------------------------------------------------------------------


def array_buffers(array: pa.Array):
    """Every buffer of an array: buffers() covers its own and its children's, but not the
    dictionaries of dictionary-encoded arrays, wherever they are nested."""
    yield from array.buffers()
    yield from _dictionary_buffers(array)


def _dictionary_buffers(array: pa.Array):
    if isinstance(array, pa.DictionaryArray):
        yield from array_buffers(array.dictionary)
        return
    if isinstance(array, pa.StructArray | pa.UnionArray):
        children = [array.field(i) for i in range(array.type.num_fields)]
    elif isinstance(array, pa.RunEndEncodedArray):
        children = [array.values]
    elif array.type.num_fields and hasattr(array, "values"):  # lists, list views, maps
        children = [array.values]
    else:
        children = []
    for child in children:
        yield from _dictionary_buffers(child)


def arrays_of(value) -> list[pa.Array]:
    if isinstance(value, pa.Array):
        return [value]
    if isinstance(value, pa.ChunkedArray):
        return list(value.chunks)
    if isinstance(value, pa.RecordBatch):
        return list(value.columns)
    if isinstance(value, pa.Table):
        return [chunk for column in value.columns for chunk in column.chunks]
    raise TypeError(type(value))


def assert_zero_copy(client: shoal.Client, value) -> int:
    """Asserts every non-null, non-empty buffer lies in the region; returns how many."""
    checked = 0
    for array in arrays_of(value):
        for buffer in array_buffers(array):
            if buffer is None or buffer.size == 0:
                continue  # absent validity bitmaps, empty buffers: no memory to locate
            assert in_region(client, buffer.address, buffer.size), (
                f"{array.type} buffer at {buffer.address:#x} (+{buffer.size}) is outside the region "
                f"[{client.region_address:#x}, +{client.region_size:#x}): it was copied"
            )
            checked += 1
    return checked


def test_zero_copy_check_detects_copies(client):
    # The checker itself: a heap array (a copy) must be caught.
    with pytest.raises(AssertionError, match="outside the region"):
        assert_zero_copy(client, pa.array([1, 2, 3]))
    result = client.get(client.put(pa.array([1, 2, 3])))
    assert assert_zero_copy(client, result) == 1
    with pytest.raises(AssertionError, match="outside the region"):
        assert_zero_copy(client, pa.concat_arrays([result, result]))


def round_trip(client: shoal.Client, value):
    oid = client.put(value)
    result = client.get(oid)
    assert type(result) is type(value)
    assert result.equals(value), f"{result} != {value}"
    if isinstance(value, pa.Table | pa.RecordBatch):
        assert result.schema.equals(value.schema, check_metadata=True)
    else:
        assert result.type == value.type
    checked = assert_zero_copy(client, result)
    if any(len(a) and a.type != pa.null() for a in arrays_of(result)):
        assert checked, "no buffer was checked"
    return result


# -- the type families -------------------------------------------------------------------------

UTC = datetime.UTC


def _arrays() -> dict[str, pa.Array]:
    ints = {
        f"{t}": pa.array([0, 1, None, -1 if t.startswith("i") else 2, 100], type=getattr(pa, t)())
        for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    }
    extremes = {
        "int64-extremes": pa.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0]),
        "uint64-extremes": pa.array([0, np.iinfo(np.uint64).max], type=pa.uint64()),
    }
    floats = {
        "float16": pa.array(np.array([0.5, -1.5, np.inf], dtype=np.float16)),
        "float32": pa.array([1.5, None, 3.0e38, -0.0], type=pa.float32()),
        "float64": pa.array([1e300, None, float("-inf"), 3.25], type=pa.float64()),
    }
    other = {
        "null-type": pa.array([None, None, None], type=pa.null()),
        "bool": pa.array([True, False, None, True] * 5),
        "bool-no-nulls": pa.array([True, False] * 33),
        "decimal128": pa.array(
            [decimal.Decimal("1.23"), None, decimal.Decimal("-99999.99")], type=pa.decimal128(7, 2)
        ),
        "decimal128-wide": pa.array([decimal.Decimal("1" * 38)], type=pa.decimal128(38, 0)),
        "decimal256": pa.array([decimal.Decimal("-" + "9" * 50)], type=pa.decimal256(50, 0)),
        "date32": pa.array([datetime.date(2024, 2, 29), None, datetime.date(1970, 1, 1)], type=pa.date32()),
        "date64": pa.array([datetime.date(1999, 12, 31), None], type=pa.date64()),
        "time32-s": pa.array([0, 86399, None], type=pa.time32("s")),
        "time32-ms": pa.array([1, None], type=pa.time32("ms")),
        "time64-us": pa.array([datetime.time(12, 30, 1, 5), None], type=pa.time64("us")),
        "time64-ns": pa.array([1, 2, None], type=pa.time64("ns")),
        "timestamp-naive": pa.array([datetime.datetime(2020, 1, 1, 12), None], type=pa.timestamp("us")),
        "timestamp-utc": pa.array(
            [datetime.datetime(2020, 1, 1, tzinfo=UTC), None], type=pa.timestamp("ns", "UTC")
        ),
        "timestamp-tz": pa.array([0, 1_700_000_000, None], type=pa.timestamp("s", "Europe/Paris")),
        "timestamp-offset": pa.array([5, None], type=pa.timestamp("ms", "+05:30")),
        "duration-s": pa.array([1, None, -5], type=pa.duration("s")),
        "duration-ns": pa.array([datetime.timedelta(days=1, microseconds=3), None], type=pa.duration("ns")),
        "interval-mdn": pa.array([pa.MonthDayNano([1, 2, 3]), None], type=pa.month_day_nano_interval()),
        "string": pa.array(["a", "", None, "héllo wörld", "🐟" * 10]),
        "string-all-null": pa.array([None, None], type=pa.string()),
        "large_string": pa.array(["x" * 1000, None, ""], type=pa.large_string()),
        "binary": pa.array([b"\x00\xff", None, b""], type=pa.binary()),
        "large_binary": pa.array([b"abc" * 100, None], type=pa.large_binary()),
        "fixed_size_binary": pa.array([b"abcd", None, b"\0\0\0\0"], type=pa.binary(4)),
        "list": pa.array([[1, 2], None, [], [None, 3]], type=pa.list_(pa.int32())),
        "list-of-lists": pa.array([[[1], []], None, [[2, 3], None]], type=pa.list_(pa.list_(pa.int8()))),
        "large_list": pa.array([["a", None], None, []], type=pa.large_list(pa.string())),
        "fixed_size_list": pa.array([[1.0, 2.0], None, [None, 4.0]], type=pa.list_(pa.float64(), 2)),
        "struct": pa.array(
            [{"a": 1, "b": "x"}, None, {"a": None, "b": None}, {"a": 4, "b": "yy"}],
            type=pa.struct([("a", pa.int64()), ("b", pa.string())]),
        ),
        "struct-nested": pa.array(
            [{"s": {"t": [1, 2]}, "f": 1.0}, None],
            type=pa.struct([("s", pa.struct([("t", pa.list_(pa.int16()))])), ("f", pa.float32())]),
        ),
        "map": pa.array([[("a", 1), ("b", None)], None, []], type=pa.map_(pa.string(), pa.int32())),
        "dense_union": pa.UnionArray.from_dense(
            pa.array([0, 1, 0, 1], type=pa.int8()),
            pa.array([0, 0, 1, 1], type=pa.int32()),
            [pa.array([1, None]), pa.array(["a", "b"])],
            ["i", "s"],
        ),
        "sparse_union": pa.UnionArray.from_sparse(
            pa.array([0, 1, 1], type=pa.int8()),
            [pa.array([1, 2, 3]), pa.array([None, "b", "c"])],
            ["i", "s"],
        ),
        "dictionary": pa.array(["a", "b", None, "a", "c"]).dictionary_encode(),
        "dictionary-int16-index": pa.DictionaryArray.from_arrays(
            pa.array([0, 1, None, 1], type=pa.int16()), pa.array([1.5, 2.5])
        ),
        "list-of-dictionary": pa.array(
            [["x", "y"], None, ["x"]], type=pa.list_(pa.dictionary(pa.int8(), pa.string()))
        ),
    }
    if hasattr(pa, "string_view"):
        other["string_view"] = pa.array(
            ["short", None, "a string longer than twelve bytes"], type=pa.string_view()
        )
        other["binary_view"] = pa.array([b"x" * 20, None, b""], type=pa.binary_view())
    if hasattr(pa, "run_end_encoded"):
        other["run_end_encoded"] = pa.RunEndEncodedArray.from_arrays(
            pa.array([2, 5, 6], type=pa.int32()), pa.array(["a", None, "b"])
        )
    if hasattr(pa, "large_list_view"):
        other["list_view"] = pa.array([[1, 2], None, [3]], type=pa.list_view(pa.int64()))
    return {**ints, **extremes, **floats, **other}


ARRAYS = _arrays()


@pytest.mark.parametrize("name", list(ARRAYS))
def test_array_round_trip(client, name):
    array = ARRAYS[name]
    round_trip(client, array)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_sliced_array_round_trip(client, name):
    array = ARRAYS[name]
    round_trip(client, array.slice(1, max(len(array) - 2, 0)))
    round_trip(client, array.slice(len(array)))  # empty slice at the end


@pytest.mark.parametrize("name", ["int64", "string", "struct", "list", "dictionary", "dense_union", "map"])
def test_chunked_array_round_trip(client, name):
    array = ARRAYS[name]
    chunked = pa.chunked_array([array, array.slice(1), array.slice(0, 0), array], type=array.type)
    result = round_trip(client, chunked)
    assert result.num_chunks >= 3


def test_all_types_in_one_table(client):
    table = pa.table({name: array.slice(0, 2) for name, array in ARRAYS.items() if len(array) >= 2})
    result = round_trip(client, table)
    assert result.column_names == table.column_names


def test_nulls_at_various_positions(client):
    for mask in ([True, False, False], [False, False, True], [False, True, False], [True] * 3, [False] * 3):
        values = pa.array([10, 20, 30], mask=np.array(mask))
        result = round_trip(client, values)
        assert result.null_count == sum(mask)
    # Nulls straddling byte boundaries of the validity bitmap.
    long = pa.array([None if i % 9 in (0, 7, 8) else i for i in range(1000)])
    assert round_trip(client, long).null_count == long.null_count
    assert round_trip(client, long.slice(3, 500)).null_count == long.slice(3, 500).null_count


def test_empty_values(client):
    round_trip(client, pa.table({"x": pa.array([], pa.int64()), "s": pa.array([], pa.string())}))
    round_trip(client, pa.table({}))
    round_trip(client, pa.record_batch({"x": pa.array([], pa.float32())}))
    round_trip(client, pa.array([], pa.int64()))
    round_trip(client, pa.array([], pa.string()))
    round_trip(client, pa.chunked_array([], type=pa.int8()))
    round_trip(client, pa.chunked_array([pa.array([], pa.int8())]))


def test_nan_round_trip(client):
    # Array.equals treats NaN as unequal to itself: compare through numpy.
    array = pa.array([1.0, float("nan"), None, float("nan")])
    result = client.get(client.put(array))
    np.testing.assert_array_equal(result.to_numpy(zero_copy_only=False), array.to_numpy(zero_copy_only=False))
    assert result.null_count == 1
    assert_zero_copy(client, result)


def test_chunked_table_with_several_batches(client):
    batches = [
        pa.record_batch({"id": pa.array(range(i * 100, (i + 1) * 100)), "name": pa.array([f"n{i}"] * 100)})
        for i in range(5)
    ]
    table = pa.Table.from_batches(batches)
    result = round_trip(client, table)
    assert result.num_rows == 500
    assert [len(c) for c in result.column("id").chunks] == [100] * 5
    # Columns chunked differently from one another.
    ragged = pa.table(
        {
            "a": pa.chunked_array([[1, 2], [3], [4, 5, 6]]),
            "b": pa.chunked_array([["x"], ["y", "z", None, "w", "v"]]),
        }
    )
    round_trip(client, ragged)


def test_record_batch_and_schema_metadata(client):
    schema = pa.schema(
        [pa.field("x", pa.int32(), nullable=False, metadata={"unit": "m"}), pa.field("y", pa.string())],
        metadata={"origin": "test", "version": "3"},
    )
    batch = pa.record_batch([pa.array([1, 2, 3], pa.int32()), pa.array(["a", None, "c"])], schema=schema)
    result = round_trip(client, batch)
    assert result.schema.metadata == {b"origin": b"test", b"version": b"3"}
    assert result.schema.field("x").metadata == {b"unit": b"m"}
    assert not result.schema.field("x").nullable
    table = round_trip(client, pa.Table.from_batches([batch, batch]))
    assert table.schema.metadata == schema.metadata


def test_large_table_is_zero_copy(client):
    table = pa.table(
        {"x": np.arange(2_000_000, dtype=np.int64), "y": np.random.default_rng(1).random(2_000_000)}
    )
    result = round_trip(client, table)
    buffer = result.column("x").chunk(0).buffers()[1]
    assert buffer.size >= 16_000_000
    assert in_region(client, buffer.address, buffer.size)


def test_results_keep_objects_referenced_until_garbage(client):
    oid = client.put(pa.table({"x": [1, 2, 3]}))
    table = client.get(oid)
    column = table.column("x")
    del table
    gc.collect()
    assert next(o for o in client.list() if o.id == oid).ref_count == 1
    assert column.to_pylist() == [1, 2, 3]
    del column
    gc.collect()
    assert next(o for o in client.list() if o.id == oid).ref_count == 0


def test_get_many_arrow_values(client):
    values = [pa.array([1, 2]), pa.table({"a": ["x"]}), pa.chunked_array([[1.5]])]
    oids = [client.put(v) for v in values]
    missing = shoal.ObjectID.from_random()
    results = client.get([*oids, missing], timeout_ms=0)
    assert results[-1] is None
    for value, result in zip(values, results, strict=False):
        assert result.equals(value)
        assert_zero_copy(client, result)


# -- numpy -------------------------------------------------------------------------------------

NUMPY = {
    "int8": np.arange(-5, 5, dtype=np.int8),
    "uint16-2d": np.arange(12, dtype=np.uint16).reshape(3, 4),
    "int32-3d": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
    "int64": np.arange(1000, dtype=np.int64),
    "uint64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "float16": np.linspace(0, 1, 7, dtype=np.float16),
    "float32-2d": np.ones((5, 7), dtype=np.float32),
    "float64": np.array([np.nan, np.inf, -0.0, 1e-300]),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "complex128": np.array([[1 + 2j]], dtype=np.complex128),
    "bool": np.array([True, False, True]),
    "datetime64": np.array(["2024-01-01", "NaT"], dtype="datetime64[ns]"),
    "timedelta64": np.array([1, -2], dtype="timedelta64[ms]"),
    "unicode": np.array(["abc", "dé", ""], dtype="U3"),
    "bytes": np.array([b"ab", b"c"], dtype="S2"),
    "big-endian": np.arange(6, dtype=">i4").reshape(2, 3),
    "0-d": np.array(3.5),
    "0-d-int": np.array(7, dtype=np.int16),
    "empty": np.zeros(0, dtype=np.float64),
    "empty-2d": np.zeros((0, 5), dtype=np.int32),
    "empty-middle": np.zeros((3, 0, 2), dtype=np.int8),
    "fortran-order": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "strided": np.arange(20)[::3],
    "transposed": np.arange(6).reshape(2, 3).T,
}


@pytest.mark.parametrize("name", list(NUMPY))
def test_numpy_round_trip(client, name):
    array = NUMPY[name]
    result = client.get(client.put(array))
    assert isinstance(result, np.ndarray)
    assert result.dtype == array.dtype
    assert result.shape == array.shape
    np.testing.assert_array_equal(result, array)
    assert not result.flags.writeable
    if result.nbytes:
        assert in_region(client, result.ctypes.data, result.nbytes)


def test_arrays_of_one_shape_and_equal_itemsize_keep_their_own_dtype(client):
    # The metadata is kept per (shape, dtype): arrays alike but for the dtype must not
    # share it (byte order, kind, field layout).
    fields = [("a", "u1"), ("b", "<i4")]
    arrays = [
        np.arange(4, dtype="<i4"),
        np.arange(4, dtype=">i4"),
        np.arange(4, dtype="<f4"),
        np.arange(4, dtype="<u4"),
        np.zeros(2, dtype=np.dtype(fields, align=True)),
        np.zeros(2, dtype=np.dtype(fields, align=False)),
        np.zeros(2, dtype=[("x", "<i4"), ("y", "<i4")]),
    ]
    for _ in range(2):  # the second time, from the kept metadata
        for array in arrays:
            result = client.get(client.put(array))
            assert result.dtype == array.dtype, f"{array.dtype} came back as {result.dtype}"
            np.testing.assert_array_equal(result, array)


def test_numpy_structured_dtype_round_trip(client):
    array = np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", "<f8")])
    result = client.get(client.put(array))
    assert result.dtype == array.dtype, f"dtype {array.dtype} came back as {result.dtype}"
    assert result["a"].tolist() == [1, 3]


def test_numpy_result_is_read_only(client):
    result = client.get(client.put(np.arange(10)))
    with pytest.raises(ValueError):
        result[0] = 1


def test_object_arrays_are_pickled(client):
    array = np.array([{"a": 1}, None, "x"], dtype=object)
    result = client.get(client.put(array))
    assert result.dtype == object and result.tolist() == array.tolist()


# -- bytes and pickles -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"hello",
        bytes(range(256)) * 100,
        bytearray(b"mutable"),
        memoryview(b"view"),
        pa.py_buffer(b"arrow"),
    ],
    ids=["empty", "short", "long", "bytearray", "memoryview", "pa.Buffer"],
)
def test_bytes_round_trip(client, value):
    result = client.get(client.put(value))
    assert isinstance(result, pa.Buffer)
    assert result.to_pybytes() == bytes(value)
    if result.size:
        assert in_region(client, result.address, result.size)


def test_bytes_from_multidimensional_memoryview(client):
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    result = client.get(client.put(memoryview(array)))
    assert result.to_pybytes() == array.tobytes()


@dataclass
class Point:
    x: int
    y: str


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "a string",
        [1, "two", 3.0, None],
        {"nested": {"dict": [1, 2]}, "t": (1, 2)},
        {1, 2, 3},
        Point(1, "y"),
        decimal.Decimal("1.5"),
        datetime.datetime(2020, 1, 1, tzinfo=UTC),
        pa.int64(),
    ],
    ids=lambda v: type(v).__name__,
)
def test_pickled_values(client, value):
    oid = client.put(value)
    result = client.get(oid)
    assert result == value
    metadata = bytes(client.get_buffer(oid).metadata())
    assert metadata == b"shoal/pickle"
    assert pickle.loads(bytes(client.get_buffer(oid))) == value


def test_put_with_explicit_id(client):
    oid = shoal.ObjectID.from_random()
    assert client.put(pa.array([1]), oid) == oid
    assert client.put(b"x", shoal.ObjectID.from_random().binary()) is not None
    assert client.get(oid.binary()).equals(pa.array([1]))


def test_a_schema_already_seen_is_not_decoded_again(client):
    # shoal._ipc keeps each distinct schema decoded: a second object of one schema reuses it.
    from shoal import _ipc

    schema = pa.schema([("x", pa.int64()), ("label", pa.string())], metadata={"run": "schema-cache"})
    first = client.get(client.put(pa.table({"x": [1, 2], "label": ["a", None]}, schema=schema)))
    before = _ipc._schema.cache_info()
    second = client.get(client.put(pa.table({"x": [3], "label": ["b"]}, schema=schema)))
    after = _ipc._schema.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)
    assert second.schema is first.schema or second.schema.equals(first.schema, check_metadata=True)
    assert second.to_pydict() == {"x": [3], "label": ["b"]}
    assert_zero_copy(client, second)


@pytest.mark.parametrize("limit", [None, 1, 2, 9])
def test_ipc_stream_reader_equals_pyarrows(client, limit):
    # Several batches, an empty one among them; `limit` the first few.
    from shoal import _codec, _ipc

    batches = [
        pa.record_batch({"x": pa.array(range(n), pa.int32()), "s": pa.array(map(str, range(n)), pa.string())})
        for n in (3, 0, 5)
    ]
    table = pa.Table.from_batches(batches)
    buffer = client.get_buffer(client.put(table))
    assert bytes(buffer.metadata()) == _codec.TAG_ARROW + b"table"
    data = pa.py_buffer(buffer)
    read = _ipc.batches(data, limit)
    assert read is not None
    schema, got = read
    want = list(pa.ipc.open_stream(data))[:limit]
    assert schema.equals(table.schema) and len(got) == len(want)
    assert all(a.equals(b) for a, b in zip(got, want, strict=True))
    for batch in got:
        assert_zero_copy(client, batch)


def test_ipc_streams_left_to_pyarrow(client):
    # Dictionary batches and a stream too short to hold a message: None, pyarrow reads them.
    from shoal import _ipc

    table = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    data = pa.py_buffer(client.get_buffer(client.put(table)))
    assert _ipc.batches(data) is None
    assert client.get(client.put(table)).equals(table)
    assert _ipc.batches(pa.py_buffer(b"\xff\xff\xff\xff")) is None
