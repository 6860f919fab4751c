"""Shard readers: one shard's index and bytes, read with ``pread`` from a local file, or from the
node cache once a copy is there (a shard at an fsspec URL: :mod:`stoker.data.remote_reader`).

Each reader opens its file lazily and is thread-safe; a ShardSet keeps one per open shard per
process.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import overload

import numpy as np

from stoker.errors import CorruptDataError, FormatError
from stoker.format import ShardEntry, ShardIndex, file_checksum, member_checksum
from stoker.storage import willneed
from stoker.storage.cache import ShardCache
from stoker.storage.files import open_readonly, raise_if_out_of_files

# A buffer a caller reuses to read members into (the Loader's are anonymous maps, see loader/buffers.py).
ReadBuffer = bytearray | mmap.mmap

_RECENT_BLOCKS = 64
# A reader that found no room in the node cache reads from the source this long before it asks again.
_CACHE_RETRY_SECONDS = 1.0


class ShardReader:
    """One shard: its index (memory-mapped) and a file descriptor, opened on the first read and
    read with ``os.pread`` (thread-safe, no shared file position). Thread-safe: :meth:`close`
    waits for reads in flight. A reader dropped without :meth:`close` closes its file when it is
    collected (in the process that opened it only: a forked child never closes a descriptor
    number it inherited, which may by then name another of its own files)."""

    def __init__(self, root: Path, entry: ShardEntry, verify: bool, block_bytes: int,
                 index: ShardIndex | None = None) -> None:
        """The shard ``entry`` in folder ``root``; ``index``: its index, already opened and checked
        (for a second reader of the same shard), else read from ``root``."""
        self.path = str(root / entry.name)
        self.entry = entry
        self.verify = verify
        self.block_bytes = block_bytes
        self.index = index if index is not None else _open_index(root, entry, verify)
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None
        self._size = 0
        self._users = 0
        self._closing = False
        self._lock = threading.Lock()
        self._seen: OrderedDict[int, bool] = OrderedDict()

    @overload
    def read_member(self, local: int, member: np.void, into: None = None) -> bytes: ...
    @overload
    def read_member(self, local: int, member: np.void, into: ReadBuffer | None) -> bytes | memoryview: ...

    def read_member(self, local: int, member: np.void, into: ReadBuffer | None = None) -> bytes | memoryview:
        """The bytes of one member of sample ``local``, checked against the index checksum.

        With ``into`` (a buffer the caller reuses) the member is read into it and a view of it is
        returned, when it fits. Measured here, ``os.pread`` of a new 78 KB ``bytes`` costs ~47 us of
        CPU (fresh heap pages fault on every call); reading into a reused buffer ~6 us."""
        return self._checked(local, member, self._read(local, int(member["offset"]), int(member["size"]), into))

    def _checked(self, local: int, member: np.void, data: bytes | memoryview) -> bytes | memoryview:
        """``data``, read for ``member`` of sample ``local``, once it has the member's size and checksum."""
        size = int(member["size"])
        if len(data) != size:
            raise CorruptDataError(self.path, self.index.key(local), f"short read: {len(data)} of {size} bytes")
        if self.verify and member_checksum(data) != int(member["checksum"]):
            field = self.index.fields[int(member["field"])]
            raise CorruptDataError(self.path, self.index.key(local), f"checksum mismatch in member '{field}'")
        return data

    def _read(self, local: int, offset: int, size: int, into: ReadBuffer | None) -> bytes | memoryview:
        """``size`` bytes at ``offset`` of the shard file, into ``into`` when it fits."""
        fd = self._acquire()
        try:
            return self._pread(fd, local, offset, size, into)
        finally:
            self._release()

    def _pread(self, fd: int, local: int, offset: int, size: int, into: ReadBuffer | None) -> bytes | memoryview:
        """``size`` bytes at ``offset`` of the open file ``fd`` (held by the caller), for sample ``local``."""
        if offset + size > self._size:
            raise CorruptDataError(self.path, self.index.key(local),
                                   f"shard truncated: member needs bytes {offset}-{offset + size}, "
                                   f"file has {self._size}")
        self._readahead(fd, offset)
        try:
            if into is not None and len(into) >= size:
                data = memoryview(into)[:size]
                return data[: os.preadv(fd, [data], offset)]
            return os.pread(fd, size, offset)
        except OSError as e:
            raise CorruptDataError(self.path, self.index.key(local), f"read failed: {e.strerror or e}") from None

    @contextmanager
    def open_file(self) -> Iterator[int]:
        """The shard file's descriptor, kept open while the block runs (a reader closed meanwhile
        closes it after): native code reads members through it without the GIL."""
        fd = self._acquire()
        try:
            yield fd
        finally:
            self._release()

    def read_span(self, local: int, start: int, end: int) -> bytes | memoryview:
        """Bytes ``start:end`` of the shard (several adjacent members of sample ``local`` in one
        read); the caller checks each member against its checksum."""
        return self._whole_span(local, start, end, self._read(local, start, end - start, None))

    def _whole_span(self, local: int, start: int, end: int, data: bytes | memoryview) -> bytes | memoryview:
        """``data``, read for bytes ``start:end``, once it has all of them."""
        if len(data) != end - start:
            raise CorruptDataError(self.path, self.index.key(local), f"short read: {len(data)} of {end - start} bytes")
        return data

    def readahead(self, first: int, last: int) -> None:
        """Ask the kernel to start reading samples ``first..last`` (positions in this shard) into the page cache."""
        start, end = self.index.span(first, last)
        fd = self._acquire()
        try:
            willneed(fd, start, end - start)
        finally:
            self._release()

    def cancel_readahead(self, first: int, last: int) -> None:
        """Take back :meth:`readahead` of samples ``first..last`` where it can be (a kernel hint cannot)."""

    def close(self) -> None:
        """Close the shard file now, or as soon as the reads in flight end."""
        with self._lock:
            self._closing = True
            if self._users == 0:
                self._close_fd()

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copy of the descriptor, taking no lock."""
        self._close_fd()

    def _acquire(self) -> int:
        with self._lock:
            fd = self._fd
            if fd is None:
                try:
                    fd = open_readonly(self.path)
                except OSError as e:
                    raise CorruptDataError(self.path, None, f"cannot open shard: {e.strerror or e}") from None
                self._adopt(fd)
            self._users += 1
            return fd

    def _adopt(self, fd: int) -> None:
        """Read through ``fd`` from now on, and close it when this reader is collected unclosed (caller holds the lock)."""
        self._fd, self._size, self._closing = fd, os.fstat(fd).st_size, False
        self._closer = weakref.finalize(self, _close_in, os.getpid(), fd)
        self._closer.atexit = False

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closing and self._users == 0:
                self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            assert self._closer is not None
            self._closer.detach()
            os.close(self._fd)
            self._fd = self._closer = None

    def _readahead(self, fd: int, offset: int) -> None:
        """On the second read inside a block, ask the kernel to read the whole block in one go.

        This helps any block-local order (sequential, a shuffled pack read in order), and costs
        nothing under a fully random order, where a block is rarely touched twice in a row.
        """
        block = offset // self.block_bytes
        with self._lock:
            before = self._touch(block)
        if before is False:
            willneed(fd, block * self.block_bytes, self.block_bytes)

    def _touch(self, block: int) -> bool | None:
        """Record a read inside ``block`` (caller holds the lock) and return what the recent
        history said before it: None (not read lately), False (read once), True (twice or more)."""
        before = self._seen.get(block)
        self._seen[block] = before is not None
        self._seen.move_to_end(block)
        if len(self._seen) > _RECENT_BLOCKS:
            self._seen.popitem(last=False)
        return before


class CachedShardReader(ShardReader):
    """A shard with a node cache (:class:`ShardCache`): read from the cached copy once it is
    there, from ``source`` (a local or remote reader of the same shard) until then.

    A read of a shard that is not cached fetches it whole into the cache first (waiting while
    another process fetches it), when there is room evicting only shards a stager marked
    consumed: so a random order fills the cache during the first epoch, and a reader that
    overtook the stager reads whole shards, not single samples. With no room it reads from the
    source, and asks again a second later. A copy is opened, then checked, and read only through
    that descriptor, held for the length of each read (:meth:`ShardCache.open_copy`): a copy
    evicted, or evicted and fetched again, between the check and the read is still the copy
    read, so it can never vanish under a reader nor be blamed on the source. A copy evicted while
    open keeps its space until it is closed: the next read of it notices (its link count is 0),
    and the ShardSet sweeps every open copy once a second. An object damaged at the source (see
    :meth:`ShardCache.damage`) makes every read of the shard raise CorruptDataError naming the
    object's URL, the sample and what is wrong, so ``on_error`` decides; the cache is asked again
    a second later.
    """

    def __init__(self, source: ShardReader, cache: ShardCache, shard: int) -> None:
        super().__init__(cache.folder, source.entry, source.verify, source.block_bytes, index=source.index)
        self.source = source
        self.cache = cache
        self.shard = shard
        self._retry_at = 0.0
        self._damage: CorruptDataError | None = None

    @overload
    def read_member(self, local: int, member: np.void, into: None = None) -> bytes: ...
    @overload
    def read_member(self, local: int, member: np.void, into: ReadBuffer | None) -> bytes | memoryview: ...

    def read_member(self, local: int, member: np.void, into: ReadBuffer | None = None) -> bytes | memoryview:
        """As :meth:`ShardReader.read_member`; a cached copy found damaged is dropped and the member
        read from the source instead."""
        fd = self._pin(local)
        if fd is None:
            return self.source.read_member(local, member, into)
        try:
            return self._checked(local, member, self._pread(fd, local, int(member["offset"]), int(member["size"]), into))
        except CorruptDataError:
            if self.cache.intact(self.shard, fd, recheck=True):
                raise  # the very copy read matches the manifest: the source holds the same damage
            ShardReader.close(self)  # damaged on this node's disk (and removed): fetched again later
        finally:
            self._release()
        return self.source.read_member(local, member, into)

    def read_span(self, local: int, start: int, end: int) -> bytes | memoryview:
        """As :meth:`ShardReader.read_span`, from the cached copy once there is one."""
        fd = self._pin(local)
        if fd is None:
            return self.source.read_span(local, start, end)
        try:
            return self._whole_span(local, start, end, self._pread(fd, local, start, end - start, None))
        finally:
            self._release()

    def readahead(self, first: int, last: int) -> None:
        """Hint the source's page cache while the shard is not cached (a cached copy is in RAM or on SSD)."""
        if self._fd is None:
            self.source.readahead(first, last)

    def cancel_readahead(self, first: int, last: int) -> None:
        """Take back the source's read-ahead of samples ``first..last``."""
        self.source.cancel_readahead(first, last)

    def close(self) -> None:
        """Close the cached copy and the source."""
        super().close()
        self.source.close()

    def forget_after_fork(self) -> None:
        """In a forked child: forget this process's descriptors of both."""
        super().forget_after_fork()
        self.source.forget_after_fork()

    def release_evicted(self) -> bool:
        """Close the cached copy if it was evicted (or replaced) while open, so its space is freed
        (after the reads in flight); True when a copy is open and still in the cache."""
        with self._lock:
            if self._fd is None or self._closing:
                return False
            try:
                if os.fstat(self._fd).st_nlink > 0:
                    return True
            except OSError:
                pass
        ShardReader.close(self)  # the copy only: the source stays open
        return False

    def _pin(self, local: int) -> int | None:
        """The descriptor of a checked copy of the shard, held until :meth:`_release` (so no
        close in another thread ends it under the read), fetching the shard when it is not
        cached; None: read the source this time. CorruptDataError when the shard's object is
        damaged at the source."""
        if self.release_evicted():
            with self._lock:
                open_now = self._fd
                if open_now is not None:
                    self._users += 1
                    return open_now
        if time.monotonic() < self._retry_at:
            if self._damage is not None:
                raise self._damaged(local)
            return None
        try:
            fd = self.cache.open_copy(self.shard)
            if fd is None and self.cache.fetch(self.shard):  # a RemoteError propagates
                fd = self.cache.open_copy(self.shard)  # None when evicted again meanwhile
        except CorruptDataError as e:
            self._damage, self._retry_at = e, time.monotonic() + _CACHE_RETRY_SECONDS
            raise self._damaged(local) from None
        self._damage = None
        if fd is None:
            self._retry_at = time.monotonic() + _CACHE_RETRY_SECONDS
            return None
        with self._lock:
            if self._fd is None:
                self._adopt(fd)
            else:  # another thread opened one meanwhile: read that one
                os.close(fd)
                fd = self._fd
            self._users += 1
        self.cache.touch(self.shard)
        return fd

    def _damaged(self, local: int) -> CorruptDataError:
        """The damage found in this shard's object, as the error of sample ``local``."""
        assert self._damage is not None
        return CorruptDataError(self._damage.shard, self.index.key(local), self._damage.reason)


