"""What the driver of a Spark or Ray Data write does around its workers' shards: the destination
checked, made and locked before any row is written (the lock held until the manifest is written);
at the end the records in shard order, leftovers of earlier runs removed, then `stoker pack`'s own
last step (stoker/pack/finish.py: the rejected-input report, the manifest last), uploaded last for
a URL.

A rerun after a failure writes every shard again, each under a temporary name renamed into place
(stoker/pack/writer.py); a destination holding a finished data set is refused.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import PackError, StokerError
from stoker.format import MANIFEST_NAME
from stoker.format.layout import WORK_DIR_NAME
from stoker.pack.destination import check_destination, pack_lock, remove_leftovers
from stoker.pack.finish import PackResult, finish
from stoker.pack.options import ImageOptions
from stoker.pack.shard_job import ShardRecord
from stoker.sources import Source
from stoker.storage.publish import Upload, publish
from stoker.storage.remote import is_url


@dataclass(frozen=True)
class EngineWrite:
    """A write into ``dst`` (a folder every worker reaches, or an fsspec URL) of ``what`` (``the
    DataFrame``), an object of class ``origin``; ``kind`` is the manifest's source kind."""

    dst: str
    kind: str
    origin: str
    what: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not is_url(self.dst):  # made absolute here, on the driver: the workers' folders are not its own
            object.__setattr__(self, "dst", os.path.abspath(self.dst))

    @property
    def upload(self) -> Upload | None:
        """For a URL: each worker writes its shard in its node's scratch folder and uploads it."""
        return Upload(self.dst, self.storage_options) if is_url(self.dst) else None

    @property
    def local(self) -> Path:
        """Where this process writes: the folder, or for a URL the scratch folder uploaded at the end."""
        upload = self.upload
        return upload.scratch if upload is not None else Path(self.dst)

    @contextmanager
    def opened(self) -> Iterator[None]:
        """The destination made and locked for the ``with`` block, on the driver (pack_lock:
        another write or `stoker pack` into it waits, then is refused); refused where it holds
        files that are not stoker's or, checked under the lock so that two writes cannot both find
        it empty, a finished data set. PackError names it."""
        check_destination(self._source(None), self.local)
        try:
            self.local.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PackError(f"{self.local}: cannot make the folder: {e.strerror or e}") from None
        with pack_lock(self.local):
            upload = self.upload
            finished = MANIFEST_NAME in upload.sizes() if upload is not None else (self.local / MANIFEST_NAME).exists()
            if finished:
                raise PackError(f"{self.dst}: holds a finished stoker data set; write into a new folder, or delete it "
                                "first")
            yield

    def commit(self, results: Iterable[ShardRecord | StokerError], classes: Sequence[str] | None, options: dict,
               strict: bool, started: float) -> PackResult:
        """The data set from the workers' results: an error one returned is raised as it is;
        otherwise the manifest of the shards, in shard order, is written last (and uploaded)."""
        records: list[ShardRecord] = []
        for returned in results:
            if isinstance(returned, StokerError):
                raise returned
            records.append(returned)
        records.sort(key=lambda record: record.name)
        if not any(record.entry is not None or record.rejected for record in records):
            raise PackError(f"{self.dst}: {self.what} holds no rows; nothing was written")
        try:
            if self.upload is None:
                self._check_arrived(records)
            remove_leftovers(self.local, {record.entry.name for record in records if record.entry})
            result = finish(self._source(classes), self.local, records, 0, options, "", strict, started)
            shutil.rmtree(self.local / WORK_DIR_NAME, ignore_errors=True)
            if self.upload is not None:
                publish(self.local, self.dst, storage_options=self.storage_options)
                shutil.rmtree(self.local, ignore_errors=True)
                result = replace(result, dst=self.dst)
        except OSError as e:
            raise PackError(f"{e.filename or self.local}: {e.strerror or e}") from None
        return result

    def options(self, engine: str, columns: Sequence[str | None], image: ImageOptions) -> dict[str, Any]:
        """What the manifest records of how the data set was made: the engine, the columns
        (image, label, key) and the image options, as `stoker pack` records its own."""
        return {"engine": engine, **dict(zip(("image_column", "label_column", "key_column"), columns)), **asdict(image)}

    def _source(self, classes: Sequence[str] | None) -> Source:
        """The source as the manifest records it: its kind, the class written, the class names
        (no listing: the rows were read where they live)."""
        return Source(self.kind, Path(self.origin), [], [], np.zeros(0, np.int64), list(classes) if classes else None)

    def _check_arrived(self, records: list[ShardRecord]) -> None:
        """A shard a worker reports must be here as this process sees it: a worker on another
        node writes a local path on its own disk."""
        for record in records:
            if record.entry is not None:
                shard = self.local / record.entry.name
                if not shard.is_file() or shard.stat().st_size != record.entry.bytes:
                    raise PackError(f"{shard}: written by a worker but not found here; the destination must be a "
                                    "folder every worker shares, or an object store URL (s3://...)")
