"""Shard readers: one shard's index and bytes, read with ``pread`` from a local file, by range
from an fsspec URL, or from the node cache once a copy is there.

Each reader opens its file lazily and is thread-safe; a ShardSet keeps one per open shard per
process.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import overload

import numpy as np

from stoker.errors import CorruptDataError, FormatError, RemoteError
from stoker.format import ShardEntry, ShardIndex, file_checksum, member_checksum
from stoker.storage import willneed
from stoker.storage.cache import ShardCache
from stoker.storage.remote import RemoteData

# A buffer a caller reuses to read members into (the Loader's are anonymous maps, see loader/buffers.py).
ReadBuffer = bytearray | mmap.mmap

_RECENT_BLOCKS = 64
# Blocks of a remote shard kept in memory per reader (8 MiB each by default).
_REMOTE_BLOCKS = 4
# A reader that found no room in the node cache reads from the source this long before it asks again.
_CACHE_RETRY_SECONDS = 1.0


class ShardReader:
    """One shard: its index (memory-mapped) and a file descriptor, opened on the first read and
    read with ``os.pread`` (thread-safe, no shared file position). Thread-safe: :meth:`close`
    waits for reads in flight."""

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
        offset, size = int(member["offset"]), int(member["size"])
        data = self._read(local, offset, size, into)
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
            if offset + size > self._size:
                raise CorruptDataError(self.path, self.index.key(local),
                                       f"shard truncated: member needs bytes {offset}-{offset + size}, "
                                       f"file has {self._size}")
            self._readahead(fd, offset)
            if into is not None and len(into) >= size:
                data = memoryview(into)[:size]
                return data[: os.preadv(fd, [data], offset)]
            return os.pread(fd, size, offset)
        except OSError as e:
            raise CorruptDataError(self.path, self.index.key(local), f"read failed: {e.strerror or e}") from None
        finally:
            self._release()

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
        data = self._read(local, start, end - start, None)
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

    def close(self) -> None:
        """Close the shard file now, or as soon as the reads in flight end."""
        with self._lock:
            self._closing = True
            if self._users == 0:
                self._close_fd()

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copy of the descriptor, taking no lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _acquire(self) -> int:
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDONLY)
                except OSError as e:
                    raise CorruptDataError(self.path, None, f"cannot open shard: {e.strerror or e}") from None
                self._size = os.fstat(self._fd).st_size
                self._closing = False
            self._users += 1
            return self._fd

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._closing and self._users == 0:
                self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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


class RemoteShardReader(ShardReader):
    """A shard at an fsspec URL: the index from the local metadata folder, members read by range.

    An order that reads ahead (:class:`stoker.data.readahead.BlockReadahead`, hinting each block
    about a window before it is needed) makes :meth:`readahead` queue the block's bytes as ranged
    GETs of :data:`_PART_BYTES` each, ``RemoteData.parallel`` in flight per process, in the order
    the blocks are needed; a read waits only for the parts its member lies in, and a block is
    dropped once each of its samples was read (or after :data:`_REMOTE_SPANS` newer ones). Without
    hints, as :meth:`ShardReader._readahead` does for a disk, a second read inside the same block
    fetches the whole block in one request and keeps it in memory (the last ``_REMOTE_BLOCKS``
    blocks per shard reader); a fully random order makes one request per sample. Every member is
    checked against the index's checksum before use; one that does not match is read again
    directly (a transport may have mangled it) and raises CorruptDataError only when the object
    gives the same wrong bytes twice.
    """

    def __init__(self, root: Path, entry: ShardEntry, verify: bool, block_bytes: int, remote: RemoteData) -> None:
        try:
            super().__init__(root, entry, verify, block_bytes)
        except CorruptDataError as e:  # the metadata folder holds what the source gave: name the object
            raise CorruptDataError(f"{remote.url}/{entry.index}", None, f"{e.reason} (fetched into {e.shard})") from None
        self.remote = remote
        self.path = f"{remote.url}/{entry.name}"
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._spans: OrderedDict[int, _Span] = OrderedDict()

    @overload
    def read_member(self, local: int, member: np.void, into: None = None) -> bytes: ...
    @overload
    def read_member(self, local: int, member: np.void, into: ReadBuffer | None) -> bytes | memoryview: ...

    def read_member(self, local: int, member: np.void, into: ReadBuffer | None = None) -> bytes | memoryview:
        """As :meth:`ShardReader.read_member`; a member that fails its check is read once more on its own."""
        try:
            return super().read_member(local, member, into)
        except CorruptDataError as first:
            offset, size = int(member["offset"]), int(member["size"])
            data = self.remote.read_range(self.entry.name, offset, offset + size)
            if not self.verify or member_checksum(data) == int(member["checksum"]):
                return _into(data, into)
            raise CorruptDataError(self.path, self.index.key(local),
                                   f"{first.reason}, the same on reading it again: damaged at the source") from None

    def _read(self, local: int, offset: int, size: int, into: ReadBuffer | None) -> bytes | memoryview:
        # A RemoteError (the store down for longer than the read timeout, denied access) propagates
        # as it is: it says nothing about the data, so on_error="skip" must never skip past it.
        data = self._from_span(local, offset, size)
        if data is None:
            data = self._from_block(offset // self.block_bytes, offset, size)
        if data is None:
            data = self.remote.read_range(self.entry.name, offset, offset + size)
        return _into(data, into)

    def _from_span(self, local: int, offset: int, size: int) -> bytes | None:
        """The member's bytes from a block read ahead, waiting for its parts; None when no block holds it."""
        with self._lock:
            span = next((span for span in self._spans.values() if span.start <= offset and offset + size <= span.end),
                        None)
            if span is not None and span.read(local):
                del self._spans[span.start]
        if span is None:
            return None
        try:
            return span.take(offset, size)
        except RemoteError:  # given up on: a later read asks the store again
            with self._lock:
                if self._spans.get(span.start) is span:
                    del self._spans[span.start]
            raise

    def _from_block(self, block: int, offset: int, size: int) -> bytes | None:
        """The member's bytes from a block in memory, fetching the block on its second touch; None
        on a first touch (read just the member) or when the member crosses the block's end."""
        start = block * self.block_bytes
        if offset + size > start + self.block_bytes:
            return None
        with self._lock:
            data = self._blocks.get(block)
            if data is not None:
                self._blocks.move_to_end(block)
            before = self._touch(block)
        if data is None and before is None:
            return None
        if data is None:
            data = self.remote.read_range(self.entry.name, start, min(start + self.block_bytes, self.entry.bytes))
            with self._lock:
                self._blocks[block] = data
                while len(self._blocks) > _REMOTE_BLOCKS:
                    self._blocks.popitem(last=False)
        return data[offset - start : offset - start + size]

    def readahead(self, first: int, last: int) -> None:
        """Queue the bytes of samples ``first..last`` as ranged GETs (see the class)."""
        start, end = self.index.span(first, last)
        with self._lock:
            if start in self._spans or end <= start:
                return
            parts = [(a, min(a + _PART_BYTES, end)) for a in range(start, end, _PART_BYTES)]
            span = _Span(first, last, start, end,
                         [(a, b, self.remote.prefetch(self.entry.name, a, b)) for a, b in parts])
            self._spans[start] = span
            while len(self._spans) > _REMOTE_SPANS:
                self._spans.popitem(last=False)[1].cancel()

    def close(self) -> None:
        """Drop the blocks held in memory and those read ahead."""
        with self._lock:
            self._blocks.clear()
            for span in self._spans.values():
                span.cancel()
            self._spans.clear()

    def forget_after_fork(self) -> None:
        """Forget the parent's reads ahead (its threads are not here); the file system is made again."""
        self._spans = OrderedDict()
        self._lock = threading.Lock()


