"""The scheduler's side: objects of forgotten keys are deleted, objects of kept keys no
task waits for are cooled, and the keys of a worker that dies stay in memory where their
objects survive it.

Workers tell the scheduler which store they reach (`extra["shoal"]`, from
`Worker.startup_information`); the plugin acts through a live worker of each store, so
the scheduler itself needs no store:

- a key that leaves memory with no worker holding it (released, forgotten, erred) has
  its objects deleted: one running worker of each store deletes the objects named under
  the key's directory and sealed before the scheduler forgot it (`shoal-forget`, done on a
  thread of the worker's, forget.py; the scheduler's clock against the store's, so one
  host's), and `shoal ls` shows only keys Dask holds;
- before Dask removes a worker it asks the workers that share its store to adopt the
  keys only it held (`shoal_adopt`: each maps the key's object and takes the key as
  scattered data), and records them as replicas, so Dask sees the keys still in memory
  and recomputes none of them; keys whose objects are gone are recomputed as usual;
- when a task finishes, each input of it that no other task waits for and that a client
  still wants (a persisted collection a job just read) is cooled at the workers holding
  it (`shoal-cool`, `StoreData.cool`): on a tiered store its object leaves memory before
  any other, so a job scanning a collection larger than the store restores what memory
  cannot hold once per pass, where LRU evicts every value just before the scan comes
  back to it. Inputs nobody wants are left alone: they are deleted within moments, and
  cooling them would have the store write them to a tier first;
- a task whose value a client wants is named to the workers holding it (`shoal-kept`):
  they read such values ahead of the tasks that need them (`read_ahead.py`);
- a key whose value took over the object of an item of another key's pieces (a
  shuffle's split of its group, `shoal-claimed`, dask/pieces.py) has its objects deleted
  only once that key has left memory too: the group may be read for the item again.

Dask calls a plugin's `remove_worker` only after the worker's keys were released, so
the plugin wraps the scheduler's `remove_worker` (and its `unregister` handler) instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin as DaskSchedulerPlugin

log = logging.getLogger("distributed.scheduler.shoal")

#: States a key's objects are deleted in, once no worker holds it.
_GONE = ("released", "forgotten", "erred")


def store_of(worker_state: Any) -> str | None:
    """The identity of the store a worker reaches, as it reported at registration."""
    extra = getattr(worker_state, "extra", None) or {}
    info = extra.get("shoal") or {}
    return info.get("store")


class SchedulerPlugin(DaskSchedulerPlugin):
    """Registered by every `shoal.dask.Worker` when it starts (idempotent)."""

    name = "shoal"

    def __init__(self) -> None:
        self.scheduler: Any = None
        #: Keys whose objects were deleted, and keys adopted after a worker died.
        self.forgotten = 0
        self.adopted = 0
        #: Keys cooled at a worker (one count per worker holding one).
        self.cooled = 0
        #: Claimant key → the key whose pieces it claimed an item of (`shoal-claimed`,
        #: dask/pieces.py); and key in memory → claimants forgotten before it, with the
        #: time each was: their objects are deleted once it is.
        self._claims: dict[Any, Any] = {}
        self._after: dict[Any, list[tuple[Any, float]]] = {}
        self._rescuing: dict[str, asyncio.Future[None]] = {}

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        remove_worker = scheduler.remove_worker

        async def rescuing_remove_worker(address: str, *, stimulus_id: str, **kwargs: Any) -> Any:
            try:
                await self._rescue(address, stimulus_id)
            except Exception:
                log.exception("shoal: keeping the keys of %s failed; Dask recomputes them", address)
            return await remove_worker(address, stimulus_id=stimulus_id, **kwargs)

        scheduler.remove_worker = rescuing_remove_worker
        scheduler.handlers["unregister"] = rescuing_remove_worker
        scheduler.stream_handlers["shoal-claimed"] = self.claimed

    def claimed(self, key: Any, source: Any, worker: str | None = None) -> None:
        """A worker's `key` took over the object of an item of `source`'s pieces."""
        self._claims[key] = source

    # -- deleting the objects of keys nobody holds ---------------------------------------------

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish == "memory":
            self._cool_inputs_of(key)
            self._tell_kept(key)
            return
        if start != "memory" or finish not in _GONE:
            return
        task = self.scheduler.tasks.get(key)
        if task is not None and task.who_has:
            return
        # The time bounds the delete to objects sealed before it: the key may be computed
        # again, and stored under the same name, before the message arrives.
        now = time.time()
        source = self.scheduler.tasks.get(self._claims.pop(key, None))
        if source is not None and source.state == "memory":
            # A claimant's object is still an item of its source's: deleted with them.
            self._after.setdefault(source.key, []).append((key, now))
            return
        self._forget(key, now)

    def _forget(self, key: Any, before: float) -> None:
        """Deletes the objects of `key` sealed before `before`, then those of the claimants
        of its pieces forgotten before it."""
        message = {"op": "shoal-forget", "keys": [key], "before": before}
        for address in self._one_worker_per_store().values():
            self.scheduler.worker_send(address, message)
        self.forgotten += 1
        for claimant, when in self._after.pop(key, ()):
            self._forget(claimant, when)

    def _cool_inputs_of(self, key: Any) -> None:
        """Cools the inputs of finished task `key` that no task waits for and a client keeps."""
        task = self.scheduler.tasks.get(key)
        if task is None:
            return
        by_worker: dict[str, list[Any]] = {}
        for dep in task.dependencies:
            if dep.state == "memory" and not dep.waiters and dep.who_wants:
                for ws in dep.who_has or ():
                    if store_of(ws) is not None:
                        by_worker.setdefault(ws.address, []).append(dep.key)
        for address, keys in by_worker.items():
            self.scheduler.worker_send(address, {"op": "shoal-cool", "keys": keys})
            self.cooled += len(keys)

    def _tell_kept(self, key: Any) -> None:
        """Tells the workers holding finished task `key` that a client keeps it (persisted)."""
        task = self.scheduler.tasks.get(key)
        if task is None or not task.who_wants:
            return
        for ws in task.who_has or ():
            if store_of(ws) is not None:
                self.scheduler.worker_send(ws.address, {"op": "shoal-kept", "keys": [key]})

    def _one_worker_per_store(self, exclude: str | None = None) -> dict[str, str]:
        chosen: dict[str, str] = {}
        for address, ws in self.scheduler.workers.items():
            store = store_of(ws)
            if store is not None and address != exclude and store not in chosen:
                chosen[store] = address
        return chosen

    # -- keeping a dead worker's keys ------------------------------------------------------------

    async def _rescue(self, address: str, stimulus_id: str) -> None:
        # Dask may remove a worker twice at once (its stream closed, its nanny's report):
        # both removals wait for the one rescue.
        rescue = self._rescuing.get(address)
        if rescue is None:
            dying = self.scheduler.workers.get(address)
            store = store_of(dying)
            if dying is None or store is None:
                return
            rescue = asyncio.ensure_future(self._adopt(dying, store, stimulus_id))
            self._rescuing[address] = rescue
            rescue.add_done_callback(lambda _: self._rescuing.pop(address, None))
        await asyncio.shield(rescue)

    async def _adopt(self, dying: Any, store: str, stimulus_id: str) -> None:
        scheduler, address = self.scheduler, dying.address
        keys = [ts.key for ts in dying.has_what if ts.who_has == {dying} and ts.state == "memory"]
        survivors = [a for a, ws in scheduler.workers.items() if a != address and store_of(ws) == store]
        if not keys or not survivors:
            return
        shares = {a: keys[i :: len(survivors)] for i, a in enumerate(survivors)}
        shares = {a: share for a, share in shares.items() if share}
        replies = await asyncio.gather(
            *(
                scheduler.rpc(a).shoal_adopt(keys=share, stimulus_id=f"shoal-adopt-{stimulus_id}")
                for a, share in shares.items()
            ),
            return_exceptions=True,
        )
        kept = 0
        for a, reply in zip(shares, replies, strict=True):
            ws = scheduler.workers.get(a)
            if isinstance(reply, BaseException) or ws is None:
                continue
            for key in reply:
                task = scheduler.tasks.get(key)
                if task is not None and task.state == "memory" and ws not in (task.who_has or ()):
                    scheduler.add_replica(task, ws)
                    kept += 1
        self.adopted += kept
        if kept:
            log.info(
                "shoal: %d of %d keys of %s kept in memory by workers of its store", kept, len(keys), address
            )
