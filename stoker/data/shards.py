"""A data set as a whole: its manifest, where each sample lives, and one reader per open shard
(see :mod:`stoker.data.readers` and :mod:`stoker.data.remote_reader`), optionally through a node cache.

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

from stoker.data.readers import CachedShardReader, ShardReader
from stoker.data.remote_reader import RemoteShardReader
from stoker.format import Manifest, ShardIndex, read_manifest
from stoker.ranges import BLOCK_BYTES, CACHE_AHEAD, MAX_OPEN_SHARDS, READS_IN_FLIGHT
from stoker.storage.cache import ShardCache
from stoker.storage.remote import DEFAULT_PARALLEL, DEFAULT_READ_TIMEOUT, RemoteData, is_url

log = logging.getLogger("stoker.data")

# Samples are grouped into blocks of this many bytes of a shard (see stoker.data.readahead): orders
# shuffle blocks and ask the kernel to read each block whole, so a spinning disk sees large reads.
DEFAULT_BLOCK_BYTES = 8 << 20
# Each open shard holds two file descriptors (the shard, and the index's memory map).
DEFAULT_MAX_OPEN_SHARDS = 128
# How often a process closes the node-cache copies it holds open that were evicted meanwhile.
_SWEEP_SECONDS = 1.0


_process_locks: dict[int, threading.Lock] = {}


def _this_process_lock() -> threading.Lock:
    """A lock of this process's own, made in it (a forked child's copy of a parent's lock may be
    held forever by a thread the child does not have); dict.setdefault is atomic under the GIL."""
    return _process_locks.setdefault(os.getpid(), threading.Lock())


class ShardSet:
    """A data set folder: manifest, global-to-shard lookup and per-process shard readers."""

    def __init__(self, root: str | os.PathLike, verify: bool = True, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS, storage_options: dict | None = None,
                 metadata: Path | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | None = None, cache_ahead: int | None = None,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, reads_in_flight: int = DEFAULT_PARALLEL) -> None:
        """``root``: a folder or an fsspec URL. ``metadata``: for a URL, the local folder its
        manifest and indexes were already fetched into (how a pickled ShardSet reaches a worker
        process without fetching them and checksumming every index again). ``cache_dir`` and
        ``cache_limit``: a node cache of whole shards (see :class:`ShardCache`), staged up to
        ``cache_ahead`` shards ahead of a reader (default: as far as the limit allows).
        ``read_timeout``: for a URL, how long one ranged read keeps retrying (an outage shorter
        than that is ridden out) before a RemoteError names the object, range and attempts.
        ``reads_in_flight``: ranged reads from the URL (or cache downloads) at once per process."""
        BLOCK_BYTES.check(block_bytes)
        MAX_OPEN_SHARDS.check(max_open_shards)
        if cache_ahead is not None:
            CACHE_AHEAD.check(cache_ahead)
        READS_IN_FLIGHT.check(reads_in_flight)
        self.source = root
        self.storage_options = storage_options
        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be a positive number of seconds, got {read_timeout!r}")
        self.read_timeout = read_timeout
        self.reads_in_flight = reads_in_flight
        self.remote = (RemoteData(root, storage_options, read_timeout=read_timeout, parallel=reads_in_flight)
                       if is_url(root) else None)
        self.root = (metadata or self.remote.metadata()) if self.remote else Path(root)
        self.verify = verify
        self.block_bytes = block_bytes
        self.max_open_shards = max_open_shards
        self.manifest: Manifest = read_manifest(self.root)
        self.cache = (ShardCache(cache_dir, root, self.manifest.shards, cache_limit, storage_options, read_timeout,
                                 reads_in_flight) if cache_dir is not None else None)
        self.cache_ahead = cache_ahead
        if self.cache is not None and not self.cache.explicit_limit and not self.cache.holds_everything:
            log.warning("%s: the node cache in %s has room for %.1f GB of this %.1f GB data set (half its free "
                        "space); pass cache_limit= to shuffle and stage whole shards within it", root, cache_dir,
                        self.cache.limit / 1e9, sum(e.bytes for e in self.manifest.shards) / 1e9)
        self.starts = self.manifest.shard_starts()
        self._starts = self.starts.tolist()  # one entry per shard: bisect on a short list beats numpy per call
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return self.manifest.num_samples

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
        reader = (RemoteShardReader(self.root, entry, self.verify, self.block_bytes, self.remote) if self.remote
                  else ShardReader(self.root, entry, self.verify, self.block_bytes))
        if self.cache is not None:
            reader = CachedShardReader(reader, self.cache, shard)
        with self._lock:
            reader = self._readers.setdefault(shard, reader)
            while len(self._readers) > self.max_open_shards:
                self._readers.popitem(last=False)[1].close()
        return reader

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
            if isinstance(reader, CachedShardReader):  # every reader, when there is a cache
                reader.release_evicted()

    def _in_this_process(self) -> None:
        """In a forked child, forget the parent's readers first (once, whichever thread comes
        first: threads of a worker process, Loader(processes=, threads=))."""
        if self._pid != os.getpid():
            with _this_process_lock():
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
                "max_open_shards": self.max_open_shards, "storage_options": self.storage_options,
                "metadata": self.root if self.remote else None,
                "cache_dir": self.cache.cache_dir if self.cache else None,
                "cache_limit": self.cache.limit if self.cache else None, "cache_ahead": self.cache_ahead,
                "read_timeout": self.read_timeout, "reads_in_flight": self.reads_in_flight}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)
