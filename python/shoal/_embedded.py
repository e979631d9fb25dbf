"""The embedded default: a store daemon started on demand by `shoal.connect()`.

It runs as its own process (`python -m shoal serve`), so it outlives no one:
with `--idle-exit` it stops once the last client has disconnected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from shoal import _internal
from shoal.errors import Disconnected

DEFAULT_CAPACITY = "1GiB"
IDLE_EXIT_SECONDS = 1.0


def default_socket() -> str:
    return os.environ.get("SHOAL_SOCKET") or _internal.default_socket()


def start(socket: str, capacity: str | int, timeout: float = 15.0) -> None:
    """Starts a daemon on `socket` and waits until it accepts connections.

    Two processes racing here both start one; the daemon's lock lets exactly
    one serve and the other exits, which is harmless.
    """
    # Refuses a directory another user made or can change (a squatted
    # /tmp/shoal-$UID), and a log path that is a planted symbolic link.
    _internal.ensure_socket_dir(socket)
    log = _internal.open_private_log(socket + ".log")
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal",
                "serve",
                "--socket",
                socket,
                "--capacity",
                str(capacity),
                "--idle-exit",
                str(IDLE_EXIT_SECONDS),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        os.close(log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _internal.Client(socket).close()
            return
        except Disconnected:
            if process.poll() not in (None, 0, 1):
                break
            time.sleep(0.01)
    raise Disconnected(f"the embedded shoal daemon did not start on {socket}; see {socket}.log")
