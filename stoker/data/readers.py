"""A shard reader: one shard's index plus a byte source, the place its bytes come from.

    ShardReader(index, LocalFile(path))                         a file on this machine, read with pread
    ShardReader(index, RemoteRanges(origin, entry))             an object at a URL, read by range
    ShardReader(index, NodeCopy(cache, shard, LocalFile | RemoteRanges))
                                                                the node cache's copy once it is there,
                                                                the source behind it until then

The reader says what to read and checks it against the index (size, xxh3-64); the source says
how bytes arrive, how to read ahead, and how to get them again when a check fails (a second
request, the source behind a damaged copy). A source whose bytes are in a local file (a shard on
disk, a node-cache copy that is there) pins its descriptor for native code (:meth:`pinned_file`).
Each source opens lazily and is thread-safe; a ShardSet keeps one reader per open shard per process.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, overload

import numpy as np

from stoker.errors import CorruptDataError, FormatError
from stoker.format import ShardEntry, ShardIndex, file_checksum, member_checksum
from stoker.storage.files import raise_if_out_of_files

# A buffer a caller reuses to read members into (the Loader's are anonymous maps, see decode/scratch.py).
ReadBuffer = bytearray | mmap.mmap

_RECENT_BLOCKS = 64


class MemberRead:
    """One read a reader asks of its byte source: bytes ``offset:offset + size`` of the shard, for
    sample ``local`` of ``index``; the member of field number ``field`` with its ``checksum``
    (None: only the length is checked, as for a run of several members or a data set read with
    ``verify=False``)."""

    __slots__ = ("checksum", "field", "index", "local", "offset", "size")

    def __init__(self, index: ShardIndex, local: int, offset: int, size: int, checksum: int | None = None,
                 field: int = -1) -> None:
        self.index, self.local, self.offset, self.size, self.checksum, self.field = (index, local, offset, size,
                                                                                      checksum, field)

    def damaged(self, path: str, reason: str) -> CorruptDataError:
        """The error of this read's sample found damaged in ``path`` for ``reason``."""
        return CorruptDataError(path, self.index.key(self.local), reason)

    def checked(self, data: bytes | memoryview, path: str) -> bytes | memoryview:
        """``data``, read from ``path``, once it has the length and checksum asked for."""
        if len(data) != self.size:
            raise self.damaged(path, f"short read: {len(data)} of {self.size} bytes")
        if self.checksum is not None and member_checksum(data) != self.checksum:
            raise self.damaged(path, f"checksum mismatch in member '{self.index.fields[self.field]}'")
        return data


