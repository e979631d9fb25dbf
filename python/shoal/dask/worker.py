"""`shoal.dask.Worker` and `shoal.dask.Nanny`: Dask's worker and nanny with shoal as the
data plane (docs/dask.md).

    LocalCluster(worker_class=shoal.dask.Nanny)          # worker processes, one store
    dask worker SCHEDULER --worker-class shoal.dask.Worker

The worker keeps its data in a `StoreData` over the store, measures its memory without
the store's pages (and has its nanny do the same), adds its store's and its shoal
cluster's identities to every comm handshake and asks for the `shoal` serialization
family first when it sends data,
and registers `shoal.dask.SchedulerPlugin` with the scheduler. Without a store it is
Dask's worker, after one warning.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import sys
from typing import Any

import dask.config
import distributed
from dask.utils import parse_bytes
from distributed.protocol import pickle
from distributed.spill import SpillBuffer

from shoal.dask import backing, heap, memory, pieces, serialize, store
from shoal.dask.data import DEFAULT_HOLD_SHARE, DEFAULT_THRESHOLD, StoreData
from shoal.dask.forget import Forgetting
from shoal.dask.read_ahead import ReadAhead
from shoal.dask.scheduler import SchedulerPlugin
from shoal.errors import ShoalError

log = logging.getLogger("distributed.worker.shoal")

#: How many of the next ready tasks a worker reads the kept inputs of ahead (at most half
#: of the bytes it keeps mapped, `StoreData.hold`).
READ_AHEAD_TASKS = 4
#: Up to how many ready tasks the worker looks that far (beyond, at the next one only).
READ_AHEAD_SORTED = 64
#: How long a closing worker waits for the deletes of forgotten keys it was sent.
FORGET_CLOSE_S = 10.0


def _setting(value: Any, key: str, default: Any = None) -> Any:
    """A worker option: its keyword, else Dask's config `shoal.<key>`, else `default`."""
    return value if value is not None else dask.config.get(f"shoal.{key}", default)


