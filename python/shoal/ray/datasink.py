"""`ShoalDatasink`: Ray Data writing a table into the store.

    ds.write_datasink(shoal.ray.ShoalDatasink("tables/events"))
    table = shoal.connect().get_named("tables/events")     # one pyarrow.Table, no copy

Each write task puts every block it gets into its own Ray node's store as one chunk (an
Arrow table, named `<name>.parts/<write>/<task>-<block>` so a listing shows them and a
failed write finds them). When every task has written, the driver binds `name` to a
manifest of the chunks in order (shoal.chunked): readers see the previous version or this
one, whole, never part of it. Afterwards `<name>.parts/` holds exactly the bound version's
chunks: those of the version replaced, and any a failed or retried task left, are deleted;
a write that fails deletes its own and leaves the previous version as it was. One writer
per name at a time.

The table outlives the job (it is the write's output); `durability=` says when each
chunk's and the manifest's seal returns (docs/tiers.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from ray.data._internal.execution.interfaces import TaskContext
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink
from ray.data.datasource.datasink import WriteResult

from shoal import chunked
from shoal._ids import ObjectID
from shoal.client import DURABILITY_LEVELS
from shoal.errors import InvalidArgument, ObjectNotFound, ShoalError
from shoal.ray import store

#: Ray Data passes a write's id to its tasks under this key (`ctx.kwargs`).
_WRITE_ID = "write_uuid"

#: One chunk a write task stored: its part name, id, rows, bytes, node.
Written = tuple[str, str, int, int, int]


class ShoalDatasink(Datasink[list[Written]]):
    """Writes a Dataset as the chunked table `name` (module docstring)."""

    def __init__(self, name: str, *, durability: str | None = None) -> None:
        if durability is not None and durability not in DURABILITY_LEVELS:
            raise InvalidArgument(f"durability must be one of {DURABILITY_LEVELS}, got {durability!r}")
        self.name = name.strip("/")
        self.durability = durability
        self._schema: pa.Schema | None = None
        #: The id of the manifest the last write bound (None before).
        self.manifest_id: ObjectID | None = None

    @property
    def parts(self) -> str:
        """The directory of the table's chunks."""
        return f"{self.name}.parts"

    def get_name(self) -> str:
        return "Shoal"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self._schema = schema

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> list[Written]:
        client = store.client()
        write_id = ctx.kwargs.get(_WRITE_ID) or "write"
        written = []
        for i, block in enumerate(blocks):
            table = BlockAccessor.for_block(block).to_arrow()
            if table.num_rows == 0:
                continue
            part = f"{self.parts}/{write_id}/{ctx.task_idx:06d}-{i:06d}"
            oid = client.put(table, durability=self.durability, name=part)
            written.append((part, oid.hex(), table.num_rows, len(client.get_buffer(oid, 0)), client.node))
        return written

    def on_write_complete(self, write_result: WriteResult[list[Written]]) -> None:
        written = sorted(w for returned in write_result.write_returns for w in returned)
        client = store.client()
        schema = self._schema
        if schema is None:
            schema = client.get(ObjectID.from_hex(written[0][1]), 0).schema if written else pa.schema([])
        manifest = chunked.Manifest(
            schema, tuple(chunked.Chunk(ObjectID.from_hex(i), r, b, n) for _, i, r, b, n in written)
        )
        self.manifest_id = chunked.bind(client, self.name, manifest, durability=self.durability)
        self._delete_parts(keep={w[0] for w in written})

    def on_write_failed(self, error: Exception) -> None:
        try:
            current = chunked.read(store.client().get_named_buffer(self.name))
        except (ObjectNotFound, InvalidArgument):
            current = None
        keep_ids = set() if current is None else {c.id for c in current.chunks}
        self._delete_parts(keep_ids=keep_ids)

    def _delete_parts(self, *, keep: set[str] | None = None, keep_ids: set[ObjectID] | None = None) -> None:
        """Unlinks the chunks under `parts` except those named in `keep` or with ids in
        `keep_ids`."""
        client = store.client()
        for row in client.ls(self.parts):
            if (keep is not None and row.name in keep) or (keep_ids is not None and row.id in keep_ids):
                continue
            try:
                client.unlink(row.name)
            except ShoalError:
                pass  # gone meanwhile

    def __repr__(self) -> str:
        return f"ShoalDatasink({self.name!r})"
