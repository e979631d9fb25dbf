"""shoal.plasma: pyarrow.plasma's API on shoal.

Ported from pyarrow 11's tests/test_plasma.py (same cases, same assertions where
the semantics are shared; loops shortened), plus tests of shoal's differences.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

import shoal
import shoal.plasma as plasma

DEFAULT_PLASMA_STORE_MEMORY = 10**8
SMALL_OBJECT_SIZE = 9000


def random_object_id() -> plasma.ObjectID:
    return plasma.ObjectID(np.random.bytes(20))


def generate_metadata(length: int) -> bytearray:
    metadata = bytearray(length)
    if length > 0:
        metadata[0] = random.randint(0, 255)
        metadata[-1] = random.randint(0, 255)
        for _ in range(100):
            metadata[random.randint(0, length - 1)] = random.randint(0, 255)
    return metadata


def write_to_data_buffer(buff, length: int) -> None:
    array = np.frombuffer(buff, dtype="uint8")
    if length > 0:
        array[0] = random.randint(0, 255)
        array[-1] = random.randint(0, 255)
        for _ in range(100):
            array[random.randint(0, length - 1)] = random.randint(0, 255)


def create_object_with_id(client, object_id, data_size, metadata_size, seal=True):
    metadata = generate_metadata(metadata_size)
    memory_buffer = client.create(object_id, data_size, metadata)
    write_to_data_buffer(memory_buffer, data_size)
    if seal:
        client.seal(object_id)
    return memory_buffer, metadata


def create_object(client, data_size, metadata_size=0, seal=True):
    object_id = random_object_id()
    memory_buffer, metadata = create_object_with_id(client, object_id, data_size, metadata_size, seal=seal)
    return object_id, memory_buffer, metadata


def run_python(code: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def store():
    with plasma.start_plasma_store(plasma_store_memory=DEFAULT_PLASMA_STORE_MEMORY) as (name, proc):
        yield name, proc
        # As in Plasma's teardown: the store is still alive and stops cleanly on SIGTERM.
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
        assert proc.returncode == 0


@pytest.fixture
def client(store):
    return plasma.connect(store[0])


@pytest.fixture
def client2(store):
    return plasma.connect(store[0])


# -- ObjectID --------------------------------------------------------------------------------------


def test_object_id_size():
    with pytest.raises(ValueError):
        plasma.ObjectID("hello")
    with pytest.raises(ValueError):
        plasma.ObjectID(b"hello")
    plasma.ObjectID(20 * b"0")


def test_object_id_equality_operators():
    oid1 = plasma.ObjectID(20 * b"0")
    oid2 = plasma.ObjectID(20 * b"0")
    oid3 = plasma.ObjectID(19 * b"0" + b"1")
    assert oid1 == oid2
    assert oid2 != oid3
    assert oid1 != "foo"
    assert hash(oid1) == hash(oid2)
    assert repr(oid1) == "ObjectID(" + (20 * b"0").hex() + ")"
    assert oid1.binary() == 20 * b"0"


def test_object_id_interoperates_with_shoal_ids():
    oid = plasma.ObjectID.from_random()
    assert isinstance(oid, plasma.ObjectID) and isinstance(oid, shoal.ObjectID)
    same = shoal.ObjectID(oid.binary())
    assert same == oid and oid == same and hash(same) == hash(oid)
    assert {oid: 1}[same] == 1


def test_pickle_object_ids():
    object_id = random_object_id()
    object_id2 = pickle.loads(pickle.dumps(object_id))
    assert object_id == object_id2
    assert type(object_id2) is plasma.ObjectID


def test_object_id_randomness():
    cmd = "import shoal.plasma as plasma; print(plasma.ObjectID.from_random())"
    first, second = run_python(cmd).stdout, run_python(cmd).stdout
    assert first.startswith("ObjectID(") and first != second


# -- exceptions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plasma_error", "shoal_error"),
    [
        (plasma.PlasmaObjectExists, shoal.ObjectExists),
        (plasma.PlasmaObjectNotFound, shoal.ObjectNotFound),
        (plasma.PlasmaStoreFull, shoal.StoreFull),
    ],
)
def test_exceptions_are_plasma_shoal_and_arrow_errors(plasma_error, shoal_error):
    assert issubclass(plasma_error, shoal_error)
    assert issubclass(plasma_error, pa.lib.ArrowException)


def test_connection_failure_raises_exception():
    # ARROW-1264
    start = time.monotonic()
    with pytest.raises(IOError):
        plasma.connect("unknown-store-name", num_retries=1)
    assert time.monotonic() - start < 2
    with pytest.raises(shoal.Disconnected):
        plasma.connect("unknown-store-name", num_retries=0)


# -- the store process -----------------------------------------------------------------------------


def test_start_plasma_store_contract():
    with plasma.start_plasma_store(plasma_store_memory=10**6) as (name, proc):
        assert isinstance(name, str) and os.path.exists(name)
        assert isinstance(proc, subprocess.Popen) and proc.poll() is None
        client = plasma.connect(name)
        assert client.store_socket_name == name
        client.put(1)
    # Killed at exit (SIGKILL, as Plasma did), its directory removed.
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.dirname(name))
    with pytest.raises(NotImplementedError):
        with plasma.start_plasma_store(10**6, external_store="hashtable://test"):
            pass
    with pytest.raises(Exception, match="valgrind and profiler"):
        with plasma.start_plasma_store(10**6, use_valgrind=True, use_profiler=True):
            pass


def test_store_capacity():
    with plasma.start_plasma_store(plasma_store_memory=10000) as (name, p):
        plasma_client = plasma.connect(name)
        assert plasma_client.store_capacity() == 10000


def test_plasma_client_sharing():
    # Buffers outlive their client (ARROW-2448).
    with plasma.start_plasma_store(plasma_store_memory=DEFAULT_PLASMA_STORE_MEMORY) as (name, p):
        plasma_client = plasma.connect(name)
        object_id = plasma_client.put(np.zeros(3))
        buf = plasma_client.get(object_id)
        del plasma_client
        assert (buf == np.zeros(3)).all()
        del buf


def test_plasma_list():
    with plasma.start_plasma_store(plasma_store_memory=DEFAULT_PLASMA_STORE_MEMORY) as (name, p):
        plasma_client = plasma.connect(name)

        # Test sizes
        u, _, _ = create_object(plasma_client, 11, metadata_size=7, seal=False)
        l1 = plasma_client.list()
        assert l1[u]["data_size"] == 11
        assert l1[u]["metadata_size"] == 7
        assert all(isinstance(key, plasma.ObjectID) for key in l1)

        # Test ref_count
        v = plasma_client.put(np.zeros(3))
        assert plasma_client.list()[v]["ref_count"] == 0
        a = plasma_client.get(v)
        l3 = plasma_client.list()
        assert l3[v]["ref_count"] == 1
        del a
        assert plasma_client.list()[v]["ref_count"] == 0

        # Test state
        w, _, _ = create_object(plasma_client, 3, metadata_size=0, seal=False)
        l4 = plasma_client.list()
        assert l4[w]["state"] == "created"
        assert l4[w]["construct_duration"] == -1
        plasma_client.seal(w)
        l5 = plasma_client.list()
        assert l5[w]["state"] == "sealed"

        # Test timestamps
        slack = 1.5  # seconds
        t1 = time.time()
        x, _, _ = create_object(plasma_client, 3, metadata_size=0, seal=False)
        t2 = time.time()
        l6 = plasma_client.list()
        assert t1 - slack <= l6[x]["create_time"] <= t2 + slack
        time.sleep(1.0)
        t3 = time.time()
        plasma_client.seal(x)
        t4 = time.time()
        l7 = plasma_client.list()
        assert t3 - t2 - slack <= l7[x]["construct_duration"]
        assert 0 <= l7[x]["construct_duration"] <= t4 - t1 + slack


# -- create, seal, get -----------------------------------------------------------------------------


def test_create(client):
    object_id = random_object_id()
    length = 50
    buffer = client.create(object_id, length)
    assert isinstance(buffer, pa.Buffer) and buffer.is_mutable and buffer.size == length
    memory_buffer = np.frombuffer(buffer, dtype="uint8")
    memory_buffer[:] = np.arange(length) % 256
    client.seal(object_id)
    [result] = client.get_buffers([object_id])
    assert isinstance(result, plasma.PlasmaBuffer) and not result.is_mutable
    # Zero-copy: the reader sees the very bytes the writer wrote.
    assert result.address == buffer.address
    np.testing.assert_equal(np.frombuffer(result, dtype="uint8"), np.arange(length) % 256)


def test_create_with_metadata(client):
    for length in range(0, 1000, 37):
        object_id = random_object_id()
        metadata = generate_metadata(length)
        memory_buffer = np.frombuffer(client.create(object_id, length, metadata), dtype="uint8")
        memory_buffer[:] = np.arange(length) % 256
        client.seal(object_id)
        memory_buffer = np.frombuffer(client.get_buffers([object_id])[0], dtype="uint8")
        np.testing.assert_equal(memory_buffer, np.arange(length) % 256)
        metadata_buffer = np.frombuffer(client.get_metadata([object_id])[0], dtype="uint8")
        assert bytes(metadata_buffer) == bytes(metadata)


def test_create_existing(client):
    length = 100
    for _ in range(100):
        object_id = random_object_id()
        client.create(object_id, length, generate_metadata(length))
        with pytest.raises(pa.lib.ArrowException):
            client.create(object_id, length, generate_metadata(length))
    with pytest.raises(plasma.PlasmaObjectExists):
        client.create(object_id, length)
    with pytest.raises(shoal.ObjectExists):
        client.create(object_id, length)


def test_create_and_seal(client):
    object_ids = []
    for i in range(100):
        object_id = random_object_id()
        object_ids.append(object_id)
        client.create_and_seal(object_id, i * b"a", i * b"b")

    for i in range(100):
        [data_tuple] = client.get_buffers([object_ids[i]], with_meta=True)
        assert data_tuple[1].to_pybytes() == i * b"a"
        assert data_tuple[0] == i * b"b"
        assert client.get_metadata([object_ids[i]])[0].to_pybytes() == i * b"b"

    # Creating the same object twice raises an exception.
    object_id = random_object_id()
    client.create_and_seal(object_id, b"a", b"b")
    with pytest.raises(plasma.PlasmaObjectExists):
        client.create_and_seal(object_id, b"a", b"b")

    # These objects can be evicted.
    big_object = DEFAULT_PLASMA_STORE_MEMORY // 10 * b"a"
    for _ in range(10):
        client.create_and_seal(random_object_id(), big_object, big_object)
    for i in range(10):
        assert not client.contains(object_ids[i])


def test_get(client):
    num_object_ids = 60
    # Test timing out of get with various timeouts.
    for timeout in [0, 10, 100]:
        object_ids = [random_object_id() for _ in range(num_object_ids)]
        start = time.monotonic()
        results = client.get_buffers(object_ids, timeout_ms=timeout)
        assert results == num_object_ids * [None]
        assert time.monotonic() - start >= timeout / 1000 * 0.9

    data_buffers = []
    for i in range(num_object_ids):
        if i % 2 == 0:
            data_buffer, _ = create_object_with_id(client, object_ids[i], 2000, 2000)
            data_buffers.append(data_buffer)

    # Test timing out from some but not all get calls with various timeouts.
    for timeout in [0, 10, 100]:
        data_results = client.get_buffers(object_ids, timeout_ms=timeout)
        for i in range(num_object_ids):
            if i % 2 == 0:
                array1 = np.frombuffer(data_buffers[i // 2], dtype="uint8")
                array2 = np.frombuffer(data_results[i], dtype="uint8")
                np.testing.assert_equal(array1, array2)
            else:
                assert data_results[i] is None

    # An object created by the same client but not sealed is not available.
    object_id = random_object_id()
    client.create(object_id, 10, b"metadata")
    assert client.get_buffers([object_id], timeout_ms=0, with_meta=True)[0] == (None, None)
    assert client.get_buffers([object_id], timeout_ms=1, with_meta=True)[0][1] is None
    client.seal(object_id)
    assert client.get_buffers([object_id], timeout_ms=0, with_meta=True)[0][1] is not None


def test_buffer_lifetime(client, client2):
    # ARROW-2195
    arr = pa.array([1, 12, 23, 3, 34], pa.int32())
    batch = pa.RecordBatch.from_arrays([arr], ["field1"])

    sink = pa.MockOutputStream()
    writer = pa.RecordBatchStreamWriter(sink, batch.schema)
    writer.write_batch(batch)
    writer.close()

    object_id = random_object_id()
    data_buffer = client.create(object_id, sink.size())
    stream = pa.FixedSizeBufferWriter(data_buffer)
    writer = pa.RecordBatchStreamWriter(stream, batch.schema)
    writer.write_batch(batch)
    writer.close()
    client.seal(object_id)
    del data_buffer, stream, writer

    [data_buffer] = client2.get_buffers([object_id])
    reader = pa.RecordBatchStreamReader(data_buffer)
    read_batch = reader.read_next_batch()
    # The RecordBatch keeps the object referenced without the buffer.
    del data_buffer, reader
    assert client.list()[object_id]["ref_count"] == 1
    assert client2.evict(10**9) == 0
    assert read_batch.equals(batch)
    del read_batch
    assert client.list()[object_id]["ref_count"] == 0


def test_illegal_functionality(client):
    object_id = random_object_id()
    length = 1000
    memory_buffer = client.create(object_id, length)
    with pytest.raises(Exception):  # noqa: B017 - any error will do, as in Plasma's test
        memory_buffer[length]
    client.seal(object_id)
    memory_buffer = client.get_buffers([object_id])[0]

    def illegal_assignment():
        memory_buffer[0] = chr(0)

    with pytest.raises(Exception):  # noqa: B017
        illegal_assignment()
    with pytest.raises(ValueError, match="read-only"):
        np.frombuffer(memory_buffer, dtype="uint8")[0] = 1


def test_abort(client):
    object_id = random_object_id()
    client.create(object_id, 100)
    assert client.list()[object_id]["state"] == "created"
    client.abort(object_id)
    assert object_id not in client.list()
    # The id is free again.
    client.create_and_seal(object_id, b"again")
    assert client.get_buffers([object_id])[0].to_pybytes() == b"again"
    with pytest.raises(pa.lib.ArrowException):
        client.abort(object_id)  # sealed already


def test_seal_errors(client, client2):
    with pytest.raises(plasma.PlasmaObjectNotFound):
        client.seal(random_object_id())
    object_id = random_object_id()
    client.create(object_id, 10)
    with pytest.raises(plasma.PlasmaObjectNotFound):  # Plasma's error for another client's object
        client2.seal(object_id)
    client.seal(object_id)
    with pytest.raises(pa.lib.ArrowTypeError):  # Plasma's error for sealing twice
        client.seal(object_id)


# -- values ----------------------------------------------------------------------------------------


def test_put_and_get(client):
    for value in [["hello", "world", 3, 1.0], None, "hello", b"bytes", {"a": (1, 2)}, 12345]:
        object_id = client.put(value)
        assert isinstance(object_id, plasma.ObjectID)
        [result] = client.get([object_id])
        assert result == value and type(result) is type(value)

        result = client.get(object_id)
        assert result == value

        object_id = random_object_id()
        [result] = client.get([object_id], timeout_ms=0)
        assert result == plasma.ObjectNotAvailable
        assert client.get(object_id, timeout_ms=0) is plasma.ObjectNotAvailable

    object_id = random_object_id()
    assert client.put("mine", object_id=object_id) == object_id
    assert client.get(object_id) == "mine"


def test_put_and_get_numpy_zero_copy(client):
    array = np.random.rand(100, 7)
    object_id = client.put(array)
    result = client.get(object_id)
    np.testing.assert_equal(result, array)
    assert result.dtype == array.dtype and result.shape == array.shape
    assert not result.flags.writeable
    # A view of store memory: the same bytes the data buffer shows.
    [buffer] = client.get_buffers([object_id])
    assert result.ctypes.data == buffer.address


def test_put_and_get_arrow(client):
    table = pa.table({"x": np.arange(1000), "y": [str(i) for i in range(1000)]})
    batch = table.to_batches()[0]
    values = [table, batch, pa.array([1, None, 3]), pa.chunked_array([[1, 2], [3]])]
    for value in values:
        result = client.get(client.put(value))
        assert type(result) is type(value)
        assert result.equals(value)
    # Arrow results are views of store memory, and keep the object referenced.
    object_id = client.put(table)
    result = client.get(object_id)
    [buffer] = client.get_buffers([object_id])
    address = result.column(0).chunk(0).buffers()[1].address
    assert buffer.address <= address < buffer.address + buffer.size
    del buffer
    assert client.list()[object_id]["ref_count"] == 1


def test_put_and_get_custom_class(client):
    value = CustomType(42)
    result = client.get(client.put(value))
    assert isinstance(result, CustomType) and result.val == 42
    with pytest.warns(FutureWarning):
        object_id = client.put(value, None, serialization_context=object())
    with pytest.warns(FutureWarning):
        assert client.get(object_id, -1, serialization_context=object()).val == 42


class CustomType:
    def __init__(self, val):
        self.val = val


def test_put_and_get_raw_buffer(client):
    temp_id = random_object_id()
    use_meta = b"RAW"

    def deserialize_or_output(data_tuple):
        if data_tuple[0] == use_meta:
            return data_tuple[1].to_pybytes()
        if data_tuple[1] is None:
            return plasma.ObjectNotAvailable
        return client.get(object_id)

    for value in [b"Bytes Test", temp_id.binary(), 10 * b"\x00", 123]:
        if isinstance(value, bytes):
            object_id = client.put_raw_buffer(value, metadata=use_meta)
        else:
            object_id = client.put(value)
        [result] = client.get_buffers([object_id], with_meta=True)
        result = deserialize_or_output(result)
        assert result == value

        object_id = random_object_id()
        [result] = client.get_buffers([object_id], timeout_ms=0, with_meta=True)
        result = deserialize_or_output(result)
        assert result == plasma.ObjectNotAvailable

    # numpy data through the buffer protocol; `get` of a raw object returns its buffer.
    array = np.arange(10, dtype=np.int32)
    object_id = client.put_raw_buffer(array, object_id=temp_id)
    assert object_id == temp_id
    result = client.get(object_id)
    assert isinstance(result, pa.Buffer)
    np.testing.assert_equal(np.frombuffer(result, dtype=np.int32), array)


def test_store_arrow_objects(client):
    data = np.random.randn(10, 4)
    object_id = random_object_id()
    tensor = pa.Tensor.from_numpy(data)
    data_size = pa.ipc.get_tensor_size(tensor)
    buf = client.create(object_id, data_size)
    stream = pa.FixedSizeBufferWriter(buf)
    pa.ipc.write_tensor(tensor, stream)
    client.seal(object_id)
    [tensor] = client.get_buffers([object_id])
    reader = pa.BufferReader(tensor)
    array = pa.ipc.read_tensor(reader).to_numpy()
    np.testing.assert_equal(data, array)


# -- queries, hash, delete, evict, capacity --------------------------------------------------------


def test_contains(client):
    fake_object_ids = [random_object_id() for _ in range(100)]
    real_object_ids = [random_object_id() for _ in range(100)]
    for object_id in real_object_ids:
        assert client.contains(object_id) is False
        client.create(object_id, 100)
        client.seal(object_id)
        assert client.contains(object_id)
    for object_id in fake_object_ids:
        assert not client.contains(object_id)
    for object_id in real_object_ids:
        assert client.contains(object_id)


def _create_filled(client, object_id, length, metadata, values):
    memory_buffer = np.frombuffer(client.create(object_id, length, metadata), dtype="uint8")
    memory_buffer[:] = values
    client.seal(object_id)


def test_hash(client):
    object_id1 = random_object_id()
    with pytest.raises(pa.lib.ArrowException):
        client.hash(object_id1)
    with pytest.raises(plasma.PlasmaObjectNotFound):
        client.hash(object_id1)

    length = 1000
    metadata = generate_metadata(length)
    _create_filled(client, object_id1, length, metadata, np.arange(length) % 256)
    assert client.hash(object_id1) == client.hash(object_id1)
    assert isinstance(client.hash(object_id1), bytes) and len(client.hash(object_id1)) == 8

    object_id2 = random_object_id()
    _create_filled(client, object_id2, length, metadata, np.arange(length) % 256)
    assert client.hash(object_id1) == client.hash(object_id2)

    object_id3 = random_object_id()
    metadata = generate_metadata(length)
    _create_filled(client, object_id3, length, metadata, (np.arange(length) + 1) % 256)
    assert client.hash(object_id1) != client.hash(object_id3)

    object_id4 = random_object_id()
    metadata4 = generate_metadata(length)
    _create_filled(client, object_id4, length, metadata4, (np.arange(length) + 1) % 256)
    assert client.hash(object_id1) != client.hash(object_id4)
    assert client.hash(object_id3) != client.hash(object_id4)

    # The data/metadata boundary counts.
    object_id5, object_id6 = random_object_id(), random_object_id()
    client.create_and_seal(object_id5, b"ab", b"c")
    client.create_and_seal(object_id6, b"a", b"bc")
    assert client.hash(object_id5) != client.hash(object_id6)


def test_many_hashes(client):
    hashes = []
    length = 2**8
    for i in range(256):
        object_id = random_object_id()
        _create_filled(client, object_id, length, b"", i)
        hashes.append(client.hash(object_id))
    # Each pair has two bits different.
    for i in range(length):
        object_id = random_object_id()
        values = np.zeros(length, dtype=np.uint8)
        values[i] = 1
        _create_filled(client, object_id, length, b"", values)
        hashes.append(client.hash(object_id))
    # Objects of varying length, all with value 0.
    for i in range(length):
        object_id = random_object_id()
        _create_filled(client, object_id, i, b"", 0)
        hashes.append(client.hash(object_id))
    assert len(set(hashes)) == 256 + length + length


def test_delete(client, client2):
    object_ids = [random_object_id() for _ in range(10)]
    for object_id in object_ids:
        create_object_with_id(client, object_id, 100, 100)
        assert client.contains(object_id)
    client.delete(object_ids[:1])
    assert not client.contains(object_ids[0])
    client.delete(object_ids[1:])
    for object_id in object_ids:
        assert not client.contains(object_id)
        assert object_id not in client.list()
    # Unknown ids are ignored, as in Plasma.
    client.delete([random_object_id()])

    # A referenced object disappears now and is freed when released.
    object_id = random_object_id()
    client.create_and_seal(object_id, b"payload")
    [buffer] = client2.get_buffers([object_id])
    client.delete([object_id])
    assert not client.contains(object_id)
    assert client.get_buffers([object_id], timeout_ms=0) == [None]
    assert buffer.to_pybytes() == b"payload"
    del buffer


def test_store_full(client):
    def assert_create_raises_plasma_full(size):
        partial_size = np.random.randint(size)
        with pytest.raises(plasma.PlasmaStoreFull):
            create_object(client, partial_size, size - partial_size)

    PERCENT = DEFAULT_PLASMA_STORE_MEMORY // 100

    # Keep some of the buffers in scope.
    memory_buffers = []
    _, memory_buffer, _ = create_object(client, 50 * PERCENT)
    memory_buffers.append(memory_buffer)
    # Remaining space is 50%: 50% + 1 does not fit, 20% does.
    assert_create_raises_plasma_full(50 * PERCENT + SMALL_OBJECT_SIZE)
    _, memory_buffer, _ = create_object(client, 20 * PERCENT)
    del memory_buffer
    _, memory_buffer, _ = create_object(client, 20 * PERCENT)
    del memory_buffer
    assert_create_raises_plasma_full(50 * PERCENT + SMALL_OBJECT_SIZE)

    _, memory_buffer, _ = create_object(client, 20 * PERCENT)
    memory_buffers.append(memory_buffer)
    # Remaining space is 30%.
    assert_create_raises_plasma_full(30 * PERCENT + SMALL_OBJECT_SIZE)

    _, memory_buffer, _ = create_object(client, 10 * PERCENT)
    memory_buffers.append(memory_buffer)
    # Remaining space is 20%.
    assert_create_raises_plasma_full(20 * PERCENT + SMALL_OBJECT_SIZE)


def test_use_full_memory(client2):
    # Fill the store with small objects and let them go out of scope.
    for _ in range(100):
        create_object(client2, np.random.randint(1, DEFAULT_PLASMA_STORE_MEMORY // 20), 0)
    # Objects that need the whole store fit.
    for _ in range(2):
        create_object(client2, DEFAULT_PLASMA_STORE_MEMORY, 0)
    # An object that is too large does not fit, and its id is not taken.
    object_id = random_object_id()
    for _ in range(3):
        with pytest.raises(plasma.PlasmaStoreFull):
            client2.create(object_id, DEFAULT_PLASMA_STORE_MEMORY + SMALL_OBJECT_SIZE)
    with pytest.raises(shoal.ObjectTooLarge):
        client2.create(object_id, DEFAULT_PLASMA_STORE_MEMORY + SMALL_OBJECT_SIZE)
    with pytest.raises(MemoryError):
        client2.put(np.zeros(DEFAULT_PLASMA_STORE_MEMORY, dtype=np.uint8), object_id=object_id)
    assert object_id not in client2.list()


def test_evict(client2):
    client = client2
    object_id1 = random_object_id()
    b1 = client.create(object_id1, 1000)
    client.seal(object_id1)
    del b1
    assert client.evict(1) == 1000

    object_id2 = random_object_id()
    object_id3 = random_object_id()
    b2 = client.create(object_id2, 999)
    b3 = client.create(object_id3, 998)
    client.seal(object_id3)
    del b3
    assert client.evict(1000) == 998

    object_id4 = random_object_id()
    b4 = client.create(object_id4, 997)
    client.seal(object_id4)
    del b4
    client.seal(object_id2)
    del b2
    assert client.evict(1) == 997
    assert client.evict(1) == 999

    object_id5 = random_object_id()
    object_id6 = random_object_id()
    object_id7 = random_object_id()
    b5 = client.create(object_id5, 996)
    b6 = client.create(object_id6, 995)
    b7 = client.create(object_id7, 994)
    client.seal(object_id5)
    client.seal(object_id6)
    client.seal(object_id7)
    del b5
    del b6
    del b7
    assert client.evict(2000) == 996 + 995 + 994
    assert client.evict(0) == 0
    assert client.evict(1) == 0


def test_release_is_safe(client):
    object_id = client.put(np.arange(10))
    value = client.get(object_id)
    client.release(object_id)
    client._release(object_id)
    # Nothing is released twice: the live view still pins the object.
    assert client.list()[object_id]["ref_count"] == 1
    assert client.evict(10**9) == 0
    del value
    client.release(object_id)
    assert client.list()[object_id]["ref_count"] == 0


def test_misc(client, store):
    assert client.store_socket_name == store[0]
    assert "capacity" in client.debug_string()
    client.set_client_options("name", 1000)
    assert isinstance(client.shoal_client, shoal.Client)
    client.disconnect()
    with pytest.raises(IOError):
        client.contains(random_object_id())


# -- notifications ---------------------------------------------------------------------------------

SUBSCRIBE_TEST_SIZES = [1, 10, 100, 1000]


def test_subscribe(client):
    client.subscribe()
    for i in SUBSCRIBE_TEST_SIZES:
        object_ids = [random_object_id() for _ in range(i)]
        metadata_sizes = [np.random.randint(1000) for _ in range(i)]
        data_sizes = [np.random.randint(1000) for _ in range(i)]
        for j in range(i):
            client.create(
                object_ids[j], data_sizes[j], metadata=bytearray(np.random.bytes(metadata_sizes[j]))
            )
            client.seal(object_ids[j])
        # Check that we received notifications for all of the objects.
        for j in range(i):
            recv_objid, recv_dsize, recv_msize = client.get_next_notification()
            assert object_ids[j] == recv_objid
            assert isinstance(recv_objid, plasma.ObjectID)
            assert data_sizes[j] == recv_dsize
            assert metadata_sizes[j] == recv_msize


def test_subscribe_reports_existing_objects_first(client, client2):
    existing = client.put_raw_buffer(b"abc", metadata=b"de")
    client2.subscribe()
    new = client.put_raw_buffer(b"x")
    assert client2.get_next_notification() == (existing, 3, 2)
    assert client2.get_next_notification() == (new, 1, 0)


def test_subscribe_socket(client):
    client.subscribe()
    rsock = client.get_notification_socket()
    assert rsock.family == socket.AF_UNIX and rsock.type == socket.SOCK_STREAM
    for i in SUBSCRIBE_TEST_SIZES[:3]:
        object_ids = [random_object_id() for _ in range(i)]
        metadata_sizes = [np.random.randint(1000) for _ in range(i)]
        data_sizes = [np.random.randint(1000) for _ in range(i)]
        for j in range(i):
            client.create(
                object_ids[j], data_sizes[j], metadata=bytearray(np.random.bytes(metadata_sizes[j]))
            )
            client.seal(object_ids[j])
        for j in range(i):
            (msg_len,) = struct.unpack("L", rsock.recv(8))
            content = rsock.recv(msg_len)
            recv_objids, recv_dsizes, recv_msizes = client.decode_notifications(content)
            assert object_ids[j] == recv_objids[0]
            assert data_sizes[j] == recv_dsizes[0]
            assert metadata_sizes[j] == recv_msizes[0]
    # get_next_notification reads the same socket.
    object_id = client.put_raw_buffer(b"12")
    assert client.get_next_notification() == (object_id, 2, 0)
    client.disconnect()


def test_subscribe_deletions(client2):
    # client2 holds no other references, so every object gets evicted.
    client2.subscribe()
    for i in SUBSCRIBE_TEST_SIZES[:3]:
        object_ids = [random_object_id() for _ in range(i)]
        # Add 1 to the sizes to make sure we have nonzero object sizes.
        metadata_sizes = [np.random.randint(1000) + 1 for _ in range(i)]
        data_sizes = [np.random.randint(1000) + 1 for _ in range(i)]
        for j in range(i):
            x = client2.create(
                object_ids[j], data_sizes[j], metadata=bytearray(np.random.bytes(metadata_sizes[j]))
            )
            client2.seal(object_ids[j])
        del x
        for j in range(i):
            recv_objid, recv_dsize, recv_msize = client2.get_next_notification()
            assert object_ids[j] == recv_objid
            assert data_sizes[j] == recv_dsize
            assert metadata_sizes[j] == recv_msize
        # Evicting them one by one (LRU first) notifies each deletion.
        for j in range(i):
            assert client2.evict(1) == data_sizes[j] + metadata_sizes[j]
            recv_objid, recv_dsize, recv_msize = client2.get_next_notification()
            assert object_ids[j] == recv_objid
            assert -1 == recv_dsize
            assert -1 == recv_msize

    # Nine empty objects and one that is not: evicting 1 byte evicts them all.
    num_object_ids = 10
    object_ids = [random_object_id() for _ in range(num_object_ids)]
    metadata_sizes = [0] * (num_object_ids - 1)
    data_sizes = [0] * (num_object_ids - 1)
    metadata_sizes.append(np.random.randint(1000))
    data_sizes.append(np.random.randint(1000))
    for i in range(num_object_ids):
        x = client2.create(
            object_ids[i], data_sizes[i], metadata=bytearray(np.random.bytes(metadata_sizes[i]))
        )
        client2.seal(object_ids[i])
    del x
    for i in range(num_object_ids):
        recv_objid, recv_dsize, recv_msize = client2.get_next_notification()
        assert object_ids[i] == recv_objid
        assert data_sizes[i] == recv_dsize
        assert metadata_sizes[i] == recv_msize
    assert client2.evict(1) == data_sizes[-1] + metadata_sizes[-1]
    for i in range(num_object_ids):
        recv_objid, recv_dsize, recv_msize = client2.get_next_notification()
        assert object_ids[i] == recv_objid
        assert -1 == recv_dsize
        assert -1 == recv_msize


def test_get_next_notification_needs_subscribe(client):
    with pytest.raises(IOError):
        client.get_next_notification()


# -- other processes -------------------------------------------------------------------------------

CHILD_GET = textwrap.dedent(
    """
    import sys
    import numpy as np
    import shoal.plasma as plasma

    client = plasma.connect(sys.argv[1])
    ids = [plasma.ObjectID(bytes.fromhex(h)) for h in sys.argv[2:]]
    values = client.get(ids)   # blocks until every object is sealed
    print(repr([float(np.sum(v)) for v in values]))
    """
)


def _wait_for_clients(client, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while client.shoal_client.stats()["clients"] < count:
        assert time.monotonic() < deadline, "the child never connected"
        time.sleep(0.01)


def test_get_from_another_process(store, client):
    object_ids = [random_object_id() for _ in range(10)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_GET, store[0], *(oid.binary().hex() for oid in object_ids)],
        stdout=subprocess.PIPE,
        text=True,
    )
    _wait_for_clients(client, 2)
    time.sleep(0.1)
    assert child.poll() is None  # blocked in get
    for i, object_id in enumerate(object_ids):
        client.put(np.full(4, i, dtype=np.float64), object_id=object_id)
    out, _ = child.communicate(timeout=10)
    assert child.returncode == 0
    assert eval(out) == [4.0 * i for i in range(10)]


def test_client_death_during_get(store, client):
    object_id = random_object_id()
    child = subprocess.Popen([sys.executable, "-c", CHILD_GET, store[0], object_id.binary().hex()])
    _wait_for_clients(client, 2)
    time.sleep(0.1)
    assert child.poll() is None
    child.kill()
    child.wait()
    time.sleep(0.1)
    # The store survives and serves the object.
    client.put(1, object_id=object_id)
    assert client.contains(object_id)
    assert client.contains(random_object_id()) is False


# -- a Plasma script, unchanged but for its import -------------------------------------------------

# Runs unchanged on pyarrow 11 with `import pyarrow.plasma as plasma`, printing PLASMA_OUTPUT.
PLASMA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.plasma as plasma

    with plasma.start_plasma_store(50 * 1000 * 1000) as (store_name, proc):
        client = plasma.connect(store_name)
        print("capacity", client.store_capacity())

        # Create, write in place, seal, read back.
        object_id = plasma.ObjectID(20 * b"a")
        buffer = client.create(object_id, 8, b"meta")
        print("mutable", buffer.is_mutable, len(buffer))
        np.frombuffer(buffer, dtype=np.uint8)[:] = np.arange(8)
        print("state", client.list()[object_id]["state"])
        client.seal(object_id)
        print("state", client.list()[object_id]["state"], client.contains(object_id))
        [(metadata, data)] = client.get_buffers([object_id], with_meta=True)
        print("raw", metadata, data.to_pybytes(), data.is_mutable)
        print("metadata", client.get_metadata([object_id])[0].to_pybytes())
        print("missing", client.get_buffers([plasma.ObjectID(20 * b"z")], timeout_ms=10))

        try:
            client.create(object_id, 8)
        except plasma.PlasmaObjectExists:
            print("exists")
        try:
            client.create(plasma.ObjectID.from_random(), 10**9)
        except plasma.PlasmaStoreFull:
            print("full")

        # Python values.
        for value in [[1, "two", 3.0], {"key": (1, 2)}, "text", b"bytes", 42, None]:
            print("value", repr(client.get(client.put(value))))
        array = np.arange(10, dtype=np.int64)
        result = client.get(client.put(array))
        print("numpy", type(result).__name__, result.dtype, np.array_equal(result, array))
        missing = plasma.ObjectID.from_random()
        print("missing", client.get(missing, timeout_ms=10) is plasma.ObjectNotAvailable)
        print("missing", client.get([missing], timeout_ms=0) == [plasma.ObjectNotAvailable])
        named = client.put("named", object_id=plasma.ObjectID(20 * b"n"))
        print("named", named == plasma.ObjectID(20 * b"n"), client.get(named))

        # Arrow data through raw buffers, as Plasma users did it.
        batch = pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], ["x"])
        sink = pa.MockOutputStream()
        with pa.RecordBatchStreamWriter(sink, batch.schema) as writer:
            writer.write_batch(batch)
        batch_id = plasma.ObjectID(20 * b"b")
        stream = pa.FixedSizeBufferWriter(client.create(batch_id, sink.size()))
        with pa.RecordBatchStreamWriter(stream, batch.schema) as writer:
            writer.write_batch(batch)
        client.seal(batch_id)
        [data] = client.get_buffers([batch_id])
        print("arrow", pa.RecordBatchStreamReader(data).read_next_batch().equals(batch))

        # create_and_seal, put_raw_buffer, list, hash.
        small_id = plasma.ObjectID(20 * b"c")
        client.create_and_seal(small_id, b"hello", b"m")
        info = client.list()[small_id]
        print("list", info["data_size"], info["metadata_size"], info["state"], info["ref_count"])
        raw_id = client.put_raw_buffer(b"12345", metadata=b"xy")
        print("put_raw_buffer", client.get_buffers([raw_id], with_meta=True)[0][0])
        print("hash", len(client.hash(small_id)), client.hash(small_id) == client.hash(small_id))
        client.create_and_seal(plasma.ObjectID(20 * b"d"), b"hello", b"m")
        print("hash equal", client.hash(small_id) == client.hash(plasma.ObjectID(20 * b"d")))

        # Delete, evict, notifications.
        del buffer, data, result, stream, writer
        client.delete([object_id])
        print("deleted", client.contains(object_id))
        client.evict(10**9)
        print("empty", sorted(info["state"] for info in client.list().values()))
        client.subscribe()
        first, second = plasma.ObjectID(20 * b"1"), plasma.ObjectID(20 * b"2")
        client.create_and_seal(first, 100 * b"x", b"abc")
        client.create_and_seal(second, 200 * b"x")
        print("notification", client.get_next_notification() == (first, 100, 3))
        print("notification", client.get_next_notification() == (second, 200, 0))
        print("evicted", client.evict(1))
        print("notification", client.get_next_notification() == (first, -1, -1))
        print("evicted", client.evict(1000))
        print("notification", client.get_next_notification() == (second, -1, -1))
        client.disconnect()
        print("store alive", proc.poll() is None)
    print("store stopped", proc.wait(timeout=5))
    """
)

