"""A worker's heap: freed memory kept for its next tasks instead of given back at once.

Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536
(`distributed.nanny.pre-spawn-environ`), so that the resident set follows the values a
worker holds: its memory manager spills, pauses and restarts by that number, and a heap
that kept freed memory would look like values. Setting the trim threshold also fixes
glibc's mmap threshold at 128 KiB, so every array of a task's larger than that is a
mapping of its own, unmapped when freed: each new one faults its pages in and the kernel
zeroes them. Under a set_index under memory pressure that was 15 % of the machine's CPU
(perf: `clear_page_erms` alone 8 %), a quarter of the task threads' time.

A shoal worker holds its values in the store, not in its heap: what it frees is its
tasks' scratch memory, which the next task needs again. So it has glibc keep up to a
bound of freed memory at the top of its heaps and serve allocations up to 32 MiB (the
most glibc takes on 64-bit) from them. The bound counts in the worker's own memory
(`memory.private_memory`), so the default is a quarter of its memory limit, and glibc
keeps it per heap arena (the task thread's, the event loop's), so a worker may keep up to
about twice that. By default it does so only in a process started with Dask's trim setting
(under a nanny): elsewhere (`LocalCluster(processes=False)`, `--no-nanny`) glibc's own
thresholds adapt, and the process is not only the worker's. Measured
(bench/results/dask-pressure.md): set_index 52 s against 65-68 s, the workers' CPU 66 s
against 87-93 s, 0 pauses; stock Dask with the same setting did not finish its set_index
in 15 minutes (75 pauses: its values are in that heap).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("distributed.worker.shoal")

#: mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: The largest mmap threshold glibc takes on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
MMAP_THRESHOLD_MAX = 32 << 20
#: Without a memory limit: what a worker keeps.
DEFAULT_KEEP = 256 << 20
#: With one: the share of it a worker keeps.
KEEP_SHARE = 4


def trimmed_as_dask_does() -> bool:
    """Whether this process started with a trim threshold set (Dask's nanny sets one)."""
    return "MALLOC_TRIM_THRESHOLD_" in os.environ


def default_keep(memory_limit: int | None) -> int:
    """The bytes of freed memory a worker with `memory_limit` keeps by default."""
    return memory_limit // KEEP_SHARE if memory_limit else DEFAULT_KEEP


def keep_freed(nbytes: int) -> bool:
    """Has this process's allocator (glibc) keep up to `nbytes` of freed memory at the top
    of its heaps, and serve allocations up to min(`nbytes`, 32 MiB) from them. Returns
    whether it did (False where the C library is not glibc, or `nbytes` is 0)."""
    if nbytes <= 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    nbytes = min(nbytes, 2**31 - 1)
    # glibc's mallopt answers 1 for a value it took; musl's is a stub answering 0.
    done = mallopt(_M_MMAP_THRESHOLD, min(nbytes, MMAP_THRESHOLD_MAX)) == 1
    done = done and mallopt(_M_TRIM_THRESHOLD, nbytes) == 1
    if not done:
        log.info("shoal: the C library keeps no freed memory on request (not glibc?)")
    return done