class Worker(distributed.Worker):
    """A Dask worker whose large values live in a shoal store.

    Keywords beyond Dask's: `shoal_socket` (the store's socket), `shoal_threshold` (bytes;
    smaller values stay with Dask, default 64 KiB), `shoal_capacity` (of an embedded store
    started when none runs at the default socket), `shoal_hold` (bytes of values kept
    mapped on a store with tiers, the older ones left to the tiers; default an eighth of
    the store's capacity), `shoal_young` (bytes of new values kept private until another
    worker asks for them, a client keeps them or newer ones need the room; default 0:
    every value into the store at once), `shoal_heap` (bytes of freed memory the worker's
    allocator keeps for its next tasks, heap.py; default, in a process Dask's nanny started
    with its trim setting, a quarter of its memory limit; 0: Dask's setting). Each
    defaults to Dask's config `shoal.socket`, `shoal.threshold`, `shoal.capacity`,
    `shoal.hold`, `shoal.young`, `shoal.heap`."""

    def __init__(
        self,
        *args: Any,
        shoal_socket: str | None = None,
        shoal_threshold: int | str | None = None,
        shoal_capacity: int | str | None = None,
        shoal_hold: int | str | None = None,
        shoal_young: int | str | None = None,
        shoal_heap: int | str | None = None,
        data: Any = None,
        **kwargs: Any,
    ) -> None:
        self.shoal: store.Store | None = None
        self.shoal_data: StoreData | None = None
        self.shoal_read_ahead: ReadAhead | None = None
        self.shoal_forgetting: Forgetting | None = None
        #: Whether the allocator keeps freed memory for the next tasks (heap.py).
        self.shoal_heap_kept = False
        #: Whether the scheduler took shoal's plugin (it handles `shoal-claimed` then).
        self.shoal_plugin = False
        socket = _setting(shoal_socket, "socket")
        failure: Exception | None = None
        if data is None:
            try:
                self.shoal = store.Store.open(socket, _setting(shoal_capacity, "capacity"))
            except (ShoalError, OSError) as err:
                failure = err
        mapping = None
        if self.shoal is not None:
            threshold = parse_bytes(_setting(shoal_threshold, "threshold", DEFAULT_THRESHOLD))
            hold = _setting(shoal_hold, "hold")
            hold = self.shoal.capacity // DEFAULT_HOLD_SHARE if hold is None else parse_bytes(hold)
            young = parse_bytes(_setting(shoal_young, "young", 0))
            mapping = StoreData(self.shoal, threshold=threshold, hold=hold, young=young)
            data = mapping
        super().__init__(*args, data=data, **kwargs)
        self.shoal_data = mapping
        # Registered whether or not a store was found: a stream message with no handler
        # closes the worker (what the scheduler sends depends on what it was told, and a
        # stale message may still arrive).
        self.stream_handlers["shoal-forget"] = self.shoal_forget
        self.stream_handlers["shoal-cool"] = self.shoal_cool
        self.stream_handlers["shoal-kept"] = self.shoal_kept
        self.monitor.get_process_memory = memory.private_memory
        if failure is not None:  # logged now, when Dask's worker logs are set up
            where = socket or "the default socket"
            log.warning("shoal: no store at %s (%s); this worker keeps its data as Dask does", where, failure)
        if self.shoal is None or mapping is None:
            return
        store.use(self.shoal)
        self._keep_private_as_dask_does(mapping)
        keep = _setting(shoal_heap, "heap")
        if keep is not None:
            self.shoal_heap_kept = heap.keep_freed(parse_bytes(keep))
        elif heap.trimmed_as_dask_does():
            self.shoal_heap_kept = heap.keep_freed(heap.default_keep(self.memory_manager.memory_limit))
        identity = self.shoal.identity
        scope = self.scheduler.address
        mapping.name_of = lambda key: f"{store.key_prefix(scope, key)}/{store.component(str(self.name))}"
        mapping.can_claim = self._can_tell_claim
        mapping.on_claim = self._tell_claim
        cluster = self.shoal.cluster
        self.startup_information["shoal"] = lambda _worker: {"store": identity, "cluster": cluster}
        overrides = self.connection_args.setdefault("handshake_overrides", {})
        overrides[serialize.HANDSHAKE_KEY] = self.shoal.handshake()
        self.handlers["shoal_adopt"] = self.shoal_adopt
        self.shoal_forgetting = Forgetting(self.shoal)
        if self.shoal.tiered:
            self.shoal_read_ahead = ReadAhead(self.shoal.client.socket)

    def _keep_private_as_dask_does(self, mapping: StoreData) -> None:
        """Values the store does not take spill as Dask's own would (its SpillBuffer, with
        the target Dask's memory manager computes), when the worker has a memory limit."""
        manager = self.memory_manager
        if not manager.memory_limit or not (manager.memory_target_fraction or manager.memory_spill_fraction):
            return
        target = (
            int(manager.memory_limit * manager.memory_target_fraction)
            if manager.memory_target_fraction
            else sys.maxsize
        )
        mapping.keep_private_in(
            SpillBuffer(os.path.join(self.local_directory, "storage"), target, manager.max_spill)
        )

    async def start_unsafe(self) -> Worker:
        await super().start_unsafe()
        if self.shoal is not None:
            # Not awaited: a nanny answers its worker only once the worker has started.
            self._ongoing_background_tasks.call_soon(self._install_plugins)
        return self

    async def _install_plugins(self) -> None:
        """The scheduler plugin (deletes, keeps a dead worker's keys) and, under a nanny
        that is not shoal's, the nanny's accounting."""
        try:
            await self.scheduler.register_scheduler_plugin(
                plugin=pickle.dumps(SchedulerPlugin()), name=SchedulerPlugin.name, idempotent=True
            )
            self.shoal_plugin = True
        except Exception as err:
            self.shoal.warn_once(
                "plugin",
                "shoal: the scheduler did not take shoal.dask.SchedulerPlugin (%r): objects of "
                "forgotten keys stay until the store evicts them, a dead worker's keys are recomputed",
                err,
            )
        if self.nanny:
            try:
                await self.rpc(self.nanny).plugin_add(
                    plugin=pickle.dumps(memory.NannyAccounting()), name=memory.NannyAccounting.name
                )
            except Exception as err:
                self.shoal.warn_once(
                    "nanny", "shoal: the nanny did not take the accounting (%r): it counts store pages", err
                )

    def _can_tell_claim(self) -> bool:
        """Whether the scheduler can be told of a claim: its plugin, whose handler the
        message needs (an unknown stream op closes the worker), and a connection."""
        stream = self.batched_stream
        return (
            self.shoal_plugin and stream is not None and stream.comm is not None and not stream.comm.closed()
        )

    def _tell_claim(self, key: Any, source: Any) -> None:
        """Tells the scheduler that `key`'s value took over an item of `source`'s pieces
        (`StoreData.on_claim`): it then deletes `key`'s objects only once `source` left
        memory. Sent on the stream that reports `key`'s task, before that report."""
        self.batched_send({"op": "shoal-claimed", "key": key, "source": source})

    async def execute(self, key: Any, *, stimulus_id: str) -> Any:
        """Dask's execute, after asking for the kept inputs of the next ready tasks to be
        restored from the store's tiers meanwhile (`read_ahead`). A split task (`getitem`
        of a shuffle group stored as pieces) runs with `pieces.splitting` set: it returns its item
        unread, for the data mapping to claim."""
        ready = self.state.ready
        if self.shoal_read_ahead is not None and self.shoal_data is not None and ready:
            # peekn sorts the whole heap: past a few dozen ready tasks, the next one only.
            following = ready.peekn(READ_AHEAD_TASKS) if len(ready) <= READ_AHEAD_SORTED else [ready.peek()]
            keys = [dep.key for ts in following for dep in ts.dependencies]
            self.shoal_read_ahead.want(self.shoal_data.read_ahead(keys, self.shoal_data.hold // 2))
        task = self.state.tasks.get(key)
        if task is None or not self._is_split(task):
            return await super().execute(key, stimulus_id=stimulus_id)
        token = pieces.splitting.set(True)
        try:
            return await super().execute(key, stimulus_id=stimulus_id)
        finally:
            pieces.splitting.reset(token)

    def _is_split(self, task: Any) -> bool:
        """Whether `task` is `operator.getitem` of an input stored as pieces: its result is
        the item itself, which nothing else reads before the data mapping stores it."""
        spec = task.run_spec
        if getattr(spec, "func", None) is not operator.getitem or getattr(spec, "kwargs", None):
            return False
        args = getattr(spec, "args", ())
        # The container is a reference to an input (an `Alias` in dask's task spec).
        container = getattr(args[0], "key", None) if len(args) == 2 else None
        return (
            container is not None and self.shoal_data is not None and self.shoal_data.holds_pieces(container)
        )

    async def close(self, *args: Any, **kwargs: Any) -> Any:
        if self.shoal_read_ahead is not None:
            self.shoal_read_ahead.close()
        if self.shoal_forgetting is not None:
            # Forgets arriving from here on are done where they arrive.
            await asyncio.to_thread(self.shoal_forgetting.close, FORGET_CLOSE_S)
        return await super().close(*args, **kwargs)

    async def get_data(
        self, comm: Any, keys: Any, who: str | None = None, serializers: list[str] | None = None
    ) -> Any:
        """Dask's get_data, asking for the `shoal` family first (it declines what the
        receiver cannot reach, and Dask's own families follow)."""
        if self.shoal is not None and self.shoal.usable:
            serializers = [serialize.NAME, *(serializers or ("dask", "pickle"))]
            if self.shoal_data is not None:
                self.shoal_data.promote(keys)  # sent by id: it needs its object now
        return await super().get_data(comm, keys, who=who, serializers=serializers)

    def shoal_adopt(self, keys: list[Any], stimulus_id: str | None = None) -> list[Any]:
        """Takes `keys` of a dead worker of this store as this worker's own (mapped from
        their objects, as scattered data); returns the keys adopted."""
        assert self.shoal is not None
        found: dict[Any, Any] = {}
        scope = self.scheduler.address
        for key in keys:
            if key in self.data:
                found[key] = self.data[key]
                continue
            prefix = store.key_prefix(scope, key)
            hit = self.shoal.find(prefix)
            if hit is not None:
                stored, value = hit
                backing.received(value, stored)
                found[key] = value
            elif (group := pieces.find(self.shoal, prefix)) is not None:
                found[key] = group  # adopted by its items' ids
        if found:
            self.update_data(data=found, stimulus_id=stimulus_id)
        return list(found)

    def shoal_forget(self, keys: list[Any], before: float, stimulus_id: str | None = None) -> None:
        """Deletes the objects of keys the scheduler forgot (any worker's) that were sealed
        before time `before`, on the forgetting thread (forget.py)."""
        if self.shoal is None:
            return
        scope = self.scheduler.address
        for key in keys:
            prefix = store.key_prefix(scope, key)
            if self.shoal_forgetting is None or not self.shoal_forgetting.forget(prefix, before):
                self.shoal.forget(prefix, before)

    def shoal_kept(self, keys: list[Any], stimulus_id: str | None = None) -> None:
        """A client keeps `keys` (persisted): worth reading ahead (`StoreData.keep`)."""
        if self.shoal_data is not None:
            self.shoal_data.keep(keys)

    def shoal_cool(self, keys: list[Any], stimulus_id: str | None = None) -> None:
        """No task waits for `keys` any more, and the client keeps them: their objects leave
        memory first when room is needed (`StoreData.cool`)."""
        if self.shoal_data is not None:
            self.shoal_data.cool(keys)


class Nanny(distributed.Nanny):
    """Dask's nanny, starting `shoal.dask.Worker`s and restarting one only for its own
    memory (`LocalCluster(worker_class=shoal.dask.Nanny)`)."""

    def __init__(self, *args: Any, worker_class: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, worker_class=worker_class or Worker, **kwargs)
        memory.install_nanny_accounting(self)
