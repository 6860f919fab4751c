"""``stoker stage SRC DST``: copy a packed data set from any fsspec URL (``s3://``, ``gs://``,
``https://``, ``file://`` or a local path) to a local folder, verified, resumable, and skipping
what is already there and intact.

Each file is downloaded under a temporary name, its xxh3-128 checksum computed while it streams
and compared with the manifest's, then renamed into place; the manifest is written last, so a
folder holds a readable data set only once every shard is complete. A killed stage leaves at most
temporary files, which the next run removes. Transient errors (timeouts, dropped connections,
5xx) are retried with exponential backoff; permanent ones (missing object or bucket, denied
access, bad credentials) stop at once with the URL and the cause, and so does a file that
arrives with the same wrong checksum twice (CorruptDataError: damaged at the source).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stoker.errors import LocalWriteError, RemoteError
from stoker.format import MANIFEST_NAME, Manifest, atomic_write
from stoker.format.layout import check_name
from stoker.ranges import BACKOFF, RETRIES
from stoker.storage.locks import exclusive
from stoker.storage.remote import RemoteData, intact

STAGE_LOCK_NAME = ".stoker-stage.lock"
_PARTIAL = ".stoker-partial-"


class StageError(RemoteError):
    """A data set could not be staged; the message names the URL and the cause."""


@dataclass(frozen=True)
class StageResult:
    """What a stage did: files fetched and skipped (already intact), bytes fetched, seconds."""

    dst: Path
    fetched: int
    skipped: int
    fetched_bytes: int
    seconds: float


def stage(src: str, dst: str | os.PathLike, *, verify: bool = True, progress: bool = True, retries: int = 5,
          backoff: float = 0.5, storage_options: dict[str, Any] | None = None) -> StageResult:
    """Copy the data set at ``src`` into the folder ``dst``; see the module docstring.

    ``verify=False`` trusts files already in ``dst`` whose size matches the manifest (fetched
    files are always checked as they stream). A transient error is retried ``retries`` times,
    after ``backoff`` seconds, then twice that, and so on, each pause jittered to half or more of it
    (default 0.5 to 8 s, 7.75 to 15.5 s in all).
    ``storage_options`` go to fsspec (credentials, ``endpoint_url``, timeouts).
    """
    RETRIES.check(retries)
    BACKOFF.check(backoff)
    started = time.perf_counter()
    source = RemoteData(src, storage_options, retries=retries, backoff=backoff, error=StageError)
    # The source's manifest first: a missing or malformed source leaves no empty folder behind.
    text = source.read(MANIFEST_NAME)
    manifest = Manifest.from_json(text, f"{source.url}/{MANIFEST_NAME}")
    dst = Path(dst)
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        kind = "a file is there" if isinstance(e, FileExistsError) else e.strerror or str(e)
        raise LocalWriteError(f"{dst}: cannot stage into it ({kind}); DST is a folder, new or a previous stage's") from None
    with exclusive(dst / STAGE_LOCK_NAME):
        _remove_partials(dst)
        files = [(check_name(s.name), s.bytes, s.checksum) for s in manifest.shards]
        files += [(check_name(s.index), s.index_bytes, s.index_checksum) for s in manifest.shards]
        total = sum(size for _, size, _ in files)
        fetched = skipped = fetched_bytes = 0
        with tqdm(total=total, unit="B", unit_scale=True, desc="stage", disable=not progress) as bar:
            for name, size, checksum in files:
                if intact(dst / name, size, checksum, verify):
                    skipped += 1
                else:
                    source.download(name, size, checksum, dst / f"{_PARTIAL}{os.getpid()}-{name}",
                                    commit=functools.partial(os.replace, dst=dst / name))
                    fetched += 1
                    fetched_bytes += size
                bar.update(size)
        if not (dst / MANIFEST_NAME).is_file() or (dst / MANIFEST_NAME).read_bytes() != text:
            atomic_write(dst / MANIFEST_NAME, text)  # a copy, byte for byte: its checksum is the source's
    return StageResult(dst, fetched, skipped, fetched_bytes, time.perf_counter() - started)


def _remove_partials(dst: Path) -> None:
    """Temporary files of a stage that was killed: never complete, never used."""
    for leftover in dst.glob(f"{_PARTIAL}*"):
        leftover.unlink(missing_ok=True)