# A block read ahead from an object store arrives in ranged GETs of this size, so a read waits for
# the part its member is in, not the whole block, and one part lost to a fault is all that is read again.
_PART_BYTES = 2 << 20
# Blocks read ahead kept per remote shard reader, at most (each dropped once all its samples are read).
_REMOTE_SPANS = 64


class _Span:
    """Bytes ``start:end`` of a shard (samples ``first..last``), read ahead as parts (start, end, future)."""

    def __init__(self, first: int, last: int, start: int, end: int, parts: list[tuple[int, int, Future[bytes]]]) -> None:
        self.first, self.last, self.start, self.end, self.parts = first, last, start, end, parts
        self._unread = set(range(first, last + 1))

    def read(self, local: int) -> bool:
        """Note a read of sample ``local``; True once every sample of the span was read."""
        self._unread.discard(local)
        return not self._unread

    def take(self, offset: int, size: int) -> bytes:
        """Bytes ``offset:offset + size``, waiting for the parts they lie in (a RemoteError of a part raises)."""
        pieces = [future.result()[max(offset, a) - a : min(offset + size, b) - a]
                  for a, b, future in self.parts if a < offset + size and offset < b]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def cancel(self) -> None:
        for _, _, future in self.parts:
            future.cancel()


def _into(data: bytes, into: ReadBuffer | None) -> bytes | memoryview:
    """``data``, copied into ``into`` when it fits (a view of it returned)."""
    if into is not None and len(into) >= len(data):
        into[: len(data)] = data
        return memoryview(into)[: len(data)]
    return data