def _close_in(pid: int, fd: int) -> None:
    """Close ``fd`` of a reader collected unclosed, in the process that opened it only."""
    if os.getpid() == pid:
        os.close(fd)


def _open_index(root: Path, entry: ShardEntry, verify: bool) -> ShardIndex:
    """The index of shard ``entry``, checked against the manifest."""
    index_path = root / entry.index
    # Checked before it is parsed, and read with read(), not through the mapping: the pages
    # stay in the shared page cache instead of counting in every worker's resident memory.
    try:
        matches = not verify or file_checksum(index_path) == entry.index_checksum
    except OSError as e:
        raise_if_out_of_files(e, index_path)
        raise FormatError(f"{index_path}: cannot read the index of {entry.name} that the manifest lists "
                          f"({e.strerror or e})") from None
    if not matches:
        raise CorruptDataError(str(index_path), None, "index checksum does not match the manifest")
    try:
        index = ShardIndex.open(index_path)
    except FormatError as e:  # the OSError of mapping it is the cause
        if isinstance(e.__cause__, OSError):
            raise_if_out_of_files(e.__cause__, index_path)
        raise
    if len(index) != entry.count or index.shard_bytes != entry.bytes:
        raise CorruptDataError(str(index_path), None, f"index describes {len(index)} samples in "
                               f"{index.shard_bytes} bytes, manifest says {entry.count} in {entry.bytes}")
    return index
