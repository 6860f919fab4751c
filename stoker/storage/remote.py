"""A packed data set at an fsspec URL (``s3://``, ``gs://``, ``https://``, ...), read in place.

Only the manifest and the indexes are fetched up front, into a local metadata folder (checked
against the manifest's checksums, refetched when damaged, shared by every process on the node),
so indexes are memory-mapped as for a local data set; shard bytes are read by range, one request
per member. Picklable: a DataLoader worker re-creates the file system in its own process.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import fsspec

from stoker.format import MANIFEST_NAME, Manifest, file_checksum
from stoker.format.layout import atomic_write, check_name
from stoker.storage.retry import with_retries


def is_url(path: str | os.PathLike) -> bool:
    """True for an fsspec URL other than a plain local path (``file://`` counts as a URL)."""
    return isinstance(path, str) and "://" in path


def cache_root() -> Path:
    """Where stoker keeps node-local files: ``$XDG_CACHE_HOME/stoker`` or ``~/.cache/stoker``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stoker"


class RemoteData:
    """The data set at ``url``: :meth:`metadata` fetches its manifest and indexes, :meth:`read`
    reads a range of one of its files. ``storage_options`` go to fsspec."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, retries: int = 5,
                 backoff: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retries, self.backoff = retries, backoff
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root = ""
        self._pid = 0

    def metadata(self) -> Path:
        """A local folder holding this data set's manifest and every index, fetched if missing or damaged."""
        folder = cache_root() / "metadata" / hashlib.sha256(self.url.encode()).hexdigest()[:24]
        folder.mkdir(parents=True, exist_ok=True)
        text = self.read(MANIFEST_NAME).decode("utf-8")
        manifest = Manifest.from_json(text, f"{self.url}/{MANIFEST_NAME}")
        for entry in manifest.shards:
            path = folder / check_name(entry.index)
            if not (path.is_file() and path.stat().st_size == entry.index_bytes
                    and file_checksum(path) == entry.index_checksum):
                atomic_write(path, self.read(entry.index))
        atomic_write(folder / MANIFEST_NAME, text.encode("utf-8"))
        return folder

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start:end`` of the data set's file ``name`` (all of it by default), retried on
        transient errors; a RemoteError names the URL when it fails for good."""
        url = f"{self.url}/{name}"
        return with_retries(url, lambda: self._filesystem().cat_file(f"{self._root}/{name}", start=start, end=end),
                            retries=self.retries, backoff=self.backoff)

    def _filesystem(self) -> fsspec.AbstractFileSystem:
        if self._fs is None or self._pid != os.getpid():  # made again in a forked or spawned worker
            self._fs, self._root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options, "retries": self.retries,
                "backoff": self.backoff}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)
