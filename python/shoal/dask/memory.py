"""Memory accounting that does not count the store's pages as a worker's own.

Dask measures a worker by its resident set (psutil's `rss`): the worker's memory monitor
(`SystemMonitor.get_process_memory`) spills and pauses by it, the Nanny's
(`NannyMemoryManager.memory_monitor`) restarts the worker by it. A process that maps a
shoal store has the store's pages in its resident set (shared memory: a client maps the
region populated), so a worker reading 10 GiB of shared objects would look 10 GiB large.
Here a worker's memory is its resident set minus its resident shared memory (`VmRSS -
RssShmem` of /proc/PID/status): anonymous memory and file pages, what the worker would
free by exiting. Other shared memory the worker maps (multiprocessing's) is left out too.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import psutil
from distributed.diagnostics.plugin import NannyPlugin
from distributed.worker_memory import NannyMemoryManager

log = logging.getLogger("distributed.nanny.shoal")


def private_memory(pid: int | None = None) -> int:
    """Bytes of process `pid` (default this one) that are its own: VmRSS - RssShmem."""
    path = f"/proc/{pid or 'self'}/status"
    fields: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssShmem"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    if "VmRSS" not in fields:  # not Linux's /proc: what Dask would have measured
        return psutil.Process(pid).memory_info().rss
    return fields["VmRSS"] - fields.get("RssShmem", 0)


def _nanny_monitor(manager: NannyMemoryManager, nanny: Any) -> None:
    """The Nanny's check with the worker's own memory: Dask's own check (which restarts
    the worker) runs only once that is over the terminate fraction."""
    process = getattr(nanny.process, "process", None)
    pid = getattr(process, "pid", None)
    if pid is None or not manager.memory_limit or manager.memory_terminate_fraction is False:
        return
    try:
        memory = private_memory(pid)
    except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
        return
    if memory / manager.memory_limit > manager.memory_terminate_fraction:
        NannyMemoryManager.memory_monitor(manager, nanny)


def install_nanny_accounting(nanny: Any) -> bool:
    """Makes `nanny`'s memory check count only the worker's own memory. Returns whether
    there was a check to change (none without a memory limit)."""
    callback = nanny.periodic_callbacks.get("memory_monitor")
    if callback is None:
        return False
    callback.callback = partial(_nanny_monitor, nanny.memory_manager, nanny)
    return True


class NannyAccounting(NannyPlugin):
    """Installs the accounting into a Dask Nanny that is not `shoal.dask.Nanny` (e.g. the
    one `dask worker --worker-class shoal.dask.Worker` starts); the worker sends it."""

    name = "shoal-memory"

    def setup(self, nanny: Any) -> None:
        if install_nanny_accounting(nanny):
            log.info("shoal: the nanny counts the worker's own memory, not the store's")
