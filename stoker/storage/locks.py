"""File locks (``flock``) shared by every process on a node: released by the kernel when the
holder exits or is killed, so a crash never leaves a lock behind.

Lock files are never deleted: deleting one would let two processes hold "the" lock on two files.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Waits for another holder; with ``timeout`` gives up after that many seconds with TimeoutError.
    A forked child inherits the lock, which is released when the last process holding it is gone.
    """
    with open(path, "a") as f:
        if timeout is None:
            fcntl.flock(f, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while not _try(f, fcntl.LOCK_EX):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: held by another process for over {timeout:g} s")
                time.sleep(0.1)
        yield


def is_locked(path: Path) -> bool:
    """Whether another process holds the exclusive lock on ``path`` right now."""
    try:
        with open(path, "a") as f:
            return not _try(f, fcntl.LOCK_SH)
    except FileNotFoundError:
        return False


def wait_unlocked(path: Path) -> None:
    """Return once nobody holds the exclusive lock on ``path``."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)


def _try(f, operation: int) -> bool:
    try:
        fcntl.flock(f, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