class ByteSource(Protocol):
    """Where one shard's bytes come from (see the module docstring)."""

    path: str  # what errors name: the file, the object's URL, or the node-cache copy

    def read(self, wanted: MemberRead, into: ReadBuffer | None, alone: bool = False) -> bytes | memoryview:
        """The bytes ``wanted`` asks for, checked by it (into ``into`` when they fit, a view of it
        returned); read again where the source can before a failed check raises CorruptDataError.
        ``alone``: read just these bytes, nothing around them (an object store's block, say)."""
        ...

    def readahead(self, first: int, last: int, start: int, end: int, reads: np.ndarray) -> None:
        """Start fetching samples ``first..last`` (bytes ``start:end``) before they are read;
        ``reads``: those of them this process's order reads (a rank reads its part of a block), so
        that a source holding the bytes in memory lets them go once those are read."""
        ...

    def cancel_readahead(self, first: int, last: int, start: int) -> None:
        """Take back :meth:`readahead` of samples ``first..last`` (from byte ``start``) where it can be."""
        ...

    def pinned_file(self) -> AbstractContextManager[int | None]:
        """A descriptor of a local file holding the shard, open while the block runs (None where
        the bytes are not in one): native code reads through it without the GIL."""
        ...

    def release_evicted(self) -> None:
        """Close a node-cache copy that was evicted while open, so its space is freed."""
        ...

    def close(self) -> None:
        """Close what is open now, or as soon as the reads in flight end."""
        ...

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptors and threads, taking no lock."""
        ...


class ShardReader:
    """One shard: its ``index`` (memory-mapped, checked) and its bytes from ``source``; members
    checked against the index's checksums when ``verify``. Thread-safe."""

    def __init__(self, index: ShardIndex, source: ByteSource, verify: bool) -> None:
        self.index = index
        self.source = source
        self.verify = verify

    @property
    def path(self) -> str:
        """What errors name: the shard file, the object's URL, or the node-cache copy."""
        return self.source.path

    @overload
    def read_member(self, local: int, member: np.void, into: None = None) -> bytes: ...
    @overload
    def read_member(self, local: int, member: np.void, into: ReadBuffer | None) -> bytes | memoryview: ...

    def read_member(self, local: int, member: np.void, into: ReadBuffer | None = None) -> bytes | memoryview:
        """The bytes of one member of sample ``local``, checked against the index checksum.

        With ``into`` (a buffer the caller reuses) the member is read into it and a view of it is
        returned, when it fits. Measured here, ``os.pread`` of a new 78 KB ``bytes`` costs ~47 us of
        CPU (fresh heap pages fault on every call); reading into a reused buffer ~6 us."""
        wanted = MemberRead(self.index, local, int(member["offset"]), int(member["size"]),
                            int(member["checksum"]) if self.verify else None, int(member["field"]))
        return self.source.read(wanted, into)

    def read_span(self, local: int, start: int, end: int) -> bytes | memoryview:
        """Bytes ``start:end`` of the shard (several adjacent members of sample ``local`` in one
        read); the caller checks each member against its checksum."""
        return self.source.read(MemberRead(self.index, local, start, end - start), None)

    def readahead(self, first: int, last: int, reads: np.ndarray) -> None:
        """Start fetching samples ``first..last`` (positions in this shard) before they are read;
        ``reads``: those of them the caller's order reads."""
        start, end = self.index.span(first, last)
        self.source.readahead(first, last, start, end, reads)

    def cancel_readahead(self, first: int, last: int) -> None:
        """Take back :meth:`readahead` of samples ``first..last`` where it can be (a kernel hint cannot)."""
        start, _ = self.index.span(first, last)
        self.source.cancel_readahead(first, last, start)

    def pinned_file(self) -> AbstractContextManager[int | None]:
        """The descriptor of a local file holding the shard, kept open while the block runs (a
        reader closed or a copy evicted meanwhile is closed after), or None where its bytes are
        not in one (read by range, or not in the node cache yet)."""
        return self.source.pinned_file()

    def release_evicted(self) -> None:
        """Close a node-cache copy evicted while open (after the reads in flight), freeing its space."""
        self.source.release_evicted()

    def close(self) -> None:
        """Close the shard's files now, or as soon as the reads in flight end."""
        self.source.close()

    def forget_after_fork(self) -> None:
        """In a forked child: forget this process's copy of the parent's descriptors and threads."""
        self.source.forget_after_fork()


class RecentBlocks:
    """The blocks of ``block_bytes`` a shard was read in lately (the last 64), for sources that
    read a whole block on the second read inside it: that helps any block-local order
    (sequential, a shuffled pack read in order), and costs nothing under a fully random order,
    where a block is rarely touched twice in a row. Thread-safe."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self._seen: OrderedDict[int, bool] = OrderedDict()
        self._lock = threading.Lock()

    def touch(self, block: int) -> bool | None:
        """Record a read inside ``block`` and return what the history said before it: None (not
        read lately), False (read once), True (twice or more)."""
        with self._lock:
            before = self._seen.get(block)
            self._seen[block] = before is not None
            self._seen.move_to_end(block)
            if len(self._seen) > _RECENT_BLOCKS:
                self._seen.popitem(last=False)
            return before


def open_index(root: Path, entry: ShardEntry, verify: bool, fetched_from: str | None = None) -> ShardIndex:
    """The index of shard ``entry`` in folder ``root``, checked against the manifest; damage is
    named at ``fetched_from`` (the index's URL) when the folder holds what a URL gave."""
    try:
        return _checked_index(root, entry, verify)
    except CorruptDataError as e:
        if fetched_from is None:
            raise
        raise CorruptDataError(fetched_from, None, f"{e.reason} (fetched into {e.shard})") from None


def _checked_index(root: Path, entry: ShardEntry, verify: bool) -> ShardIndex:
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
