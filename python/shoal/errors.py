"""Exceptions raised by shoal. Each maps one store error kind."""


class ShoalError(Exception):
    """Base class of every shoal error."""


class ObjectNotFound(ShoalError, KeyError):
    """No object with this id (or not sealed in time)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "object not found"


class ObjectExists(ShoalError):
    """An object with this id already exists."""


class ObjectNotSealed(ShoalError):
    """The operation needs a sealed object."""


class ObjectAlreadySealed(ShoalError):
    """The object is sealed already (seal twice, abort after seal)."""


class NotOwner(ShoalError):
    """Only the client that created an object may seal or abort it."""


class StoreFull(ShoalError, MemoryError):
    """Not enough memory even after evicting everything evictable."""


class ObjectTooLarge(StoreFull):
    """The object is larger than the store's capacity."""


class ProtocolError(ShoalError):
    """A malformed frame on the socket."""


class InvalidArgument(ShoalError, ValueError):
    """A request that makes no sense."""


class IoError(ShoalError, OSError):
    """An operating-system error."""


class Disconnected(ShoalError, ConnectionError):
    """The daemon went away or is not running."""


class Timeout(ShoalError, TimeoutError):
    """A wait ran out of time."""


class ObjectInUse(ShoalError):
    """The object is referenced."""


class VersionMismatch(ShoalError):
    """Client and daemon speak different protocol versions."""


class NodeUnavailable(ShoalError, ConnectionError):
    """Another node of the cluster did not answer within the timeout."""


class HomeUnavailable(NodeUnavailable):
    """A create of an id whose home node cannot be reached (down, cut off or rebuilding its
    directory); the message names the node. `put` without an id chooses another id instead."""


class PermissionDenied(ShoalError, PermissionError):
    """A security check refused: a socket directory or log another user could have planted,
    a daemon or client of another user, or (between nodes) a peer's TLS certificate or
    bytes changed on the way (docs/security.md)."""


class ObjectCorrupt(ShoalError):
    """Every stored copy of the object failed its checksum (torn or damaged tier file)."""


class NameTooLong(InvalidArgument):
    """An object name with a component over 255 bytes or over 4096 bytes in all."""


__all__ = [
    name for name, value in globals().items() if isinstance(value, type) and issubclass(value, Exception)
]
