"""ShardDatasink: a Ray Data Dataset of images written as stoker shards,
``ds.write_datasink(ShardDatasink(dst))``.

    driver       on_write_start: column types checked, destination checked and locked (stoker/pack/engine_writes.py)
    write tasks  the rows Ray gives task i (rows_per_shard at least) ──> shard-<i>.tar + .idx (stoker/pack/rows.py)
    driver       on_write_complete: the records in task order ──> rejected.tsv, stoker.json last; the lock let go

Ray is imported here only: ``import stoker`` never loads it (the ``ray-data`` extra).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

try:
    import pyarrow as pa
    from ray.data import Datasink
    from ray.data.block import Block, BlockAccessor
    from ray.data.datasource.datasink import WriteResult
except ModuleNotFoundError as e:
    raise ModuleNotFoundError("stoker.ShardDatasink needs Ray Data: pip install 'stoker[ray-data]'", name=e.name) from None

from stoker.errors import StokerError
from stoker.format import shard_name
from stoker.pack.engine_writes import EngineWrite
from stoker.pack.finish import PackResult
from stoker.pack.rows import RowLayout, RowShards, row_image_options
from stoker.pack.shard_job import ShardRecord
from stoker.ranges import ROWS_PER_SHARD

if TYPE_CHECKING:
    from ray.data._internal.execution.interfaces import TaskContext  # Ray's own annotation of write()


class ShardDatasink(Datasink[ShardRecord | StokerError]):
    """Writes a Dataset's rows as a stoker data set in ``path``: each write task writes the rows
    Ray gives it as one shard (``rows_per_shard``: at least that many per task, else Ray's
    blocks), and the driver writes the manifest last, in task order. The shards are the ones
    `stoker pack` writes from the same rows (the same checks, members and index; the options are
    pack's); ``result`` is the PackResult once the write is complete.

    ``image_column`` holds encoded images (binary, kept as they are: ``ray.data.read_binary_files``
    gives them as ``bytes``) or paths every worker can read (string); a struct's field is named
    with a dot (``image.bytes``). ``label_column`` holds integers, or class names with ``classes``
    giving their order (``sorted(ds.unique("label"))`` is `stoker pack`'s); None for unlabelled
    rows. ``key_column``: each sample's key (default: its path, or ``shard-NNNNNN/<row>``).

    ``path`` must be a folder every worker shares, or an fsspec URL (``s3://...``,
    ``storage_options`` for fsspec). Bad images are left out and listed in ``rejected.tsv``
    (``strict``: the first stops the write); a rerun after a failure writes every shard again.
    """

    def __init__(self, path: str | os.PathLike, *, image_column: str = "image", label_column: str | None = "label",
                 key_column: str | None = None, classes: Sequence[str] | None = None,
                 rows_per_shard: int | None = None, max_side: int | None = None, quality: int | None = None,
                 verify_decode: bool = False, restart_rows: bool = False, strict: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        self._image = row_image_options(max_side, quality, verify_decode, restart_rows)
        self._rows_per_shard = None if rows_per_shard is None else ROWS_PER_SHARD.check(rows_per_shard)
        self._columns = (image_column, label_column, key_column)
        self._classes = tuple(classes) if classes is not None else None
        self._strict = strict
        self._write = EngineWrite(os.fspath(path), "ray_dataset", "ray.data.Dataset", "the Dataset",
                                  dict(storage_options or {}))
        self._started = time.perf_counter()
        self._held: ExitStack | None = None  # the destination's lock, from on_write_start to the write's end
        self.result: PackResult | None = None

    @property
    def min_rows_per_write(self) -> int | None:
        return self._rows_per_shard

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Refuse columns that do not fit before any task runs; check, make and lock the
        destination (the lock held by the driver until the write completes or fails)."""
        self._started = time.perf_counter()
        if schema is not None:
            self._layout(schema)
        held = ExitStack()
        held.enter_context(self._write.opened())
        self._held = held

    def write(self, blocks: Iterable[Block], ctx: TaskContext) -> ShardRecord | StokerError:
        """This task's rows as shard ``ctx.task_idx`` (run in the task; errors are returned, see RowShards.write)."""
        tables = (BlockAccessor.for_block(block).to_arrow().flatten() for block in blocks)
        first = next(tables, None)
        if first is None:
            return ShardRecord(shard_name(ctx.task_idx), "", None)
        try:
            layout = self._layout(first.schema)
        except StokerError as e:
            return e
        shards = RowShards(layout, self._classes, str(self._write.local), self._image, self._strict,
                           self._write.upload, "write task")
        return shards.write(ctx.task_idx, _rows(chain([first], tables), layout))

    def on_write_complete(self, write_result: WriteResult[ShardRecord | StokerError]) -> None:
        """The manifest last, from every task's record (the first error a task returned is
        raised); then the destination's lock is let go."""
        try:
            self.result = self._write.commit(write_result.write_returns, self._classes,
                                             self._write.options("ray", self._columns, self._image), self._strict,
                                             self._started)
        finally:
            self._release()

    def on_write_failed(self, error: Exception) -> None:
        """The destination's lock let go: a rerun may write there."""
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def __getstate__(self) -> dict[str, Any]:
        """What a write task gets: all but the driver's lock."""
        return {**self.__dict__, "_held": None}

    def _layout(self, schema: pa.Schema) -> RowLayout:
        flat = schema.empty_table().flatten().schema  # struct fields as columns: image.bytes
        layout = RowLayout.of({f.name: _kind(f.type) for f in flat}, *self._columns, "the Dataset")
        layout.check_classes(self._classes)
        return layout


def _rows(tables: Iterable[pa.Table], layout: RowLayout) -> Iterator[tuple[Any, Any, Any]]:
    """(image, label, key) cells of each row, one block in memory at a time."""
    for table in tables:
        columns = [table.column(name).to_pylist() if name else repeat(None)
                   for name in (layout.image, layout.label, layout.key)]
        yield from zip(*columns)


def _kind(data_type: pa.DataType) -> str:
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type):
        return "bytes"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "text"
    if pa.types.is_integer(data_type):
        return "integer"
    return str(data_type)
