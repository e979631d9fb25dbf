"""Deleting the objects of keys the scheduler forgot, off the worker's event loop.

The scheduler plugin sends every forget (`shoal-forget`) to one worker per store. Each
lists the names under the key's directory and deletes the objects sealed before the
scheduler forgot the key. On a store with tiers a delete of an object written down is
answered once it is committed below memory (docs/tiers.md, "Deletes are final"): a
millisecond or more, and more again while the worker's task thread holds the GIL when the
call returns. Done on the event loop, that worker's set_index under pressure spent 12 of
its 77 s there (2,628 deletes, cProfile), while results waited to be stored and tasks to
be started. A thread with a connection of its own does them instead, every forget queued
meanwhile in one delete.

Deleting by id is what makes the delay safe for names: the ids listed are objects sealed
before the key was forgotten, so a name bound again in the meantime (the key computed
again, the same worker storing it under the same name) keeps its new object, where an
unlink of the name would delete it. An object can leave a forgotten key's directory only
by a claim (a shuffle's split renaming its piece, pieces.py), and every claim of a key's
pieces happens before the scheduler forgets that key: a split reports its task only after
its claim, and the scheduler releases a group only once every split of it has reported.

When the thread cannot run (no connection, or the store went away) or the worker is
closing, forgets are done where they arrive, as before.
"""

from __future__ import annotations

import logging
import queue
import threading

import shoal
from shoal.dask import store as store_module
from shoal.errors import Disconnected, ShoalError

log = logging.getLogger("distributed.worker.shoal")

#: Forgets deleted in one request at most (a set_index forgets a few thousand keys).
BATCH = 256


class Forgetting:
    """A thread deleting the objects of forgotten keys, in the order they were forgotten."""

    def __init__(self, store: store_module.Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[tuple[str, float] | None] = queue.SimpleQueue()
        self._closing = False
        #: Objects listed for deletion so far (some may have gone meanwhile; for tests and
        #: benchmarks).
        self.forgotten = 0
        self._thread = threading.Thread(target=self._run, name="shoal-forget", daemon=True)
        self._thread.start()

    def forget(self, prefix: str, before: float) -> bool:
        """Deletes the objects named under directory `prefix` and sealed before `before`
        (seconds since the epoch), soon. Returns False, queuing nothing, when the thread
        no longer runs or is closing: the caller deletes them itself."""
        if self._closing or not self._thread.is_alive():
            return False
        self._queue.put((prefix, before))
        return True

    def close(self, timeout: float) -> bool:
        """Lets the forgets queued so far finish, for up to `timeout` seconds (blocks: the
        worker's close runs it on a thread); later forgets are refused. Returns whether
        they finished."""
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("shoal: deletes of forgotten keys still running after %.0f s", timeout)
            return False
        return True

    def _failed(self, err: BaseException) -> None:
        self._store.failed(err, "a delete")

    def _run(self) -> None:
        try:
            client = shoal.Client(self._store.client.socket, fast_path=False)
        except (ShoalError, OSError) as err:
            self._failed(err)
            return
        try:
            closing = False
            while not closing:
                batch = [self._queue.get()]
                while len(batch) < BATCH and not self._queue.empty():
                    batch.append(self._queue.get())
                closing = None in batch
                forgets = [item for item in batch if item is not None]
                try:
                    self.forgotten += store_module.forget(client, forgets, self._failed)
                except Disconnected as err:
                    self._failed(err)
                    return
                except ShoalError as err:
                    self._failed(err)
                except Exception:  # a bug here must not stop every later delete
                    log.exception("shoal: deleting the objects of %d forgotten keys failed", len(forgets))
        finally:
            client.close()
