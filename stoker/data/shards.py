"""A data set as a whole: its manifest, where each sample lives, and one reader per open shard
(see :mod:`stoker.data.readers`: an index plus a byte source, a local file or ranged reads of a
URL, through the node cache when there is one), the storage settings and one origin connection.

Files and indexes open lazily in the process that reads (a DataLoader worker, a Loader thread),
at most ``max_open_shards`` at a time, and pickling carries only the path and options, so a
ShardSet works under fork and spawn alike and with thousands of shards. Reading ahead of an
order (its blocks, kernel hints, staging into the node cache) is :mod:`stoker.data.readahead`'s.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from stoker.data.local_file import LocalFile
from stoker.data.node_copy import NodeCopy
from stoker.data.readers import ByteSource, ShardReader, open_index
from stoker.data.remote_ranges import RemoteRanges
from stoker.format import Manifest, ShardEntry, ShardIndex, read_manifest
from stoker.ranges import BLOCK_BYTES, MAX_OPEN_SHARDS
from stoker.storage.cache import ShardCache
from stoker.storage.locks import ProcessLock
from stoker.storage.metadata import node_metadata
from stoker.storage.node import this_node
from stoker.storage.remote import is_url
from stoker.storage.settings import StorageSettings

log = logging.getLogger("stoker.data")

# Samples are grouped into blocks of this many bytes of a shard (see stoker.data.readahead): orders
# shuffle blocks and ask the kernel to read each block whole, so a spinning disk sees large reads.
DEFAULT_BLOCK_BYTES = 8 << 20
# Each open shard holds two file descriptors (the shard, and the index's memory map).
DEFAULT_MAX_OPEN_SHARDS = 128
# How often a process closes the node-cache copies it holds open that were evicted meanwhile.
_SWEEP_SECONDS = 1.0


# Held while a forked child forgets its parent's readers (a lock of the child's own: see ProcessLock).
_FORGETTING = ProcessLock()


class ShardSet:
    """A data set folder: manifest, global-to-shard lookup and per-process shard readers."""

    def __init__(self, root: str | os.PathLike, verify: bool = True, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS, settings: StorageSettings | None = None,
                 metadata: Path | None = None) -> None:
        """``root``: a folder or an fsspec URL. ``settings``: how its bytes are fetched and kept on
        the node (see :class:`StorageSettings`; default: read in place, no node cache; for a URL
        read by one of several ranks, a node cache chosen by :meth:`StorageSettings.for_node`).
        ``metadata``: for a URL, the local folder its manifest and indexes were already fetched into
        (how a pickled ShardSet reaches a worker process without fetching them and checksumming
        every index again)."""
        BLOCK_BYTES.check(block_bytes)
        MAX_OPEN_SHARDS.check(max_open_shards)
        self._open(root, verify, block_bytes, max_open_shards, (settings or StorageSettings()).for_node(root), metadata)

    def _open(self, root: str | os.PathLike, verify: bool, block_bytes: int, max_open_shards: int,
              settings: StorageSettings, metadata: Path | None) -> None:
        """Open the data set with arguments already checked (by :meth:`__init__`, or in the process
        that pickled it): its one origin connection (``remote``: for a URL, shared by the range
        reads and the node cache), its manifest and its node cache."""
        self.source = root
        self.settings = settings
        self.remote = settings.origin(root) if is_url(root) else None
        self.root = (metadata or node_metadata(self.remote)) if self.remote else Path(root)
        self.verify = verify
        self.block_bytes = block_bytes
        self.max_open_shards = max_open_shards
        self.manifest: Manifest = read_manifest(self.root)
        self.cache = (ShardCache(root, self.manifest.shards, settings, self.remote)
                      if settings.cache_dir is not None else None)
        self.starts = self.manifest.shard_starts()
        self._starts = self.starts.tolist()  # one entry per shard: bisect on a short list beats numpy per call
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return self.manifest.num_samples

    def describe_storage(self) -> str:
        """Where the bytes come from and where they are kept on the node, in words (for explain())."""
        if self.cache is None:
            return f"{self.source}: read in place" + (" by range" if self.remote is not None else "")
        cache = self.cache
        limit = f"{cache.limit / 1e9:.1f} GB " + ("(cache_limit)" if cache.explicit_limit else "(half its free space)")
        why = (f" (chosen: {this_node().ranks} ranks read a URL, so the node fetches each shard once for all of "
               "them; pass cache_dir= to choose the folder)" if self.settings.cache_chosen else "")
        return f"{self.source}: through the node cache in {cache.folder}, within {limit}{why}"

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, position in shard) of global sample ``i``."""
        if not 0 <= i < self.manifest.num_samples:
            raise IndexError(f"sample {i} out of range for a data set of {self.manifest.num_samples}")
        shard = bisect.bisect_right(self._starts, i) - 1
        return shard, i - self._starts[shard]

    def reader(self, shard: int) -> ShardReader:
        """The reader of shard number ``shard``, opened on first use in this process; the least
        recently used reader is closed when more than ``max_open_shards`` are open."""
        self._in_this_process()
        if self.cache is not None and time.monotonic() > self._next_sweep:
            self._release_evicted()
        with self._lock:
            reader = self._readers.get(shard)
            if reader is not None:
                self._readers.move_to_end(shard)
                return reader
        entry = self.manifest.shards[shard]
        fetched_from = f"{self.remote.url}/{entry.index}" if self.remote is not None else None
        reader = ShardReader(open_index(self.root, entry, self.verify, fetched_from), self._byte_source(shard, entry),
                             self.verify)
        with self._lock:
            reader = self._readers.setdefault(shard, reader)
            while len(self._readers) > self.max_open_shards:
                self._readers.popitem(last=False)[1].close()
        return reader

    def _byte_source(self, shard: int, entry: ShardEntry) -> ByteSource:
        """Where shard number ``shard``'s bytes come from: its file, or ranged reads of its object,
        through the node cache when there is one."""
        source: ByteSource = (RemoteRanges(self.remote, entry, self.block_bytes) if self.remote is not None
                              else LocalFile(str(self.root / entry.name), self.block_bytes))
        return NodeCopy(self.cache, shard, source, self.block_bytes) if self.cache is not None else source

    def open_reader(self, shard: int) -> ShardReader | None:
        """The reader of shard number ``shard`` if this process has it open, else None (opening none)."""
        if self._pid != os.getpid():
            return None
        with self._lock:
            return self._readers.get(shard)

    def index(self, shard: int) -> ShardIndex:
        """The index of shard number ``shard``."""
        return self.reader(shard).index

    def read_members(self, i: int) -> dict[str, bytes]:
        """Every member of global sample ``i``, keyed by field name."""
        shard, local = self.locate(i)
        reader = self.reader(shard)
        return {reader.index.fields[int(m["field"])]: reader.read_member(local, m)
                for m in reader.index.sample_members(local)}

    def column(self, name: str) -> np.ndarray:
        """A per-sample column of every index (``label``, ``start``, ...) concatenated, in global order."""
        # Copy each column as it is read: a view would keep its shard's mapping (and the mapping's
        # file descriptor) open past the max_open_shards bound until the concatenation.
        parts = [np.array(self.index(s).samples[name]) for s in range(len(self.manifest.shards))]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def close(self) -> None:
        """Close every open shard of this process now (each reader dropped unclosed closes its
        file when collected); reading again opens them again."""
        self._in_this_process()
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release_evicted(self) -> None:
        """Close this process's copies that were evicted from the node cache, freeing their space."""
        self._next_sweep = time.monotonic() + _SWEEP_SECONDS
        with self._lock:
            readers = list(self._readers.values())
        for reader in readers:
            reader.release_evicted()

    def _in_this_process(self) -> None:
        """In a forked child, forget the parent's readers first (once, whichever thread comes
        first: threads of a worker process, Loader(processes=, threads=))."""
        if self._pid != os.getpid():
            with _FORGETTING:
                if self._pid != os.getpid():
                    self._forget_parent_readers()

    def _forget_parent_readers(self) -> None:
        """In a forked child: open our own files, and never wait on a lock another thread of the parent held."""
        for reader in self._readers.values():
            reader.forget_after_fork()
        self._readers = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"root": self.source, "verify": self.verify, "block_bytes": self.block_bytes,
                "max_open_shards": self.max_open_shards, "settings": self.settings,
                "metadata": self.root if self.remote else None}

    def __setstate__(self, state: dict) -> None:
        self._open(**state)  # checked, and any warning given, where it was made
