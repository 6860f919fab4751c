"""One ranged read that keeps what arrived: the bytes of a range are appended to a buffer as they
come, so a read cut short by a reset or a closed connection is retried from its last good byte.

fsspec's ``cat_file(start=, end=)`` returns a range whole or raises, and s3fs retries it from the
start; a reset at 90% of an 8 MiB block then costs the 7 MB again. So on s3fs the range is
streamed from the GetObject body (aiobotocore's ``read(amt)``, on s3fs's own event loop and
client); other file systems fall back to ``cat_file`` for what is still missing.
"""

from __future__ import annotations

import contextlib
from typing import Any

import fsspec
from fsspec.asyn import sync

# Bytes taken from a streaming body per read: what arrived before a failure is kept in pieces this small.
_PIECE = 256 << 10


def read_into(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, out: bytearray) -> None:
    """Append bytes ``start + len(out)`` to ``end`` of ``path`` to ``out``, as they arrive (on an
    error, ``out`` keeps every byte that came before it)."""
    begin = start + len(out)
    if begin >= end:
        return
    if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):  # s3fs: stream the body
        sync(fs.loop, _s3_stream, fs, path, begin, end, out)
    else:
        out += fs.cat_file(path, start=begin, end=end)


async def _s3_stream(fs: Any, path: str, begin: int, end: int, out: bytearray) -> None:
    bucket, key, version = fs.split_path(path)
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={begin}-{end - 1}",
                                 **({"VersionId": version} if version else {}))
    body = response["Body"]
    wanted = end - begin + len(out)
    try:
        while piece := await body.read(_PIECE):  # a short body raises at its end (Content-Length checked)
            out += piece
    except Exception:
        # aiohttp raises a connection's error ahead of the bytes that arrived before it, still in
        # its buffer: keep those too (its private _read_nowait; without it the retry starts earlier)
        buffered = getattr(getattr(getattr(body, "_raw_stream", None), "content", None), "_read_nowait", None)
        if buffered is not None:
            with contextlib.suppress(Exception):
                out += buffered(-1)[: wanted - len(out)]
        raise
    finally:
        body.close()
