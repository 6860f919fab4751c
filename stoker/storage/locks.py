"""File locks (``flock``) shared by every process on a node: released by the kernel when the
holder exits or is killed, so a crash never leaves a lock behind.

A forked child shares its parent's open files, and with them the parent's ``flock`` locks. That
is wanted for a pack (its worker processes keep the destination locked until the last one is
gone) and wrong for the node cache: a DataLoader worker forked while a stager thread holds a
shard's lock would hold it for its whole life, and readers waiting for that shard would wait
for it. Locks taken with ``inherit=False`` are therefore closed in every forked child.

Lock files are never deleted: deleting one would let two processes hold "the" lock on two files.

Within a process, :class:`ProcessLock` is a threading lock that a forked child gets fresh.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stoker.storage.files import descriptor_limit

# Descriptors of locks a forked child must not keep, and a lock that keeps fork() out of the
# moment between opening one and recording it (reentrant: should two threads register the fork
# hooks at once, each hook runs twice, harmlessly).
_PRIVATE: set[int] = set()
_OPENING = threading.RLock()
_hooked = False  # the fork hooks are registered: on the first lock, not at import


def _before_fork() -> None:
    _OPENING.acquire()


def _after_fork_in_parent() -> None:
    _OPENING.release()


def _after_fork_in_child() -> None:
    global _OPENING
    for fd in _PRIVATE:
        try:
            os.close(fd)
        except OSError:
            pass
    _PRIVATE.clear()
    _OPENING = threading.RLock()


def _hook_fork() -> None:
    """Register the fork hooks, before the first lock is opened: importing stoker leaves the
    process's fork hooks alone. No thread holds ``_OPENING`` before they are registered, so a
    fork meanwhile leaves nothing held in the child."""
    global _hooked
    if not _hooked:
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)
        _hooked = True


@contextmanager
def _lock_file(path: Path, inherit: bool) -> Iterator[int]:
    """An open descriptor of ``path`` (created if missing), closed at the end of the block; with
    ``inherit=False`` it is also closed in a child forked meanwhile."""
    _hook_fork()
    with _OPENING:
        with descriptor_limit(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not inherit:
            _PRIVATE.add(fd)
    try:
        yield fd
    finally:
        if inherit:
            os.close(fd)
        else:
            with _OPENING:  # no fork between the unlock and forgetting the descriptor
                if fd in _PRIVATE:  # in a forked child the descriptor is already closed
                    fcntl.flock(fd, fcntl.LOCK_UN)  # released for any copy a child still holds
                    _PRIVATE.discard(fd)
                    os.close(fd)


@contextmanager
def exclusive(path: Path, timeout: float | None = None, inherit: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block.

    Waits for another holder; with ``timeout`` gives up after that many seconds with TimeoutError.
    With ``inherit`` (default) a forked child shares the lock, which is released when the last
    process holding it is gone; with ``inherit=False`` a forked child does not hold it.
    """
    with _lock_file(path, inherit) as fd:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while not _try(fd, fcntl.LOCK_EX):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}: held by another process for over {timeout:g} s")
                time.sleep(0.1)
        yield


def is_locked(path: Path) -> bool:
    """Whether some process holds the exclusive lock on ``path`` right now."""
    with _lock_file(path, inherit=False) as fd:
        return not _try(fd, fcntl.LOCK_SH)


class ProcessLock:
    """A threading lock of each process's own (``with lock:``): a forked child gets a new one,
    never its copy of the parent's, which a parent thread may have held at the fork and no
    thread of the child would release. ``dict.setdefault`` is atomic under the GIL, so the
    child's first threads agree on one."""

    def __init__(self) -> None:
        self._locks: dict[int, threading.Lock] = {}

    def __enter__(self) -> None:
        self._locks.setdefault(os.getpid(), threading.Lock()).acquire()

    def __exit__(self, *exc: object) -> None:
        self._locks[os.getpid()].release()


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
