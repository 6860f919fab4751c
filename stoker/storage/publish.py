"""Uploading a packed data set to an fsspec URL: what ``stoker pack SRC s3://...`` does once the
shards are packed locally.

Shards and indexes go first, the manifest last, so readers see a data set only once it is
complete. An object already there with the size the manifest gives is kept (an object store's
PUT is atomic: an object of the right size is a whole upload), so a rerun after a failure
resumes. Every upload is retried on transient errors (:func:`stoker.storage.retry.with_retries`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec

from stoker.format import MANIFEST_NAME, REJECTED_NAME, read_manifest
from stoker.storage.retry import with_retries


def publish(local: str | os.PathLike, url: str, *, storage_options: dict[str, Any] | None = None,
            retries: int = 5, backoff: float = 0.5) -> int:
    """Upload the packed data set in ``local`` to ``url``; return how many files were uploaded."""
    local = Path(local)
    manifest = read_manifest(local)
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    names = [n for s in manifest.shards for n in (s.name, s.index)]
    sizes = {n: (local / n).stat().st_size for n in names}
    uploaded = 0
    for name in names:
        target = f"{root}/{name}"
        if with_retries(f"{url}/{name}", lambda t=target: _size_or_none(fs, t), retries=retries,
                        backoff=backoff) == sizes[name]:
            continue
        with_retries(f"{url}/{name}", lambda n=name, t=target: fs.put_file(str(local / n), t), retries=retries,
                     backoff=backoff)
        uploaded += 1
    for name in (REJECTED_NAME, MANIFEST_NAME):  # the manifest last: readers see a complete data set or none
        if (local / name).exists():
            with_retries(f"{url}/{name}", lambda n=name: fs.put_file(str(local / n), f"{root}/{n}"),
                         retries=retries, backoff=backoff)
            uploaded += 1
    return uploaded


def _size_or_none(fs: fsspec.AbstractFileSystem, path: str) -> int | None:
    """The size of ``path``, or None where there is none yet: one request, not exists() then size()."""
    try:
        return fs.size(path)
    except FileNotFoundError:
        return None
