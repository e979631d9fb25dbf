"""Object ids: 20 bytes, unique cluster-wide."""

from __future__ import annotations

import hashlib
import os


class ObjectID:
    """A 20-byte object id (hashable, comparable, usable as a dict key)."""

    __slots__ = ("_bytes",)
    SIZE = 20

    def __init__(self, binary: bytes | bytearray | memoryview) -> None:
        binary = bytes(binary)
        if len(binary) != self.SIZE:
            raise ValueError(f"an ObjectID is {self.SIZE} bytes, got {len(binary)}")
        self._bytes = binary

    @classmethod
    def from_random(cls) -> ObjectID:
        return cls(os.urandom(cls.SIZE))

    @classmethod
    def from_hex(cls, text: str) -> ObjectID:
        return cls(bytes.fromhex(text))

    def binary(self) -> bytes:
        return self._bytes

    def hex(self) -> str:
        return self._bytes.hex()

    def __bytes__(self) -> bytes:
        return self._bytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectID) and other._bytes == self._bytes

    def __lt__(self, other: ObjectID) -> bool:
        return self._bytes < other._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __repr__(self) -> str:
        return f"ObjectID({self.hex()})"


IdLike = ObjectID | bytes


def derived_id(*parts: object) -> ObjectID:
    """An id every process computes alike from names (SHA-1: exactly 20 bytes)."""
    text = "\0".join(str(p) for p in parts)
    return ObjectID(hashlib.sha1(text.encode(), usedforsecurity=False).digest())


def as_bytes(oid: IdLike) -> bytes:
    """The 20 raw bytes of an ObjectID or a bytes id."""
    if isinstance(oid, ObjectID):
        return oid.binary()
    if isinstance(oid, bytes | bytearray) and len(oid) == ObjectID.SIZE:
        return bytes(oid)
    raise TypeError(f"expected an ObjectID or 20 bytes, got {oid!r}")
