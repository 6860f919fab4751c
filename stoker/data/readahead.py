"""Reading ahead of an order, all in one place: the blocks an order shuffles and how many it keeps
open, kernel hints for each block before its first sample is needed, or with a node cache a
stager copying whole shards into it in the order they are needed. A :class:`ShardSet` only
reads; this module decides what to read next."""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from stoker.data.order import block_bounds, block_schedule, shard_schedule
from stoker.data.shards import ShardSet
from stoker.storage.stager import Stager

# Blocks read ahead from an object store that closing a pass takes back: the latest ones (the
# earlier ones are fetched: the remote readers fetch in the order hinted, a few in flight).
_CANCELLABLE = 256


def block_bounds_of(shards: ShardSet) -> np.ndarray:
    """Block boundaries over all samples of ``shards`` (see :func:`stoker.data.order.block_bounds`):
    of ``block_bytes``, or whole shards when ``cache_limit`` holds only part of the data set, so
    that an order keeps few shards open and each is cached, read and evicted as a whole."""
    counts = np.diff(shards.starts)
    unit = shards.block_bytes
    if shards.cache is not None and shards.cache.holds_part:
        unit = max((entry.bytes for entry in shards.manifest.shards), default=0) + 1
    return block_bounds(np.repeat(np.arange(len(counts)), counts), shards.column("start"), unit)