class CachedShardReader(ShardReader):
    """A shard with a node cache (:class:`ShardCache`): read from the cached copy once it is
    there, from ``source`` (a local or remote reader of the same shard) until then.

    A read of a shard that is not cached fetches it whole into the cache first (waiting while
    another process fetches it), when there is room evicting only shards a stager marked
    consumed: so a random order fills the cache during the first epoch, and a reader that
    overtook the stager reads whole shards, not single samples. With no room it reads from the
    source, and asks again a second later. A copy evicted while open keeps its space until it is
    closed: the next read of it notices (its link count is 0), and the ShardSet sweeps every open
    copy once a second. An object damaged at the source (see :meth:`ShardCache.damage`) makes
    every read of the shard raise CorruptDataError naming the object's URL, the sample and what
    is wrong, so ``on_error`` decides; the cache is asked again a second later.
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
        if not self._cached(local):
            return self.source.read_member(local, member, into)
        try:
            return super().read_member(local, member, into)
        except CorruptDataError:
            if self.cache.ready(self.shard, recheck=True):
                raise  # the copy matches the manifest: the source holds the same damage
            ShardReader.close(self)
            return self.source.read_member(local, member, into)

    def read_span(self, local: int, start: int, end: int) -> bytes | memoryview:
        """As :meth:`ShardReader.read_span`, from the cached copy once there is one."""
        if self._cached(local):
            return super().read_span(local, start, end)
        return self.source.read_span(local, start, end)

    def readahead(self, first: int, last: int) -> None:
        """Hint the source's page cache while the shard is not cached (a cached copy is in RAM or on SSD)."""
        if self._fd is None:
            self.source.readahead(first, last)

    def close(self) -> None:
        """Close the cached copy and the source."""
        super().close()
        self.source.close()

    def forget_after_fork(self) -> None:
        """In a forked child: forget this process's descriptors of both."""
        super().forget_after_fork()
        self.source.forget_after_fork()

    def release_evicted(self) -> bool:
        """Close the cached copy if it was evicted (or replaced) while open, so its space is freed;
        True when a copy is open and still in the cache."""
        fd = self._fd
        if fd is None:
            return False
        try:
            if os.fstat(fd).st_nlink > 0:
                return True
        except OSError:
            pass
        ShardReader.close(self)  # the copy only: the source stays open
        return False

    def _cached(self, local: int) -> bool:
        """Whether reads of sample ``local`` go to the cached copy, fetching it or opening it when
        it is usable; CorruptDataError when the shard's object is damaged at the source."""
        if self.release_evicted():
            return True
        if time.monotonic() < self._retry_at:
            if self._damage is not None:
                raise self._damaged(local)
            return False
        try:
            usable = self.cache.ready(self.shard) or self.cache.fetch(self.shard)  # a RemoteError propagates
        except CorruptDataError as e:
            self._damage, self._retry_at = e, time.monotonic() + _CACHE_RETRY_SECONDS
            raise self._damaged(local) from None
        self._damage = None
        if not usable:
            self._retry_at = time.monotonic() + _CACHE_RETRY_SECONDS
            return False
        try:
            self._acquire()
            self._release()
        except CorruptDataError:  # evicted between the check and the open
            return False
        self.cache.touch(self.shard)
        return True

    def _damaged(self, local: int) -> CorruptDataError:
        """The damage found in this shard's object, as the error of sample ``local``."""
        assert self._damage is not None
        return CorruptDataError(self._damage.shard, self.index.key(local), self._damage.reason)


def _open_index(root: Path, entry: ShardEntry, verify: bool) -> ShardIndex:
    """The index of shard ``entry``, checked against the manifest."""
    index_path = root / entry.index
    # Checked before it is parsed, and read with read(), not through the mapping: the pages
    # stay in the shared page cache instead of counting in every worker's resident memory.
    try:
        matches = not verify or file_checksum(index_path) == entry.index_checksum
    except OSError as e:
        raise FormatError(f"{index_path}: cannot read the index of {entry.name} that the manifest lists "
                          f"({e.strerror or e})") from None
    if not matches:
        raise CorruptDataError(str(index_path), None, "index checksum does not match the manifest")
    index = ShardIndex.open(index_path)
    if len(index) != entry.count or index.shard_bytes != entry.bytes:
        raise CorruptDataError(str(index_path), None, f"index describes {len(index)} samples in "
                               f"{index.shard_bytes} bytes, manifest says {entry.count} in {entry.bytes}")
    return index
