"""Deleting a job's objects when the job ends.

Two paths, so that neither a clean exit nor a killed driver leaves them behind:
- the driver deletes its job's objects when its interpreter exits (atexit: the script
  ends, or calls `ray.shutdown()` and ends);
- a detached actor per Ray cluster (`Janitor`, named "janitor" in namespace "shoal")
  deletes those of jobs whose driver died without exiting (kill -9, a crash, a lost
  node): it watches Ray's job table for the jobs it was told of and sweeps the directory
  of each that is dead. The first put of each process tells it of its job.

A sweep unlinks the job's names (shoal.ray.store, "Names") except the durable ones;
readers that still hold an object keep it until they release it. Objects of a job whose
whole Ray cluster died with its driver (a `ray.init()` cluster under kill -9) stay until
the store evicts them or someone runs `shoal rm` on `ray/<session>` (docs/ray.md).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

import ray

from shoal.errors import Disconnected, ObjectNotFound, ShoalError
from shoal.ray import store
from shoal.ray.store import Scope

log = logging.getLogger("shoal.ray")

NAMESPACE = "shoal"
NAME = "janitor"
#: Seconds between two looks at Ray's job table while some job is watched.
INTERVAL = 0.5


def sweep(scope: Scope) -> int:
    """Unlinks every name of `scope`'s job that goes with it; returns how many."""
    client = store.client()
    gone = 0
    for row in client.ls(scope.directory):
        if not scope.owns(row.name):
            continue
        try:
            client.unlink(row.name)
            gone += 1
        except ObjectNotFound:
            pass  # swept by the other path, or deleted by the job itself
    return gone


def _dead_jobs() -> set[str]:
    # ray._private.state.jobs() is the GCS job table without the dashboard (which
    # ray.util.state needs and tests leave off).
    return {job["JobID"] for job in ray._private.state.jobs() if job["IsDead"]}


@ray.remote(num_cpus=0)
class Janitor:
    """Sweeps the jobs it was told of once Ray reports them dead."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._lock = threading.Lock()
        self._watched: set[Scope] = set()
        self._swept: dict[str, int] = {}
        threading.Thread(target=self._run, name="shoal-janitor", daemon=True).start()

    def watch(self, session: str, job: str) -> None:
        with self._lock:
            if job not in self._swept:
                self._watched.add(Scope(session, job))

    def swept(self) -> dict[str, int]:
        """Job id → names deleted, for the jobs swept so far."""
        with self._lock:
            return dict(self._swept)

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                watched = set(self._watched)
            if not watched:
                continue
            try:
                dead = _dead_jobs()
                for scope in (s for s in watched if s.job in dead):
                    count = sweep(scope)
                    with self._lock:
                        self._watched.discard(scope)
                        self._swept[scope.job] = count
            except (ShoalError, OSError, ray.exceptions.RayError) as err:
                log.warning("shoal.ray janitor: sweep failed (%r); trying again", err)


_registered: set[Scope] = set()
_lock = threading.Lock()


def janitor() -> ray.actor.ActorHandle:
    """The Ray cluster's janitor, started by the first process that asks."""
    return Janitor.options(name=NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote()


def _is_driver() -> bool:
    return ray._private.worker.global_worker.mode == ray.SCRIPT_MODE


def watch(scope: Scope) -> None:
    """Makes sure `scope`'s objects go when its job ends (once per process and job)."""
    with _lock:
        if scope in _registered:
            return
        _registered.add(scope)
    janitor().watch.remote(scope.session, scope.job)
    if _is_driver():
        atexit.register(_sweep_at_exit, scope)


def _sweep_at_exit(scope: Scope) -> None:
    try:
        sweep(scope)
    except Disconnected:
        pass  # the store is gone, and the objects with it (or the janitor sweeps them)
    except (ShoalError, OSError) as err:
        log.warning("shoal.ray: could not delete job %s's objects at exit (%r)", scope.job, err)
