"""A deadline that a file system's backend cannot outlive: a read of an object store gives up
``seconds`` after its last progress (the start, or the last bytes that arrived), however the
backend's own timeouts and retries are set; each call into the backend is abandoned (its request
cancelled on the backend's event loop) when the deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import fsspec
from fsspec.asyn import AsyncFileSystem, sync
from fsspec.callbacks import Callback

T = TypeVar("T")


class NoAnswer(ConnectionError):
    """A request abandoned because nothing arrived in time (a transient fault: asked again)."""


class Deadline:
    """``seconds`` from now, and from each :meth:`progressed` (bytes arrived: a slow but moving
    transfer is never cut, a silent one is)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self._at - time.monotonic()

    def progressed(self) -> None:
        """Bytes arrived: the deadline is ``seconds`` from now."""
        self._at = time.monotonic() + self.seconds


class Progress(Callback):
    """An fsspec callback (``get_file(..., callback=)``) that moves ``deadline`` with each piece that arrives."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def call(self, *args: Any, **kwargs: Any) -> None:
        self.deadline.progressed()


def call_within(fs: fsspec.AbstractFileSystem, method: str, deadline: Deadline, *args: Any, **kwargs: Any) -> Any:
    """``fs.method(*args, **kwargs)``, abandoned with NoAnswer once ``deadline`` passes (on an
    async file system: s3fs, gcsfs, HTTP, ...; a synchronous one, such as a local folder, is
    called as it is)."""
    if isinstance(fs, AsyncFileSystem) and not fs.asynchronous:
        return run_within(fs, getattr(fs, f"_{method}")(*args, **kwargs), deadline)
    return getattr(fs, method)(*args, **kwargs)


def run_within(fs: AsyncFileSystem, awaitable: Awaitable[T], deadline: Deadline) -> T:
    """Run ``awaitable`` on ``fs``'s event loop from this thread, abandoned once ``deadline`` passes."""
    return sync(fs.loop, _within, awaitable, deadline)


async def _within(awaitable: Awaitable[T], deadline: Deadline) -> T:
    task = asyncio.ensure_future(awaitable)
    try:
        while (left := deadline.left()) > 0:
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
        raise NoAnswer(f"nothing arrived for {deadline.seconds:g} s")
    finally:
        if not task.done():
            task.cancel()  # the backend closes its connection
            await asyncio.wait({task}, timeout=1.0)
