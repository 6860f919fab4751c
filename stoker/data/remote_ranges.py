"""RemoteRanges: a shard's bytes from an object at an fsspec URL, read by range, ahead of the
order in parallel ranged GETs when the order says what comes next (see :mod:`stoker.data.readers`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import numpy as np

from stoker.data.readers import MemberRead, ReadBuffer, RecentBlocks
from stoker.errors import CorruptDataError, RemoteError
from stoker.format import ShardEntry
from stoker.storage.remote import RemoteData

# Blocks of a remote shard kept in memory per source (8 MiB each by default).
_REMOTE_BLOCKS = 4


class RemoteRanges:
    """The shard ``entry`` of the data set at ``remote``'s URL, read by range.

    An order that reads ahead (:class:`stoker.data.readahead.BlockReadahead`, hinting each block
    about a window before it is needed) makes :meth:`readahead` queue the block's bytes as ranged
    GETs of :data:`_PART_BYTES` each (``RemoteData.part_bytes`` where the Loader's tuner set it),
    ``RemoteData.parallel`` in flight per process, in the order
    the blocks are needed; a read waits only for the parts its member lies in, and a block is
    dropped once each of its samples that this process's order reads was read (one of several
    ranks reads its part of each block), or after :data:`_REMOTE_SPANS` newer ones: a rank holds
    what it reads ahead, not the epoch's blocks. Without hints, as
    :class:`stoker.data.local_file.LocalFile` does for a disk, a second read inside the same block
    of ``block_bytes`` fetches the whole block in one request (once, whichever threads want it at
    the same moment) and keeps it in memory (the last ``_REMOTE_BLOCKS`` blocks per shard); a
    fully random order makes one request per sample. Bytes that fail their check are read again
    directly (a transport may have mangled them) and raise CorruptDataError only when the object
    gives the same wrong bytes twice. A RemoteError (the store down for longer than the read
    timeout, denied access) propagates as it is: it says nothing about the data, so
    on_error="skip" must never skip past it.
    """

    def __init__(self, remote: RemoteData, entry: ShardEntry, block_bytes: int) -> None:
        self.remote = remote
        self.entry = entry
        self.path = f"{remote.url}/{entry.name}"
        self.recent = RecentBlocks(block_bytes)
        self._lock = threading.Lock()
        self._blocks: OrderedDict[int, Future[bytes]] = OrderedDict()  # done, or being fetched
        self._spans: OrderedDict[int, _Span] = OrderedDict()

    def read(self, wanted: MemberRead, into: ReadBuffer | None, alone: bool = False) -> bytes | memoryview:
        """The bytes ``wanted`` asks for, checked; read once more on their own when they fail.
        ``alone``: one ranged read of the member, never its whole block."""
        try:
            return wanted.checked(_into(self._fetch(wanted, alone), into), self.path)
        except CorruptDataError as first:
            again = self.remote.read_range(self.entry.name, wanted.offset, wanted.offset + wanted.size)
            try:
                return wanted.checked(_into(again, into), self.path)
            except CorruptDataError:
                raise wanted.damaged(self.path, f"{first.reason}, the same on reading it again: "
                                                "damaged at the source") from None

    def _fetch(self, wanted: MemberRead, alone: bool = False) -> bytes:
        """The bytes ``wanted`` asks for: from a block read ahead, a block in memory, or one ranged read."""
        offset, size = wanted.offset, wanted.size
        data = self._from_span(wanted.local, offset, size)
        if data is None and not alone:
            data = self._from_block(offset // self.recent.block_bytes, offset, size)
        if data is None:
            data = self.remote.read_range(self.entry.name, offset, offset + size)
        return data

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
        block_bytes = self.recent.block_bytes
        start = block * block_bytes
        if offset + size > start + block_bytes:
            return None
        with self._lock:
            held = self._blocks.get(block)
            if held is not None:
                self._blocks.move_to_end(block)
        before = self.recent.touch(block)
        if held is None and before is None:
            return None
        if held is None:
            with self._lock:  # marked in flight: a thread that wants it meanwhile waits for this fetch
                held = self._blocks.get(block)
                fetching = held is None
                if held is None:
                    held = self._blocks[block] = Future()
                    while len(self._blocks) > _REMOTE_BLOCKS:
                        self._blocks.popitem(last=False)
            if fetching:
                self._fetch_block(block, held)
        return held.result()[offset - start : offset - start + size]

    def _fetch_block(self, block: int, held: Future[bytes]) -> None:
        """Fetch ``block`` into ``held``; a failure is every waiter's, and the block is asked again next time."""
        start = block * self.recent.block_bytes
        try:
            held.set_result(self.remote.read_range(self.entry.name, start,
                                                   min(start + self.recent.block_bytes, self.entry.bytes)))
        except BaseException as e:
            held.set_exception(e)
            with self._lock:
                if self._blocks.get(block) is held:
                    del self._blocks[block]

    def readahead(self, first: int, last: int, start: int, end: int, reads: np.ndarray) -> None:
        """Queue bytes ``start:end`` (samples ``first..last``) as ranged GETs (see the class), held
        until each sample in ``reads`` (those this process's order reads) was read."""
        with self._lock:
            if start in self._spans or end <= start:
                return
            step = self.remote.part_bytes or _PART_BYTES
            parts = [(a, min(a + step, end)) for a in range(start, end, step)]
            span = _Span(first, last, start, end, reads,
                         [(a, b, self.remote.prefetch(self.entry.name, a, b)) for a, b in parts])
            self._spans[start] = span
            while len(self._spans) > _REMOTE_SPANS:
                self._spans.popitem(last=False)[1].cancel()

    def cancel_readahead(self, first: int, last: int, start: int) -> None:
        """Drop the read-ahead of samples ``first..last`` (its parts not yet begun are never fetched)."""
        with self._lock:
            span = self._spans.get(start)
            if span is not None and span.first == first and span.last == last:
                del self._spans[start]
                span.cancel()

    @contextmanager
    def pinned_file(self) -> Iterator[int | None]:
        """None: the bytes are in no local file."""
        yield None

    def release_evicted(self) -> None:
        """Nothing: no copy is held."""

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
    """Bytes ``start:end`` of a shard (samples ``first..last``, of which ``reads`` are to be read
    here), read ahead as parts (start, end, future)."""

    def __init__(self, first: int, last: int, start: int, end: int, reads: np.ndarray,
                 parts: list[tuple[int, int, Future[bytes]]]) -> None:
        self.first, self.last, self.start, self.end, self.parts = first, last, start, end, parts
        self._unread = set(reads.tolist())

    def read(self, local: int) -> bool:
        """Note a read of sample ``local``; True once every sample to be read here was read."""
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
