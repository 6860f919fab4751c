"""A shard at an fsspec URL (an object store): its index from the local metadata folder, its
members read by range, ahead of the order in parallel ranged GETs when the order says what comes
next (see :class:`RemoteShardReader`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import overload

import numpy as np

from stoker.data.readers import ReadBuffer, ShardReader
from stoker.errors import CorruptDataError, RemoteError
from stoker.format import ShardEntry, member_checksum
from stoker.storage.remote import RemoteData

# Blocks of a remote shard kept in memory per reader (8 MiB each by default).
_REMOTE_BLOCKS = 4


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

    def cancel_readahead(self, first: int, last: int) -> None:
        """Drop the read-ahead of samples ``first..last`` (its parts not yet begun are never fetched)."""
        start, _ = self.index.span(first, last)
        with self._lock:
            span = self._spans.get(start)
            if span is not None and span.first == first and span.last == last:
                del self._spans[start]
                span.cancel()

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
