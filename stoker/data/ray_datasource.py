"""ShardDatasource: a stoker data set read by Ray Data, for Ray Train:
``ray.data.read_datasource(ShardDatasource(path))``.

    driver      the manifest: shards and their sample counts ──> runs of whole shards, one read task each
    read tasks  ShardDataset(path) on the worker ──> blocks of ROWS_PER_BLOCK rows: image, label, key

Rows come in the data set's order: ``image`` (decoded HWC uint8, or with ``decode="raw"`` the stored
bytes), ``label`` (int64, -1 for none) and ``key``. Each task reads its shards as ShardDataset
reads them (the index memory-mapped, every member checked against its checksum), from a folder
or an fsspec URL, with the same storage settings (a node cache too). Ray is imported here only: ``import stoker`` never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Literal

import numpy as np

try:
    from ray.data import Datasource, ReadTask
    from ray.data.block import Block, BlockAccessor, BlockMetadata
except ModuleNotFoundError as e:
    raise ModuleNotFoundError("stoker.ShardDatasource needs Ray Data: pip install 'stoker[ray-data]'", name=e.name) from None

from stoker.data.dataset import ShardDataset
from stoker.errors import OptionError
from stoker.storage.remote import DEFAULT_PARALLEL, DEFAULT_READ_TIMEOUT, is_url

RowDecode = Literal["rgb", "raw"]
ROW_DECODES = ("rgb", "raw")
ROWS_PER_BLOCK = 256


class ShardDatasource(Datasource):
    """The samples of the stoker data set at ``path`` (a folder, or an fsspec URL with
    ``storage_options``) as Ray Data rows of ``image``, ``label`` and ``key``. ``decode``:
    ``"rgb"`` gives HWC uint8 arrays, ``"raw"`` the stored bytes (smaller in Ray's object store:
    decode them in ``map_batches``). ``verify`` and the storage settings (``cache_dir``,
    ``cache_limit``, ``read_timeout``, ``reads_in_flight``) as ShardDataset takes them, checked
    here; a relative ``path`` or ``cache_dir`` is this process's (read tasks run elsewhere).
    One read task per run of whole shards, at most ``parallelism`` (Ray's ``override_num_blocks``)."""

    def __init__(self, path: str | os.PathLike, *, decode: RowDecode = "rgb", storage_options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, reads_in_flight: int = DEFAULT_PARALLEL,
                 verify: bool = True) -> None:
        super().__init__()
        if decode not in ROW_DECODES:
            raise OptionError(f"decode={decode!r}: must be 'rgb' (decoded HWC uint8 arrays) or 'raw' (the stored bytes)")
        self._decode = decode
        self._open = partial(ShardDataset, path if is_url(path) else os.path.abspath(path), decode,
                             storage_options=storage_options,
                             cache_dir=None if cache_dir is None else os.path.abspath(cache_dir),
                             cache_limit=cache_limit, read_timeout=read_timeout, reads_in_flight=reads_in_flight,
                             verify=verify)  # what each read task calls: a ShardDataset of its own
        self._manifest = self._open().shards.manifest  # read and checked here, before any task

    def estimate_inmemory_data_size(self) -> int | None:
        """The stored bytes with ``decode="raw"``; unknown for decoded images."""
        if self._decode != "raw":
            return None
        return sum(shard.bytes for shard in self._manifest.shards)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        """Runs of whole shards, as even in count as ``parallelism`` allows, in the data set's order."""
        shards = self._manifest.shards
        tasks = []
        for run in np.array_split(np.arange(len(shards)), max(1, min(parallelism, len(shards)))):
            if not len(run):
                continue
            first, last = shards[run[0]], shards[run[-1]]
            start, end = first.start, last.start + last.count
            size = sum(shards[s].bytes for s in run) if self._decode == "raw" else None
            metadata = BlockMetadata(num_rows=end - start, size_bytes=size, exec_stats=None,
                                     input_files=tuple(shards[s].name for s in run))
            tasks.append(ReadTask(partial(_read_rows, self._open, start, end), metadata,
                                  per_task_row_limit=per_task_row_limit))
        return tasks


def _read_rows(open_dataset: Callable[[], ShardDataset], start: int, end: int) -> Iterator[Block]:
    """Samples ``start:end`` as blocks of rows, read by a ShardDataset made in this task."""
    dataset = open_dataset()
    for first in range(start, end, ROWS_PER_BLOCK):
        indices = range(first, min(first + ROWS_PER_BLOCK, end))
        images = np.empty(len(indices), dtype=object)  # one entry per image: arrays of any shape, or bytes
        labels = np.empty(len(indices), dtype=np.int64)
        for n, i in enumerate(indices):
            images[n], labels[n] = dataset[i]
        keys = np.array([dataset.key(i) for i in indices], dtype=object)
        yield BlockAccessor.batch_to_block({"image": images, "label": labels, "key": keys})
