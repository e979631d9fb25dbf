"""How fast a region's memory comes back after it was given away, by how long it was away.

    python bench/elastic/refault.py [DIR ...]     (default: /dev/shm)

On a virtual machine with free page reporting (virtio-balloon), memory freed in the guest
is handed to the hypervisor a couple of seconds later, and a page allocated after that
faults in the host too. An elastic store that punches its region while a compute job
bursts and populates it again afterwards pays that, unless it populates at once
(crates/shoal-daemon/src/elastic/populate.rs). This probe populates a 2 GiB file in DIR
(MADV_POPULATE_WRITE), punches it, waits, and populates it again, for several waits.
A huge-page tmpfs (mount -t tmpfs -o huge=always ...) shows the effect most: its 2 MiB
pages are what the balloon reports.
"""

import ctypes
import mmap
import os
import sys
import time

GiB = 1 << 30
SIZE = 2 * GiB
MADV_POPULATE_WRITE = 23
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
WAITS_S = [0, 0, 1, 2, 4, 8]


def probe(directory):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    path = os.path.join(directory, f"shoal-refault-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.unlink(path)
        os.ftruncate(fd, SIZE)
        region = mmap.mmap(fd, SIZE)
        rows = []
        for wait in WAITS_S:
            time.sleep(wait)
            start = time.perf_counter()
            region.madvise(MADV_POPULATE_WRITE)
            took = time.perf_counter() - start
            if libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, SIZE) != 0:
                raise OSError(ctypes.get_errno(), "punch")
            rows.append((wait, SIZE / GiB / took))
        region.close()
        return rows
    finally:
        os.close(fd)


def main():
    print("| region directory | populate after a wait of | GiB/s |")
    print("|---|---:|---:|")
    for directory in sys.argv[1:] or ["/dev/shm"]:
        for wait, rate in probe(directory):
            print(f"| {directory} | {wait} s | {rate:.2f} |")


if __name__ == "__main__":
    main()
