"""One ranged read that keeps what arrived: the bytes of a range are appended to a buffer as they
come, so a read cut short by a reset or a closed connection is retried from its last good byte;
and an answer that does not hold what was asked (a body shorter than its headers promise, a
server that ignored the Range and sent the whole object, more bytes than asked) is a transport
fault, retried, never taken for the object's content.

fsspec's ``cat_file(start=, end=)`` returns a range whole or raises, and s3fs retries it from the
start; a reset at 90% of an 8 MiB block then costs the 7 MB again. So on s3fs the range is
streamed from the GetObject body (aiobotocore's ``read(amt)``, on s3fs's own event loop and
client), each wait for the answer and for each piece bounded by ``stall`` seconds (a silent
connection is abandoned and asked again); other file systems fall back to ``cat_file`` for what
is still missing. Every call is bounded by a :class:`~stoker.storage.deadline.Deadline`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import fsspec

from stoker.storage.deadline import Deadline, NoAnswer, call_within, run_within

# Bytes taken from a streaming body per read: what arrived before a failure is kept in pieces this small.
_PIECE = 256 << 10
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class BrokenAnswer(ConnectionError):
    """An answer that does not hold what was asked (a transient fault: asked again)."""


def read_into(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, out: bytearray, deadline: Deadline,
              stall: float) -> int | None:
    """Append bytes ``start + len(out)`` to ``end`` of ``path`` to ``out``, as they arrive (on an
    error, ``out`` keeps every byte that came before it). Returns the object's size when the
    answer says it (an object shorter than ``end`` ends ``out`` early), else None; an answer that
    does not hold what was asked raises BrokenAnswer. ``deadline`` moves with each piece that
    arrives; ``stall``: the longest wait for the answer or its next piece before it is abandoned."""
    begin = start + len(out)
    if begin >= end:
        return None
    if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):  # s3fs: stream the body
        return run_within(fs, _s3_stream(fs, path, begin, end, out, deadline, stall), deadline)
    data = call_within(fs, "cat_file", deadline, path, start=begin, end=end)
    if len(data) > end - begin:
        raise BrokenAnswer(f"{len(data)} bytes came for a range of {end - begin} (the server ignored the Range?)")
    out += data
    deadline.progressed()
    return None


async def _s3_stream(fs: Any, path: str, begin: int, end: int, out: bytearray, deadline: Deadline,
                     stall: float) -> int:
    bucket, key, version = fs.split_path(path)
    response = await _waited(fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={begin}-{end - 1}",
                                         **({"VersionId": version} if version else {})), stall)
    body = response["Body"]
    wanted: int | None = None  # len(out) once every byte asked of this answer is in
    try:
        size, take = _answered(response, begin, end)
        wanted = len(out) + take
        while len(out) < wanted:
            piece = await _waited(body.read(min(_PIECE, wanted - len(out))), stall)
            if not piece:  # aiobotocore checks Content-Length; this, the body against the range asked
                raise BrokenAnswer(f"the answer for bytes {begin}-{end - 1} ended {wanted - len(out)} bytes early")
            out += piece
            deadline.progressed()
        return size
    except Exception:
        # aiohttp raises a connection's error ahead of the bytes that arrived before it, still in
        # its buffer: keep those too (its private _read_nowait; without it the retry starts earlier)
        buffered = getattr(getattr(getattr(body, "_raw_stream", None), "content", None), "_read_nowait", None)
        if buffered is not None and wanted is not None:
            with contextlib.suppress(Exception):
                out += buffered(-1)[: wanted - len(out)]
        raise
    finally:
        body.close()


def _answered(response: dict, begin: int, end: int) -> tuple[int, int]:
    """(the object's size, the bytes to take) from the answer to a GET of bytes ``begin``..``end - 1``;
    BrokenAnswer when it is not an answer to that range."""
    where = _CONTENT_RANGE.fullmatch(response.get("ContentRange") or "")
    if where is not None and where.group(3) != "*":
        first, size = int(where.group(1)), int(where.group(3))
        if first != begin:
            raise BrokenAnswer(f"asked for bytes {begin}-{end - 1}, the answer holds bytes {where.group(0)[6:]}")
        return size, min(end, size) - begin
    size = int(response.get("ContentLength", -1))
    if begin != 0 or size < 0:  # a whole object, or no length: the server ignored the Range
        raise BrokenAnswer(f"asked for bytes {begin}-{end - 1}, the answer is "
                           f"{'the whole object' if size >= 0 else 'of unknown length'} (the Range was ignored)")
    return size, min(end, size)  # the object's start: what is needed of it is taken, the rest left


async def _waited(awaitable: Any, stall: float) -> Any:
    """``awaitable``, abandoned with NoAnswer when it takes over ``stall`` seconds."""
    try:
        return await asyncio.wait_for(awaitable, stall)
    except asyncio.TimeoutError:
        raise NoAnswer(f"nothing arrived for {stall:g} s") from None
