"""OpenCV's thread count while stoker.Loader runs: 1, since the Loader decodes on threads (or
worker processes) of its own and OpenCV's would only compete with them; once the last pass
running in this process ends, the count it had before. Importing stoker changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import TypeVar

import cv2

T = TypeVar("T")

_lock = threading.Lock()
_holders = 0  # blocks running now that want one OpenCV thread
_before = 0  # OpenCV's thread count before the first of them


@contextmanager
def one_opencv_thread() -> Iterator[None]:
    """OpenCV at 1 thread for the ``with`` block; the count it had is restored when the last such
    block running in the process (passes of several Loaders may overlap) ends."""
    global _holders, _before
    with _lock:
        if _holders == 0:
            _before = cv2.getNumThreads()
            cv2.setNumThreads(1)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                cv2.setNumThreads(_before)


def with_one_opencv_thread(items: Generator[T, None, None]) -> Generator[T, None, None]:
    """``items`` with OpenCV at 1 thread from the first item asked for until the last is made or
    the generator is closed (a Loader's pass: its batches)."""
    with one_opencv_thread():
        yield from items


def one_opencv_thread_in_worker(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` for a Loader's worker processes (started by a pass):
    OpenCV at 1 thread there too, whatever the start method."""
    cv2.setNumThreads(1)