# What pyarrow 11's Plasma prints for PLASMA_SCRIPT.
PLASMA_OUTPUT = """\
capacity 50000000
mutable True 8
state created
state sealed True
raw b'meta' b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07' False
metadata b'meta'
missing [None]
exists
full
value [1, 'two', 3.0]
value {'key': (1, 2)}
value 'text'
value b'bytes'
value 42
value None
numpy ndarray int64 True
missing True
missing True
named True named
arrow True
list 5 1 sealed 0
put_raw_buffer b'xy'
hash 8 True
hash equal True
deleted False
empty []
notification True
notification True
evicted 103
notification True
evicted 200
notification True
store alive True
store stopped -9
"""


PLASMA_PYTHON = os.path.join(os.path.dirname(__file__), "..", "..", "bench", ".venv-plasma", "bin", "python")


@pytest.mark.skipif(not os.path.exists(PLASMA_PYTHON), reason="needs bench/.venv-plasma (pyarrow 11)")
def test_plasma_script_output_on_real_plasma():
    result = subprocess.run(
        [PLASMA_PYTHON, "-W", "ignore", "-c", PLASMA_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == PLASMA_OUTPUT


def test_plasma_script_runs_unchanged_but_for_the_import():
    script = PLASMA_SCRIPT.replace("import pyarrow.plasma as plasma", "import shoal.plasma as plasma")
    assert script.count("shoal") == 1
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == PLASMA_OUTPUT
