"""NodeCopy: a shard's bytes from its copy in the node cache once it is there, from the source
behind it (a local file or ranged remote reads) until then (see :mod:`stoker.data.readers`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from stoker.data.local_file import LocalFile
from stoker.data.readers import ByteSource, MemberRead, ReadBuffer
from stoker.errors import CorruptDataError
from stoker.storage.cache import ShardCache

# A reader that found no room in the node cache reads from the source this long before it asks again.
_CACHE_RETRY_SECONDS = 1.0


class NodeCopy:
    """Shard number ``shard`` through the node ``cache``: read from its copy (a :class:`LocalFile`
    whose descriptor :meth:`ShardCache.open_copy` opened and checked) once it is there, from
    ``source`` until then.

    A read of a shard that is not cached fetches it whole into the cache first (waiting while
    another process fetches it) when a stager of the node will read it, or none lives (another
    node's shard, read for a few samples at an epoch's end, is read from ``source``), when there
    is room evicting only shards a stager marked consumed: so a random order fills the cache
    during the first epoch, and a reader that overtook the stager reads whole shards, not single
    samples. With no room it reads from the
    source, and asks again a second later. A copy is opened, then checked, and read only through
    that descriptor, held for the length of each read, or of a native block (:meth:`pinned_file`:
    a copy that is there, never fetched for it): a copy evicted, or evicted and fetched again,
    between the check and the read is still the copy read, so it can never vanish under a reader
    nor be blamed on the source. A copy evicted while open keeps its space until it is closed:
    the next read of it notices (its link count is 0), and the ShardSet sweeps every open copy
    once a second (:meth:`release_evicted`). A member that fails its check in the copy is judged
    on that descriptor's whole content: a copy that matches the manifest means the source holds
    the same damage (raised); one that does not is removed and the member read from the source.
    An object damaged at the source (see :meth:`ShardCache.damage`) makes every read of the shard
    raise CorruptDataError naming the object's URL, the sample and what is wrong, so ``on_error``
    decides; the cache is asked again a second later.
    """

    def __init__(self, cache: ShardCache, shard: int, source: ByteSource, block_bytes: int) -> None:
        self.cache = cache
        self.shard = shard
        self.source = source
        self.copy = LocalFile(str(cache.path(shard)), block_bytes)
        self.path = self.copy.path
        self._retry_at = 0.0
        self._damage: CorruptDataError | None = None
        self._elsewhere = False  # no stager of the node reads this shard (another node's): not fetched whole

    def read(self, wanted: MemberRead, into: ReadBuffer | None, alone: bool = False) -> bytes | memoryview:
        """The bytes ``wanted`` asks for, from the copy (fetched first when there is room), else
        from the source (just the member's bytes for another node's shard); a copy found damaged is
        dropped and the bytes read from the source."""
        fd = self._pin(wanted)
        if fd is None:
            return self.source.read(wanted, into, alone or self._elsewhere)
        try:
            return self.copy.read_held(fd, wanted, into)
        except CorruptDataError:
            if self.cache.intact(self.shard, fd, recheck=True):
                raise  # the very copy read matches the manifest: the source holds the same damage
            self.copy.close()  # damaged on this node's disk (and removed): fetched again later
        finally:
            self.copy.release()
        return self.source.read(wanted, into)

    def readahead(self, first: int, last: int, start: int, end: int, reads: np.ndarray) -> None:
        """Read ahead from the source while the shard is not cached (a cached copy is in RAM or on SSD)."""
        if not self.copy.is_open:
            self.source.readahead(first, last, start, end, reads)

    def cancel_readahead(self, first: int, last: int, start: int) -> None:
        """Take back the source's read-ahead of samples ``first..last``."""
        self.source.cancel_readahead(first, last, start)

    @contextmanager
    def pinned_file(self) -> Iterator[int | None]:
        """The descriptor of a checked copy that is in the cache now, held while the block runs
        (an eviction meanwhile unlinks it; the block still reads the copy it checked); None when
        there is none (the samples are then read the usual way, which fetches the shard)."""
        fd = self._pin(None)
        try:
            yield fd
        finally:
            if fd is not None:
                self.copy.release()

    def release_evicted(self) -> None:
        """Close the copy if it was evicted (or replaced) while open, after the reads in flight."""
        fd = self.copy.hold_linked()
        if fd is not None:
            self.copy.release()

    def close(self) -> None:
        """Close the copy and the source."""
        self.copy.close()
        self.source.close()

    def forget_after_fork(self) -> None:
        """In a forked child: forget this process's descriptors of both."""
        self.copy.forget_after_fork()
        self.source.forget_after_fork()

    def _pin(self, wanted: MemberRead | None) -> int | None:
        """The descriptor of a checked copy of the shard, held until ``self.copy.release()`` (so no
        close in another thread ends it under the read); None: read the source this time. For a
        read (``wanted``), a shard not cached is fetched first (:meth:`_fetched`); for a native
        block (None) only a copy that is there is pinned, and nothing is fetched or raised."""
        fd = self.copy.hold_linked()
        if fd is not None:
            return fd
        if time.monotonic() < self._retry_at:
            if self._damage is not None and wanted is not None:
                raise wanted.damaged(self._damage.shard, self._damage.reason)
            return None
        fd = self.cache.open_copy(self.shard) if wanted is None else self._fetched(wanted)
        if fd is None:
            return None
        fd = self.copy.adopt(fd)
        self.cache.touch(self.shard)
        return fd

    def _fetched(self, wanted: MemberRead) -> int | None:
        """A descriptor of a checked copy, the shard fetched first when it is not cached; None when
        there is no room (asked again a second later). An object damaged at the source raises its
        CorruptDataError as ``wanted``'s, and again at once for every read in the next second."""
        try:
            fd = self.cache.open_copy(self.shard)
            self._elsewhere = fd is None and not self.cache.wanted_whole(self.shard)
            if self._elsewhere:
                self._retry_at = time.monotonic() + _CACHE_RETRY_SECONDS  # another node's: read in place
                return None
            if fd is None and self.cache.fetch(self.shard):  # a RemoteError propagates
                fd = self.cache.open_copy(self.shard)  # None when evicted again meanwhile
        except CorruptDataError as e:
            self._damage, self._retry_at = e, time.monotonic() + _CACHE_RETRY_SECONDS
            raise wanted.damaged(e.shard, e.reason) from None
        self._damage = None
        if fd is None:
            self._retry_at = time.monotonic() + _CACHE_RETRY_SECONDS
        return fd