def open_blocks(shards: ShardSet, window: int) -> int:
    """How many blocks an order over ``shards`` may keep open at once: ``window``, or when
    ``cache_limit`` holds only part of the data set, as many whole shards as fill half of it (the
    other half is for the shards staged next)."""
    if shards.cache is None or not shards.cache.holds_part:
        return window
    largest = max((entry.bytes for entry in shards.manifest.shards), default=1)
    return max(1, min(window, shards.cache.limit // (2 * largest)))


class BlockReadahead:
    """Walks an order of samples and, about ``window`` blocks' worth of samples before a block's
    first sample comes up, asks the kernel to read the whole block (``posix_fadvise`` WILLNEED). The page cache is
    shared, so reads by threads or DataLoader worker processes then hit memory, and the disk sees
    one large read per block while the current ones are consumed.
    """

    def __init__(self, shards: ShardSet, bounds: np.ndarray, order: np.ndarray, window: int) -> None:
        self.shards = shards
        self.bounds = bounds
        self.blocks, self.first_needed = block_schedule(bounds, order)
        # The samples of each block this order reads, block after block: a source that holds a
        # block in memory lets it go once these are read (a rank reads only its part of a block).
        block_of = np.searchsorted(bounds, order, side="right") - 1
        self._reads = order[np.argsort(block_of, kind="stable")]
        self._reads_at = np.concatenate([[0], np.cumsum(np.bincount(block_of, minlength=max(0, len(bounds) - 1)))])
        self._block_samples = max(1, int(bounds[-1]) // max(1, len(bounds) - 1))  # on average
        self.ahead = window * self._block_samples
        self._next = 0
        # (shard, first, last) of the latest blocks read ahead from an object store: all that may still be queued.
        self._hinted_remote: deque[tuple[int, int, int]] = deque(maxlen=_CANCELLABLE)
        # Per block, its place in the order in which blocks are hinted (blocks never needed: last).
        self._hint_rank = np.full(max(0, len(bounds) - 1), len(self.blocks), dtype=np.int64)
        self._hint_rank[self.blocks] = np.arange(len(self.blocks))
        if shards.remote is not None:  # queued now (no waiting involved), before any read can miss them
            self.advance(0)

    def advance(self, position: int) -> None:
        """The caller is about to read ``order[position:]``: hint every block needed before ``position + ahead``."""
        while self._next < len(self.blocks) and self.first_needed[self._next] < position + self.ahead:
            block = int(self.blocks[self._next])
            start, stop = int(self.bounds[block]), int(self.bounds[block + 1])
            shard, local = self.shards.locate(start)  # a block lies within one shard
            reads = self._reads[self._reads_at[block] : self._reads_at[block + 1]] - (start - local)
            self.shards.reader(shard).readahead(local, local + (stop - start) - 1, reads)
            if self.shards.remote is not None:
                self._hinted_remote.append((shard, local, local + (stop - start) - 1))
            self._next += 1

    def set_depth(self, blocks: int) -> None:
        """From now on hint about ``blocks`` blocks' worth of samples ahead (the Loader's tuner)."""
        self.ahead = blocks * self._block_samples

    def close(self) -> None:
        """Drop the blocks read ahead from an object store that are not yet fetched (a loop that left
        its pass early would otherwise download them, and the next pass's reads queue behind them).
        A kernel hint cannot be taken back; a cheap one is left to the kernel."""
        for shard, first, last in self._hinted_remote:
            reader = self.shards.open_reader(shard)
            if reader is not None:  # a reader closed since then took back its reads ahead
                reader.cancel_readahead(first, last)
        self._hinted_remote.clear()

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` sorted by when their bytes arrive from a cold disk: by the order
        in which their blocks are hinted, then by offset. A thread that decodes samples in this
        order works on data already read while the disk reads the rest."""
        blocks = np.searchsorted(self.bounds, indices, side="right") - 1
        return np.lexsort((indices, self._hint_rank[blocks]))


class ReadsAhead(Protocol):
    """What a reader drives as it consumes an order: :class:`Lookahead`, or a Mix's (one per source)."""

    def advance(self, position: int) -> None:
        """The reader is about to read ``order[position:]``."""

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` in the order their bytes arrive."""

    def set_depth(self, blocks: int) -> None:
        """Read about ``blocks`` blocks ahead from now on."""

    def close(self) -> None:
        """Stop staging."""


class Lookahead:
    """Everything a reader does ahead of its order: with a node cache, a :class:`Stager` copies
    whole shards into it; without one, :class:`BlockReadahead` hints blocks to the kernel (unless
    ``hint_blocks`` is False: a fully random order would read each block for one sample).
    Blocks of an object store are fetched into the memory of the process that hints them, so they
    are read ahead only where the samples are read (``reads_here``); the node cache and a disk's
    page cache serve every process. ``trail``: how far behind the position given to
    :meth:`advance` reads may still be going on (batches in flight), so that no shard they read is
    taken for done. ``home``: the shards this rank's node holds (its partitions' on several
    nodes; None: all), the only ones staged: the few samples of other nodes' shards a rank reads
    at an epoch's end are read where they are (a shard no stager of the node needs is not fetched
    whole, see :meth:`ShardCache.wanted_whole`). Call :meth:`advance` as the order is consumed and
    :meth:`close` at the end."""

    def __init__(self, shards: ShardSet, bounds: np.ndarray, order: np.ndarray, window: int,
                 hint_blocks: bool = True, reads_here: bool = True, trail: int = 0,
                 home: np.ndarray | None = None) -> None:
        cache = shards.cache
        self.stager = None
        if cache is not None:
            staged, first, last = shard_schedule(shards.starts, order)
            if home is not None:
                mine = np.isin(staged, home)
                staged, first, last = staged[mine], first[mine], last[mine]
            cache.warn_if_short(staged.tolist())
            self.stager = Stager(cache, staged, first, last, ahead=shards.settings.cache_ahead, trail=trail)
        hint = hint_blocks and self.stager is None and (reads_here or shards.remote is None)
        self.blocks = BlockReadahead(shards, bounds, order, window) if hint else None

    def advance(self, position: int) -> None:
        """The reader is about to read ``order[position:]``."""
        if self.stager is not None:
            self.stager.advance(position)
        if self.blocks is not None:
            self.blocks.advance(position)

    def set_depth(self, blocks: int) -> None:
        """Hint about ``blocks`` blocks ahead from now on (the stager keeps its own ``cache_ahead``)."""
        if self.blocks is not None:
            self.blocks.set_depth(blocks)

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` in the order their bytes arrive (see :meth:`BlockReadahead.arrival_order`)."""
        return self.blocks.arrival_order(indices) if self.blocks is not None else np.argsort(indices, kind="stable")

    def close(self) -> None:
        """Stop staging, and drop what is read ahead and not yet fetched."""
        if self.stager is not None:
            self.stager.close()
        if self.blocks is not None:
            self.blocks.close()
