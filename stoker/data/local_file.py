"""LocalFile: a shard's bytes from a file on this machine, read with ``os.pread`` through one
descriptor that threads share and native code is handed (see :mod:`stoker.data.readers`)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from stoker.data.readers import MemberRead, ReadBuffer, RecentBlocks
from stoker.errors import CorruptDataError
from stoker.storage import willneed
from stoker.storage.files import open_readonly


class LocalFile:
    """The shard file at ``path``, opened on the first read and read with ``os.pread`` (no shared
    file position), the kernel asked for a whole block of ``block_bytes`` on the second read
    inside it (:class:`RecentBlocks`).

    Each read holds the descriptor: :meth:`close` closes it once the reads in flight end. Dropped
    unclosed, it closes its file when collected (in the process that opened it only: a forked
    child never closes a descriptor number it inherited, which may by then name another of its
    own files). A node-cache copy is read the same way through a descriptor opened and checked
    elsewhere (:meth:`adopt`; :class:`stoker.data.node_copy.NodeCopy`).
    """

    def __init__(self, path: str, block_bytes: int) -> None:
        self.path = path
        self.recent = RecentBlocks(block_bytes)
        self._fd: int | None = None
        self._length = 0
        self._users = 0
        self._closing = False
        self._lock = threading.Lock()
        self._closer: weakref.finalize | None = None

    def read(self, wanted: MemberRead, into: ReadBuffer | None, alone: bool = False) -> bytes | memoryview:
        """The bytes ``wanted`` asks for, checked (see :meth:`read_held`; a disk reads no more for ``alone``)."""
        fd = self._open_held()
        try:
            return self.read_held(fd, wanted, into)
        finally:
            self.release()

    def readahead(self, first: int, last: int, start: int, end: int, reads: np.ndarray) -> None:
        """Ask the kernel to start reading bytes ``start:end`` into the page cache (the page cache
        is shared: which of its samples this reader reads does not matter)."""
        fd = self._open_held()
        try:
            willneed(fd, start, end - start)
        finally:
            self.release()

    def cancel_readahead(self, first: int, last: int, start: int) -> None:
        """Nothing: a kernel hint cannot be taken back."""

    @contextmanager
    def pinned_file(self) -> Iterator[int | None]:
        """The file's descriptor, held while the block runs."""
        fd = self._open_held()
        try:
            yield fd
        finally:
            self.release()

    def release_evicted(self) -> None:
        """Nothing: a data set's own file is never evicted."""

    def close(self) -> None:
        """Close the file now, or as soon as the reads in flight end."""
        with self._lock:
            self._closing = True
            if self._users == 0:
                self._close_fd()

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copy of the descriptor, taking no lock."""
        self._close_fd()

    @property
    def is_open(self) -> bool:
        """Whether a descriptor is open (held or not)."""
        return self._fd is not None

    def read_held(self, fd: int, wanted: MemberRead, into: ReadBuffer | None) -> bytes | memoryview:
        """The bytes ``wanted`` asks for from ``fd`` (this file's descriptor, held by the caller),
        into ``into`` when they fit, checked; CorruptDataError naming the sample for bytes past the
        file's end, a failed read or a failed check."""
        offset, size = wanted.offset, wanted.size
        if offset + size > self._length:
            raise wanted.damaged(self.path, f"shard truncated: member needs bytes {offset}-{offset + size}, "
                                            f"file has {self._length}")
        block_bytes = self.recent.block_bytes
        if self.recent.touch(offset // block_bytes) is False:  # the second read inside this block
            willneed(fd, offset // block_bytes * block_bytes, block_bytes)
        try:
            if into is not None and len(into) >= size:
                view = memoryview(into)[:size]
                data: bytes | memoryview = view[: os.preadv(fd, [view], offset)]
            else:
                data = os.pread(fd, size, offset)
        except OSError as e:
            raise wanted.damaged(self.path, f"read failed: {e.strerror or e}") from None
        return wanted.checked(data, self.path)

    def hold(self) -> int | None:
        """The open descriptor, held until :meth:`release`; None when none is open."""
        with self._lock:
            if self._fd is None:
                return None
            self._users += 1
            return self._fd

    def hold_linked(self) -> int | None:
        """As :meth:`hold`, for a file that may be unlinked (a node-cache copy evicted): one that
        is no longer in its folder is closed (after the reads in flight) and None returned."""
        with self._lock:
            if self._fd is not None and not self._closing:
                try:
                    linked = os.fstat(self._fd).st_nlink > 0
                except OSError:
                    linked = False
                if linked:
                    self._users += 1
                    return self._fd
                self._closing = True
                if self._users == 0:
                    self._close_fd()
            return None

    def adopt(self, fd: int) -> int:
        """Read through ``fd`` (opened, and checked, by the caller) from now on, and hold it until
        :meth:`release`; when another thread adopted one meanwhile, ``fd`` is closed and that one held."""
        with self._lock:
            if self._fd is None:
                self._fd, self._length, self._closing = fd, os.fstat(fd).st_size, False
                self._closer = weakref.finalize(self, _close_in, os.getpid(), fd)
                self._closer.atexit = False
            else:
                os.close(fd)
            self._users += 1
            return self._fd

    def release(self) -> None:
        """End a hold of :meth:`hold`, :meth:`hold_linked`, :meth:`adopt` or :meth:`read`."""
        with self._lock:
            self._users -= 1
            if self._closing and self._users == 0:
                self._close_fd()

    def _open_held(self) -> int:
        """The descriptor, opened by path on first use, held until :meth:`release`."""
        fd = self.hold()
        if fd is not None:
            return fd
        try:
            opened = open_readonly(self.path)
        except OSError as e:
            raise CorruptDataError(self.path, None, f"cannot open shard: {e.strerror or e}") from None
        return self.adopt(opened)

    def _close_fd(self) -> None:
        if self._fd is not None:
            assert self._closer is not None
            self._closer.detach()
            os.close(self._fd)
            self._fd = self._closer = None


def _close_in(pid: int, fd: int) -> None:
    """Close ``fd`` of a file collected unclosed, in the process that opened it only."""
    if os.getpid() == pid:
        os.close(fd)
