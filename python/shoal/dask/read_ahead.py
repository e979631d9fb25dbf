"""Reading ahead: a worker brings the inputs of its next task back from the store's tiers
while the current task runs.

A task's inputs are read on the worker's event loop before the task runs, so an input on
a tier costs the task its restore (a disk read) on top of its compute; restored ahead, on
a thread with a connection of its own, the disk and the CPU work at once. Only values a
client keeps are read ahead (a persisted collection, a result), as the scheduler names
them (`shoal-kept`). An intermediate value is never on a tier for long enough to pay,
and restoring it early evicts what the running task needs (reading ahead every input
made a set_index 3x slower). The restore itself evicts the store's cooled objects
first (`shoal.Client.cool`), so a scan makes room for its next value from the values it
has done with.
"""

from __future__ import annotations

import logging
import threading

import shoal
from shoal.errors import Disconnected, ShoalError

log = logging.getLogger("distributed.worker.shoal")


class ReadAhead:
    """A thread staging objects into memory, newest request first, one request at a time."""

    def __init__(self, socket: str) -> None:
        self._socket = socket
        self._wanted: list[bytes] = []
        self._changed = threading.Condition()
        self._closed = False
        #: Objects asked for, and stage-ins that failed (for tests and logs).
        self.asked = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="shoal-read-ahead", daemon=True)
        self._thread.start()

    def want(self, oids: list[bytes]) -> None:
        """Stages `oids` in next, replacing any request not started yet (only the next
        task's inputs are worth reading ahead)."""
        if not oids:
            return
        with self._changed:
            self._wanted = list(oids)
            self._changed.notify()

    def close(self) -> None:
        """Stops the thread once its stage-in in progress, if any, is answered (not waited
        for: the worker's event loop calls this)."""
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _run(self) -> None:
        try:
            client = shoal.Client(self._socket, fast_path=False)
        except (ShoalError, OSError) as err:
            log.warning("shoal: no reading ahead (%r)", err)
            return
        try:
            while True:
                with self._changed:
                    while not self._wanted and not self._closed:
                        self._changed.wait()
                    if self._closed:
                        return
                    oids, self._wanted = self._wanted, []
                self.asked += len(oids)
                try:
                    client.stage_in(oids)
                except Disconnected:
                    return
                except ShoalError:
                    # Deleted meanwhile, or no room: the task's own read will tell.
                    self.failed += 1
        finally:
            client.close()
