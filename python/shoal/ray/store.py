"""A Ray process's connection to its shoal store, and the names of a job's objects.

Every process of shoal.ray (driver, task worker, actor) connects once to the store of its
Ray node: the socket in $SHOAL_SOCKET, else the per-user default, where `shoal.connect()`
starts an embedded store if none runs. Ray workers inherit their raylet's environment, so
a node started with SHOAL_SOCKET set (`SHOAL_SOCKET=... ray start`, or a `ray.init()` in a
process that has it) sends all its workers to that store; `connect(socket)` overrides it in
one process.

Names (docs/posix.md): an object put for a job is `ray/<session>/<job>/<id>` (the Ray
cluster's session name and the job's id), deleted when the job ends
(shoal.ray.janitor); one put with `durability=` is kept past the job, under the name
given or `ray/<session>/<job>/durable/<id>`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import ray

import shoal
from shoal.errors import InvalidArgument

#: The directory of every object shoal.ray names.
ROOT = "ray"
#: Under a job's directory: what outlives the job.
DURABLE = "durable"

_lock = threading.Lock()
_client: shoal.Client | None = None


def connect(socket: str | None = None) -> shoal.Client:
    """Makes this process use the store at `socket` (default: $SHOAL_SOCKET or the per-user
    default) from now on, and returns its client."""
    global _client
    with _lock:
        if _client is not None:
            _client.close()
        _client = shoal.connect(socket or os.environ.get("SHOAL_SOCKET") or None)
        return _client


def client() -> shoal.Client:
    """This process's client of its store (connected on first use)."""
    global _client
    current = _client
    if current is not None:
        return current
    with _lock:
        if _client is None:
            _client = shoal.connect(os.environ.get("SHOAL_SOCKET") or None)
        return _client


@dataclass(frozen=True)
class Scope:
    """The Ray job a process works for, in the Ray cluster it belongs to."""

    session: str
    job: str

    @property
    def directory(self) -> str:
        return f"{ROOT}/{self.session}/{self.job}"

    def name(self, oid_hex: str, *, durable: bool) -> str:
        return f"{self.directory}/{DURABLE}/{oid_hex}" if durable else f"{self.directory}/{oid_hex}"

    def owns(self, name: str) -> bool:
        """Whether `name` is one of the job's objects that go with it (not a durable one)."""
        rest = name.removeprefix(self.directory + "/")
        return rest != name and not rest.startswith(DURABLE + "/")


def scope() -> Scope:
    """The job of this driver, task or actor; InvalidArgument outside Ray."""
    if not ray.is_initialized():
        raise InvalidArgument("shoal.ray needs a Ray driver, task or actor (call ray.init() first)")
    context = ray.get_runtime_context()
    return Scope(context.get_session_name(), context.get_job_id())
