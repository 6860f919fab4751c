"""Uploading packed shards to an fsspec URL: what ``stoker pack SRC s3://...`` does.

Each pack task uploads the shard it wrote (:class:`Upload`); :func:`publish` then uploads
anything still missing, and the manifest last, so readers see a data set only once it is
complete. An object already there with the size the manifest gives is kept (an object store's
PUT is atomic: an object of the right size is a whole upload), so a rerun after a failure
resumes. Every upload is retried on transient errors (:func:`stoker.storage.retry.with_retries`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from stoker.errors import RemoteError
from stoker.format import MANIFEST_NAME, REJECTED_NAME, read_manifest
from stoker.storage.remote import cache_root
from stoker.storage.retry import with_retries


@dataclass(frozen=True)
class Upload:
    """A destination URL (``s3://bucket/prefix``) and the fsspec options to reach it."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 5
    backoff: float = 0.5

    def put(self, local: str | os.PathLike, name: str) -> None:
        """Upload the file ``local`` as ``url/name``, retrying transient errors."""
        fs, root = self._fs()
        with_retries(f"{self.url}/{name}", lambda: fs.put_file(str(local), f"{root}/{name}"),
                     retries=self.retries, backoff=self.backoff)

    def read(self, name: str) -> bytes:
        """The bytes of ``url/name``; RemoteError when it is missing or cannot be read."""
        fs, root = self._fs()
        return with_retries(f"{self.url}/{name}", lambda: fs.cat_file(f"{root}/{name}"),
                            retries=self.retries, backoff=self.backoff)

    def sizes(self) -> dict[str, int]:
        """The size of every object directly under the URL, by name: one listing request. Nothing
        there yet is an empty listing; denied access and other failures raise RemoteError."""
        fs, root = self._fs()

        def listing() -> list[dict]:
            try:
                return fs.ls(root, detail=True, refresh=True)
            except FileNotFoundError:
                return []

        entries = with_retries(self.url, listing, retries=self.retries, backoff=self.backoff)
        return {entry["name"].rsplit("/", 1)[-1]: entry["size"] for entry in entries if entry.get("type") == "file"}

    @property
    def scratch(self) -> Path:
        """The folder on this machine where shards for this URL are written before upload, and where
        the driver keeps the plan and records; each node computes its own (homes differ)."""
        return cache_root() / "pack" / hashlib.sha256(self.url.encode()).hexdigest()[:24]

    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return fsspec.core.url_to_fs(self.url, **self.storage_options)


def publish(local: str | os.PathLike, url: str, *, storage_options: dict[str, Any] | None = None,
            retries: int = 5, backoff: float = 0.5) -> int:
    """Upload the packed data set in ``local`` to ``url``: shards that are not there yet with the
    manifest's sizes, then the rejected-input report and the manifest; return how many files
    were uploaded."""
    local = Path(local)
    manifest = read_manifest(local)
    upload = Upload(url, storage_options or {}, retries, backoff)
    there = upload.sizes()
    uploaded = 0
    for shard in manifest.shards:
        for name, size in ((shard.name, shard.bytes), (shard.index, shard.index_bytes)):
            if there.get(name) != size:
                if not (local / name).is_file():
                    raise RemoteError(f"{url}/{name}: missing or of the wrong size there, and no longer in {local}; "
                                      f"delete {local} and pack again")
                upload.put(local / name, name)
                uploaded += 1
    for name in (REJECTED_NAME, MANIFEST_NAME):  # the manifest last: readers see a complete data set or none
        if (local / name).exists():
            upload.put(local / name, name)
            uploaded += 1
    return uploaded
