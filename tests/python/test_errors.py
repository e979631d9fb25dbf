"""Bad input of every kind: a clear, typed exception and no change to the store.

Also the daemon's robustness: malformed frames on raw sockets, clients killed
mid-operation. Each test compares client.list() and stats()["used"] before/after.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import struct
import threading
import time

import numpy as np
import pytest
from _shoal_testing import PROTOCOL_VERSION, MiB, snapshot, wait_for

import shoal

OID = shoal.ObjectID


@pytest.fixture
def populated(store):
    """A client and a few sealed objects whose bytes must survive every test."""
    client = store.client()
    rng = np.random.default_rng(11)
    objects = {}
    for size in (0, 1, 100, 70_000, 2 * MiB):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        objects[client.put(data)] = data
    return client, objects


def assert_intact(client: shoal.Client, objects: dict) -> None:
    for oid, data in objects.items():
        assert client.contains(oid)
        buffer = client.get_buffer(oid, timeout_ms=0)
        assert bytes(buffer) == data, f"object {oid} changed"
        assert bytes(buffer.metadata()) == b"shoal/bytes"


def assert_unchanged(client, before) -> None:
    gc.collect()
    assert snapshot(client) == before


# -- ids that do not exist ---------------------------------------------------------------------


def test_unknown_id(populated):
    client, objects = populated
    before = snapshot(client)
    missing = OID.from_random()
    assert client.get_buffers([missing], timeout_ms=0) == [None]
    assert client.get([missing], timeout_ms=10) == [None]
    with pytest.raises(shoal.ObjectNotFound) as info:
        client.get(missing, timeout_ms=0)
    assert isinstance(info.value, KeyError)
    assert missing.hex() in str(info.value)
    with pytest.raises(KeyError):
        client.get_buffer(missing, timeout_ms=0)
    with pytest.raises(shoal.ObjectNotFound) as info:
        client.delete(missing)
    assert missing.hex() in str(info.value)
    with pytest.raises(shoal.ObjectNotFound):
        client.seal(missing)
    with pytest.raises(shoal.ObjectNotFound):
        client.abort(missing)
    assert not client.contains(missing)
    assert_unchanged(client, before)
    assert_intact(client, objects)


def test_delete_many_with_one_unknown_deletes_the_others(populated):
    client, objects = populated
    a, b = client.put(b"a"), client.put(b"b")
    missing = OID.from_random()
    with pytest.raises(shoal.ObjectNotFound):
        client.delete([a, missing, b])
    assert not client.contains(a) and not client.contains(b)
    assert_intact(client, objects)


# -- ids that exist ----------------------------------------------------------------------------


def test_create_existing_sealed_id(populated):
    client, objects = populated
    oid = next(iter(objects))
    before = snapshot(client)
    with pytest.raises(shoal.ObjectExists) as info:
        client.create(oid, 10)
    assert oid.hex() in str(info.value)
    with pytest.raises(shoal.ObjectExists):
        client.put(b"other", oid)
    with pytest.raises(shoal.ObjectExists):
        client.create_array(oid, 4, np.int32)
    with pytest.raises(shoal.ObjectExists):
        client.put_batch([OID.from_random(), oid], [b"new", b"clash"])  # all or nothing
    assert_unchanged(client, before)
    assert_intact(client, objects)


def test_create_existing_unsealed_id(populated, store):
    client, objects = populated
    oid = OID.from_random()
    buffer = client.create(oid, 10)
    before = snapshot(client)
    with pytest.raises(shoal.ObjectExists):
        client.create(oid, 10)
    other = store.client()
    with pytest.raises(shoal.ObjectExists):
        other.create(oid, 20)
    assert_unchanged(client, before)
    memoryview(buffer)[:] = b"0123456789"
    client.seal(oid)
    assert bytes(client.get_buffer(oid)) == b"0123456789"
    assert_intact(client, objects)


def test_put_batch_with_duplicate_ids_creates_nothing(populated):
    client, objects = populated
    before = snapshot(client)
    oid = OID.from_random()
    with pytest.raises(shoal.ObjectExists):
        client.put_batch([oid, OID.from_random(), oid], [b"1", b"2", b"3"])
    assert_unchanged(client, before)
    with pytest.raises(ValueError):
        client.put_batch([oid], [b"1", b"2"])
    with pytest.raises(ValueError):
        client.put_batch([oid], [b"1"], metadata=[b"a", b"b"])
    with pytest.raises((TypeError, ValueError)):  # not contiguous
        client.put_batch([oid], [np.arange(10)[::2]])
    with pytest.raises((TypeError, ValueError)):
        client.put(memoryview(np.arange(10))[::2])
    assert_unchanged(client, before)
    assert_intact(client, objects)


def test_seal_twice_and_abort_after_seal(populated):
    client, objects = populated
    oid = OID.from_random()
    buffer = client.create(oid, 3)
    memoryview(buffer)[:] = b"abc"
    client.seal(oid)
    before = snapshot(client)
    with pytest.raises(shoal.ObjectAlreadySealed):
        client.seal(oid)
    with pytest.raises(shoal.ObjectAlreadySealed):
        client.abort(oid)
    with pytest.raises(shoal.ObjectAlreadySealed):
        client.seal(next(iter(objects)))  # someone's sealed object
    assert_unchanged(client, before)
    assert bytes(client.get_buffer(oid)) == b"abc"
    assert_intact(client, objects)


def test_seal_is_all_or_nothing(populated):
    client, objects = populated
    good = OID.from_random()
    buffer = client.create(good, 1)
    before = snapshot(client)
    with pytest.raises(shoal.ObjectNotFound):
        client.seal([good, OID.from_random()])
    with pytest.raises(shoal.InvalidArgument):
        client.seal([good, good])
    assert_unchanged(client, before)
    assert not client.contains(good)
    client.seal(good)
    assert client.contains(good)
    del buffer


def test_sealing_or_aborting_another_clients_object(populated, store):
    owner, objects = populated
    intruder = store.client()
    oid = OID.from_random()
    buffer = owner.create(oid, 5)
    memoryview(buffer)[:] = b"mine!"
    before = snapshot(owner)
    with pytest.raises(shoal.NotOwner) as info:
        intruder.seal(oid)
    assert oid.hex() in str(info.value)
    with pytest.raises(shoal.NotOwner):
        intruder.abort(oid)
    with pytest.raises(shoal.ObjectNotSealed):
        intruder.delete(oid)
    with pytest.raises(shoal.ObjectNotSealed):
        owner.delete(oid)
    assert_unchanged(owner, before)
    owner.seal(oid)
    assert bytes(intruder.get_buffer(oid)) == b"mine!"
    assert_intact(owner, objects)


# -- sizes -------------------------------------------------------------------------------------


def test_object_larger_than_capacity(populated):
    client, objects = populated
    before = snapshot(client)
    capacity = client.capacity
    for size, metadata in (
        (capacity + 1, None),
        (capacity - 10, b"m" * 100),
        (2**63, None),
        (2**64 - 1, None),
    ):
        with pytest.raises(shoal.ObjectTooLarge) as info:
            client.create(OID.from_random(), size, metadata)
        assert isinstance(info.value, shoal.StoreFull) and isinstance(info.value, MemoryError)
        assert str(capacity) in str(info.value)
    with pytest.raises(shoal.ObjectTooLarge):
        client.create_array(OID.from_random(), (capacity // 8 + 1,), np.float64)
    with pytest.raises(shoal.ObjectTooLarge):
        client.put_batch([OID.from_random()], [b"x"], metadata=[b"m" * (capacity + 1)])
    with pytest.raises(shoal.InvalidArgument):  # data + metadata overflows 64 bits
        client.create(OID.from_random(), 2**64 - 1, b"x")
    # Sizes Python cannot even express on the wire.
    with pytest.raises((OverflowError, ValueError)):
        client.create(OID.from_random(), -1)
    with pytest.raises((OverflowError, ValueError)):
        client.create(OID.from_random(), 2**64)
    with pytest.raises((OverflowError, ValueError)):
        client.create(OID.from_random(), 10, timeout_ms=-1)
    assert_unchanged(client, before)
    assert_intact(client, objects)


def test_an_object_of_exactly_the_capacity_fits(store):
    client = store.client()
    oid = OID.from_random()
    buffer = client.create(oid, client.capacity)
    assert client.stats()["used"] == client.capacity
    client.abort(oid)
    del buffer
    assert client.stats()["used"] == 0


def test_store_full_of_referenced_objects_times_out(populated):
    client, objects = populated
    held = client.get_buffer(client.put(b"\1" * (40 * MiB)))  # referenced: not evictable
    before = snapshot(client)
    start = time.monotonic()
    with pytest.raises(shoal.StoreFull) as info:
        client.create(OID.from_random(), 30 * MiB, timeout_ms=300)
    elapsed = time.monotonic() - start
    assert not isinstance(info.value, shoal.ObjectTooLarge)
    assert 0.3 <= elapsed < 5, elapsed
    assert "used" in str(info.value)

    start = time.monotonic()
    with pytest.raises(shoal.StoreFull):
        client.put(b"\2" * (30 * MiB))  # timeout 0: fails at once
    assert time.monotonic() - start < 1
    with pytest.raises(shoal.StoreFull):
        client.put_batch([OID.from_random(), OID.from_random()], [b"x" * (15 * MiB)] * 2, timeout_ms=100)
    assert_unchanged(client, before)
    assert bytes(memoryview(held)[:2]) == b"\1\1"
    assert_intact(client, objects)


def test_waiting_create_succeeds_when_memory_is_released(store):
    holder, waiter = store.client(), store.client()
    big = holder.put(b"\1" * (40 * MiB))
    held = holder.get_buffer(big)
    result: dict = {}

    def create() -> None:
        start = time.monotonic()
        try:
            oid = waiter.put(b"\2" * (30 * MiB), timeout_ms=10_000)
            result["oid"] = oid
        except Exception as err:  # reported below
            result["error"] = err
        result["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=create)
    thread.start()
    time.sleep(0.2)  # let the create start waiting (what we test is that it waits)
    assert thread.is_alive(), result
    del held  # the only reference: `big` becomes evictable
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert "error" not in result, result
    assert 0.15 <= result["elapsed"] < 5
    assert not holder.contains(big)  # evicted to make room
    assert holder.get(result["oid"]).to_pybytes()[:2] == b"\2\2"


def test_waiting_create_succeeds_when_another_client_aborts(store):
    holder, waiter = store.client(), store.client()
    pending = OID.from_random()
    buffer = holder.create(pending, 50 * MiB)
    outcome: list = []
    thread = threading.Thread(
        target=lambda: outcome.append(waiter.create(OID.from_random(), 30 * MiB, timeout_ms=10_000))
    )
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    holder.abort(pending)
    del buffer
    thread.join(10)
    assert not thread.is_alive() and len(outcome) == 1 and len(outcome[0]) == 30 * MiB


# -- ids and arguments -------------------------------------------------------------------------


def test_object_id_validation(populated):
    client, objects = populated
    before = snapshot(client)
    for bad in (b"", b"short", b"x" * 19, b"x" * 21):
        with pytest.raises(ValueError):
            OID(bad)
        with pytest.raises((TypeError, ValueError)):
            client.get(bad, timeout_ms=0)
        with pytest.raises((TypeError, ValueError)):
            client.create(bad, 10)
        with pytest.raises((TypeError, ValueError)):
            client.put(b"x", bad)
        with pytest.raises((TypeError, ValueError)):
            client.delete(bad)
        with pytest.raises((TypeError, ValueError)):
            client.contains(bad)
        with pytest.raises((TypeError, ValueError)):
            client.seal(bad)
        with pytest.raises((TypeError, ValueError)):
            client.abort(bad)
        with pytest.raises((TypeError, ValueError)):
            client.put_batch([bad], [b"x"])
        with pytest.raises((TypeError, ValueError)):
            client.get_buffers([OID.from_random(), bad], timeout_ms=0)
    with pytest.raises(ValueError):
        OID.from_hex("zz" * 20)
    with pytest.raises(ValueError):
        OID.from_hex("ab")
    with pytest.raises(TypeError):
        OID("a string of 20 chars")
    with pytest.raises((TypeError, ValueError)):
        client.get(12345, timeout_ms=0)
    with pytest.raises((TypeError, ValueError)):
        client.contains("x" * 20)
    assert_unchanged(client, before)
    assert_intact(client, objects)


def test_create_array_bad_arguments_create_nothing(populated):
    client, objects = populated
    before = snapshot(client)
    with pytest.raises(TypeError):
        client.create_array(OID.from_random(), 3, object)
    with pytest.raises(TypeError):
        client.create_array(OID.from_random(), 3, "not a dtype")
    with pytest.raises(ValueError):
        client.create_array(OID.from_random(), -1)
    with pytest.raises(ValueError):
        client.create_array(OID.from_random(), (4, -2))
    assert_unchanged(client, before)
    # Negative dimensions whose product is positive (or zero), or a product that overflows,
    # are just as invalid: they must fail before anything is created.
    for shape in ((-2, -3), (0, -1), (2**32, 2**32)):
        with pytest.raises(ValueError):
            client.create_array(OID.from_random(), shape)
        assert_unchanged(client, before)
    assert_intact(client, objects)


def test_calls_after_close_raise_disconnected(store):
    client = store.client()
    oid = client.put(b"kept")
    buffer = client.get_buffer(oid)
    client.close()
    with pytest.raises(shoal.Disconnected) as info:
        client.stats()
    assert isinstance(info.value, ConnectionError)
    with pytest.raises(shoal.Disconnected):
        client.put(b"x")
    del buffer  # releasing through a closed connection is silent
    gc.collect()
    observer = store.client()
    wait_for(lambda: observer.stats()["referenced"] == 0, timeout=2)
    assert observer.contains(oid)


def test_daemon_killed_under_a_client(store):
    client = store.client()
    oid = client.put(b"survives in my mapping")
    buffer = client.get_buffer(oid)
    store.kill()
    with pytest.raises(shoal.Disconnected):
        client.stats()
    with pytest.raises(shoal.Disconnected):
        client.get(oid, timeout_ms=0)
    with pytest.raises(shoal.Disconnected):
        shoal.Client(store.socket)
    assert bytes(buffer) == b"survives in my mapping"  # the mapping outlives the daemon
    del buffer
    gc.collect()


# -- raw sockets -------------------------------------------------------------------------------

HELLO, CREATE, SEAL, GET, RELEASE, STATS, LIST = 0x01, 0x02, 0x03, 0x05, 0x06, 0x0A, 0x09
ERROR, WELCOME, OBJECTS, STATS_REPLY = 0x81, 0x82, 0x84, 0x87


def frame(opcode: int, payload: bytes = b"", flags: int = 0, length: int | None = None) -> bytes:
    return struct.pack("<IHH", len(payload) if length is None else length, opcode, flags) + payload


def hello(version: int = PROTOCOL_VERSION) -> bytes:
    return frame(HELLO, struct.pack("<II", version, os.getpid()))


class Raw:
    """A hand-rolled protocol client."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(path)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, n: int, first: bytes = b"") -> bytes:
        data = first
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, f"connection closed after {len(data)} of {n} bytes"
            data += chunk
        return data

    def recv_frame(self) -> tuple[int, bytes, list[int]]:
        head, fds, _, _ = socket.recv_fds(self.sock, 8, 4)
        head = self._exactly(8, head)
        length, opcode, flags = struct.unpack("<IHH", head)
        assert flags == 0
        return opcode, self._exactly(length), list(fds)

    def handshake(self) -> tuple[int, ...]:
        self.send(hello())
        opcode, payload, fds = self.recv_frame()
        assert opcode == WELCOME, (opcode, payload)
        assert len(fds) == 1, "the region's fd travels with the Welcome"
        assert os.fstat(fds[0]).st_size > 0
        for fd in fds:
            os.close(fd)
        return struct.unpack("<IIQQQI", payload)

    def dropped(self, timeout: float = 5.0) -> bool:
        """True once the daemon has closed the connection (EOF or reset)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(4096):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def assert_still_serving(store, client, objects) -> None:
    assert_intact(client, objects)
    other = store.client()
    assert other.get(other.put(b"fresh")).to_pybytes() == b"fresh"
    other.close()
    wait_for(lambda: client.stats()["clients"] == 1, timeout=2, message="raw clients dropped")


GARBAGE_BEFORE_HELLO = {
    "random-bytes": random.Random(1).randbytes(1000),
    "oversized-frame": frame(STATS, length=(64 << 20) + 1),
    "huge-length": b"\xff\xff\xff\xff\x01\x00\x00\x00",
    "nonzero-flags": frame(HELLO, struct.pack("<II", 1, 1), flags=1),
    "request-before-hello": frame(STATS),
    "unknown-opcode": frame(0x7777),
    "reply-opcode": frame(WELCOME, b"\0" * 32),
    "truncated-hello": frame(HELLO, struct.pack("<I", 1)),
    "hello-trailing-bytes": frame(HELLO, struct.pack("<IIB", 1, 1, 0)),
}


@pytest.mark.parametrize("name", list(GARBAGE_BEFORE_HELLO))
def test_garbage_on_a_raw_socket_drops_only_that_client(store, populated, name):
    client, objects = populated
    before = snapshot(client)
    raw = Raw(store.socket)
    raw.send(GARBAGE_BEFORE_HELLO[name])
    raw.sock.shutdown(socket.SHUT_WR)  # a partial frame then EOF is malformed too
    assert raw.dropped(), f"daemon kept a client that sent {name}"
    raw.close()
    assert_unchanged(client, before)
    assert_still_serving(store, client, objects)


def test_truncated_frame_then_hang_up(store, populated):
    client, objects = populated
    for data in (b"\x10", frame(GET, b"\0" * 5, length=100), hello()[:-1]):
        raw = Raw(store.socket)
        raw.send(data)
        raw.close()
    assert_still_serving(store, client, objects)


def test_many_random_connections(store, populated):
    client, objects = populated
    before = snapshot(client)
    rng = random.Random(2024)
    for i in range(40):
        raw = Raw(store.socket)
        if i % 2:
            raw.handshake()
        raw.send(rng.randbytes(rng.randrange(1, 300)))
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.dropped()
        raw.close()
    assert_unchanged(client, before)
    assert_still_serving(store, client, objects)


GARBAGE_AFTER_HELLO = {
    "unknown-opcode": frame(0x00FF),
    "hello-twice": hello(),
    "bad-bool": frame(SEAL, b"\x02\xff" + struct.pack("<I", 0)),
    "bad-durability": frame(SEAL, b"\x01\x07" + struct.pack("<I", 0)),
    "forged-count": frame(CREATE, struct.pack("<II", 0, 0xFFFFFFFF) + b"\0" * 32),
    "count-exceeds-payload": frame(GET, struct.pack("<qI", 0, 3) + b"\0" * 40),
    "trailing-bytes": frame(STATS, b"\0"),
    "short-id": frame(0x08, b"\0" * 19),
    "random": random.Random(3).randbytes(500),
    "valid-then-garbage": frame(STATS) + b"\x00" * 8 + frame(0x1234),
}


@pytest.mark.parametrize("name", list(GARBAGE_AFTER_HELLO))
def test_valid_hello_then_garbage(store, populated, name):
    client, objects = populated
    before = snapshot(client)
    raw = Raw(store.socket)
    version, client_id, region_size, capacity, line_size, flags = raw.handshake()
    assert (version, region_size, capacity, line_size, flags) == (PROTOCOL_VERSION, 64 * MiB, 64 * MiB, 64, 0)
    assert client_id > 0
    raw.send(GARBAGE_AFTER_HELLO[name])
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.dropped(), f"daemon kept a client that sent {name}"
    raw.close()
    assert_unchanged(client, before)
    assert_still_serving(store, client, objects)


PIPELINED_BAD_FRAMES = {
    "undecodable-frame": frame(0x1234),  # fails in the decoder
    "second-hello": hello(),  # decodes, but is a protocol error
}


@pytest.mark.parametrize("name", list(PIPELINED_BAD_FRAMES))
def test_replies_before_a_bad_frame_are_sent(store, populated, name):
    """Requests pipelined before a malformed one are answered, then the connection drops."""
    client, objects = populated
    raw = Raw(store.socket)
    raw.handshake()
    raw.send(frame(STATS) + PIPELINED_BAD_FRAMES[name])
    opcode, payload, _ = raw.recv_frame()
    assert opcode == STATS_REPLY
    assert struct.unpack_from("<Q", payload)[0] == 64 * MiB
    assert raw.dropped()
    raw.close()
    assert_still_serving(store, client, objects)


def test_version_mismatch_is_answered_even_when_pipelined(store, populated):
    client, objects = populated
    raw = Raw(store.socket)
    raw.send(hello(version=0) + frame(STATS))
    opcode, payload, _ = raw.recv_frame()
    assert opcode == ERROR and struct.unpack_from("<H", payload)[0] == 14
    assert raw.dropped()
    raw.close()
    assert_still_serving(store, client, objects)


def test_hello_with_wrong_protocol_version(store, populated):
    client, objects = populated
    raw = Raw(store.socket)
    raw.send(hello(version=99))
    opcode, payload, fds = raw.recv_frame()
    assert opcode == ERROR and fds == []
    (kind,) = struct.unpack_from("<H", payload)
    (length,) = struct.unpack_from("<I", payload, 2)
    message = payload[6 : 6 + length].decode()
    assert kind == 14, (kind, message)  # VersionMismatch
    assert "99" in message and str(PROTOCOL_VERSION) in message
    # Not welcomed: the daemon did not hand out the region; a correct Hello still works.
    version, *_ = raw.handshake()
    assert version == PROTOCOL_VERSION
    raw.send(frame(STATS))
    opcode, payload, _ = raw.recv_frame()
    assert opcode == STATS_REPLY
    assert struct.unpack_from("<Q", payload)[0] == 64 * MiB
    raw.close()
    assert_still_serving(store, client, objects)


def test_wrong_version_then_other_request_is_refused(store, populated):
    client, objects = populated
    raw = Raw(store.socket)
    raw.send(hello(version=0))
    opcode, _, _ = raw.recv_frame()
    assert opcode == ERROR
    raw.send(frame(STATS))
    assert raw.dropped(), "a client that was never welcomed must not get stats"
    raw.close()
    assert_still_serving(store, client, objects)


def test_raw_release_of_a_reference_it_does_not_hold(store, populated):
    """A client cannot release references that belong to another client."""
    client, objects = populated
    oid = next(iter(objects))
    held = client.get_buffer(oid)
    raw = Raw(store.socket)
    raw.handshake()
    raw.send(frame(RELEASE, struct.pack("<I", 1) + oid.binary()) * 3)
    raw.send(frame(GET, struct.pack("<qI", 0, 1) + oid.binary()))
    opcode, payload, _ = raw.recv_frame()  # the get answers after the releases ran
    assert opcode == OBJECTS
    assert struct.unpack_from("<IB", payload) == (1, 1)
    raw.close()
    wait_for(lambda: client.stats()["clients"] == 1, timeout=2)
    assert next(o for o in client.list() if o.id == oid).ref_count == 1  # ours, still held
    assert client.evict(1 << 40) > 0
    assert client.contains(oid)
    assert bytes(held) == objects[oid]


# -- killed clients ----------------------------------------------------------------------------


def test_client_killed_in_the_middle_of_a_create(store, populated, spawn):
    client, objects = populated
    baseline = snapshot(client)
    oid = OID.from_random()
    child = spawn(
        """
        client = shoal.Client(sys.argv[1])
        buffer = client.create(bytes.fromhex(sys.argv[2]), 8 << 20, metadata=b"never sealed")
        view = np.frombuffer(buffer, dtype=np.uint8)
        view[: 4 << 20] = 7                      # write half
        emit("half written")
        time.sleep(60)
        """,
        store.socket,
        oid.hex(),
    )
    assert child.json() == "half written"
    [info] = [o for o in client.list() if o.id == oid]
    assert not info.sealed and info.data_size == 8 * MiB
    assert client.stats()["used"] >= baseline[1] + 8 * MiB
    assert not client.contains(oid)

    child.kill()  # SIGKILL: no chance to abort or close
    start = time.monotonic()
    wait_for(lambda: snapshot(client) == baseline, timeout=2, message="the unsealed object aborted")
    assert time.monotonic() - start < 1.5
    assert client.get_buffers([oid], timeout_ms=0) == [None]
    assert_intact(client, objects)
    # The id can be used again.
    client.put(b"reborn", oid)
    assert client.get(oid).to_pybytes() == b"reborn"


def test_client_killed_while_holding_references(store, populated, spawn):
    client, objects = populated
    oids = list(objects)
    doomed = client.put(b"deleted while the child reads it")
    child = spawn(
        """
        client = shoal.Client(sys.argv[1])
        ids = [bytes.fromhex(h) for h in sys.argv[2:]]
        held = client.get_buffers(ids, timeout_ms=5000)
        held += client.get_buffers(ids[:2], timeout_ms=5000)   # two references to some
        emit(sum(len(b) for b in held))
        time.sleep(60)
        """,
        store.socket,
        *(o.hex() for o in [*oids, doomed]),
    )
    assert child.json() > 0
    refs = {o.id: o.ref_count for o in client.list()}
    assert refs[oids[0]] == 2 and refs[oids[-1]] == 1 and refs[doomed] == 1
    client.delete(doomed)  # deferred: the child still holds it
    used = client.stats()["used"]
    assert client.stats()["referenced"] == len(objects) + 1

    child.kill()
    wait_for(lambda: client.stats()["referenced"] == 0, timeout=2, message="references released")
    assert all(o.ref_count == 0 for o in client.list())
    assert client.stats()["used"] < used  # the deleted object is freed now
    assert not client.contains(doomed)
    assert_intact(client, objects)
    wait_for(lambda: client.stats()["clients"] == 1, timeout=2)


def test_client_killed_while_blocked(store, populated, spawn):
    """Killed while the daemon waits on its behalf (a get for a missing object, a create on
    a full store): the wait ends and everything it held goes."""
    client, objects = populated
    getter = spawn(
        """
        client = shoal.Client(sys.argv[1])
        held = client.get_buffer(bytes.fromhex(sys.argv[2]))
        emit("waiting")
        client.get_buffers([os.urandom(20)], timeout_ms=-1)   # forever
        """,
        store.socket,
        next(iter(objects)).hex(),
    )
    creator = spawn(
        """
        client = shoal.Client(sys.argv[1])
        big = client.create(os.urandom(20), 40 << 20)
        emit("waiting")
        client.create(os.urandom(20), 40 << 20, timeout_ms=60_000)   # cannot fit
        """,
        store.socket,
    )
    assert getter.json() == "waiting" and creator.json() == "waiting"
    wait_for(lambda: client.stats()["clients"] == 3, timeout=2)
    time.sleep(0.1)  # both are blocked in the daemon now
    getter.kill()
    creator.kill()
    wait_for(lambda: client.stats()["clients"] == 1, timeout=2, message="dead waiters dropped")
    wait_for(lambda: client.stats()["referenced"] == 0, timeout=2)
    assert len(client.list()) == len(objects)
    assert_intact(client, objects)
