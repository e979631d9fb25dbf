"""The agent of one emulated host (tests/python/multihost.py): a client of that host's daemon,
driven by the test over a pipe.

Each host has a private /dev/shm and /tmp, so only a process inside the host can be a client
of its daemon. The harness starts this program inside the host's namespaces and sends it one
JSON request per line on stdin; it answers each with one JSON line on stdout, in order:

    {"op": "call", "method": "put", "args": [...], "kwargs": {...}}  -> shoal.Client.<method>
    {"op": "checksums", "ids": [...], "timeout_ms": 0}  -> sha256 of each object's data or None
    {"op": "exec", "code": "...", "vars": {...}}  -> Python run with `client`, `shoal`, `pa`;
                                                    answers the value it leaves in `result`
    {"op": "write", "path": "...", "text": "...", "mode": 384}  -> a file on this host
    {"op": "read", "path": "..."}  -> a file's text
    {"op": "run", "argv": [...], "timeout": 30}  -> {"returncode", "stdout", "stderr"}
    {"op": "serving"}  -> whether the daemon accepts a client now
    {"op": "reconnect"}  -> drops the client (the next call connects again)

An answer is {"ok": VALUE, "seconds": S} or {"error": TYPE, "message": TEXT, "seconds": S},
where TYPE is the exception's class name (a shoal.errors class for store errors) and S is
how long the operation took here (no pipe or scheduling of the test process in it).

Values cross the pipe tagged (`encode` / `decode`): ids, bytes, Arrow tables and arrays,
numpy arrays, buffers of store memory (sent as bytes). Only the standard library, shoal,
pyarrow and numpy are imported, so the agent starts quickly.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time
import traceback
from typing import Any

import numpy as np
import pyarrow as pa

import shoal


def _ipc(value: pa.Table | pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, value.schema) as writer:
        writer.write(value)
    return sink.getvalue().to_pybytes()


def encode(value: Any) -> Any:
    """A JSON-able form of `value` that `decode` turns back into an equal value."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, shoal.ObjectID):
        return {"oid": value.hex()}
    if isinstance(value, bytes | bytearray | memoryview | shoal.Buffer | pa.Buffer):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, pa.Table | pa.RecordBatch):
        return {"arrow": base64.b64encode(_ipc(value)).decode(), "kind": type(value).__name__}
    if isinstance(value, pa.Array | pa.ChunkedArray):
        column = value if isinstance(value, pa.ChunkedArray) else pa.chunked_array([value])
        table = pa.table({"a": column})
        return {"arrow": base64.b64encode(_ipc(table)).decode(), "kind": type(value).__name__}
    if isinstance(value, np.ndarray):
        return {"numpy": base64.b64encode(value.tobytes()).decode(), "dtype": value.dtype.str,
                "shape": list(value.shape)}  # fmt: skip
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if hasattr(value, "__dataclass_fields__"):  # ObjectInfo, NameInfo
        return {"dict": [[k, encode(getattr(value, k))] for k in value.__dataclass_fields__]}
    raise TypeError(f"cannot send a {type(value).__name__} over the agent's pipe")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "oid" in value:
        return shoal.ObjectID.from_hex(value["oid"])
    if "bytes" in value:
        return base64.b64decode(value["bytes"])
    if "arrow" in value:
        table = pa.ipc.open_stream(base64.b64decode(value["arrow"])).read_all()
        kind = value["kind"]
        if kind == "RecordBatch":
            return table.combine_chunks().to_batches()[0]
        if kind == "ChunkedArray":
            return table.column(0)
        if kind in ("Array",) or kind.endswith("Array"):
            return table.column(0).combine_chunks()
        return table
    if "numpy" in value:
        flat = np.frombuffer(base64.b64decode(value["numpy"]), dtype=np.dtype(value["dtype"]))
        return flat.reshape(value["shape"])
    if "dict" in value:
        return {decode(k): decode(v) for k, v in value["dict"]}
    raise ValueError(f"unknown tagged value {sorted(value)}")


class Agent:
    def __init__(self, socket: str) -> None:
        self.socket = socket
        self._client: shoal.Client | None = None
        self.scope: dict[str, Any] = {}  # what `exec` snippets keep between requests

    @property
    def client(self) -> shoal.Client:
        if self._client is None:
            self._client = shoal.Client(self.socket)
        return self._client

    def reconnect(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except shoal.ShoalError:
                pass  # the daemon is gone: nothing to close
            self._client = None
        self.scope.clear()  # buffers of the old connection

    def handle(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        if op == "call":
            method = getattr(self.client, request["method"])
            args = decode(request.get("args", []))
            kwargs = decode(request.get("kwargs", {"dict": []}))
            return method(*args, **kwargs)
        if op == "checksums":
            ids = decode(request["ids"])
            buffers = self.client.get_buffers(ids, timeout_ms=request.get("timeout_ms", 0))
            sums = [None if b is None else hashlib.sha256(memoryview(b)).hexdigest() for b in buffers]
            del buffers
            return sums
        if op == "exec":
            scope = {"client": self.client, "shoal": shoal, "pa": pa, "np": np, "keep": self.scope}
            scope.update(decode(request.get("vars", {"dict": []})))
            exec(request["code"], scope)
            return scope.get("result")
        if op == "write":
            with open(request["path"], "w") as file:
                file.write(request["text"])
            if "mode" in request:
                import os

                os.chmod(request["path"], request["mode"])
            return None
        if op == "read":
            with open(request["path"], errors="replace") as file:
                return file.read()
        if op == "run":
            done = subprocess.run(
                request["argv"], capture_output=True, text=True, timeout=request.get("timeout", 30)
            )
            return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        if op == "serving":
            try:
                shoal.Client(self.socket).close()
                return True
            except shoal.Disconnected:
                return False
        if op == "reconnect":
            self.reconnect()
            return None
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    agent = Agent(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the answers
    for line in sys.stdin:
        started = time.monotonic()
        try:
            value = agent.handle(json.loads(line))
            answer = {"ok": encode(value)}
        except Exception as err:  # every error goes back to the test, typed
            answer = {"error": type(err).__name__, "message": str(err)}
            if not isinstance(err, shoal.ShoalError):
                answer["traceback"] = traceback.format_exc()
        answer["seconds"] = time.monotonic() - started
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
