"""Reading ahead of an order: ask the kernel for each block before its first sample is needed."""

from __future__ import annotations

import numpy as np

from stoker.data.order import block_schedule
from stoker.data.shards import ShardSet


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
        mean_block_samples = max(1, int(bounds[-1]) // max(1, len(bounds) - 1))
        self.ahead = window * mean_block_samples
        self._next = 0
        # Per block, its place in the order in which blocks are hinted (blocks never needed: last).
        self._hint_rank = np.full(max(0, len(bounds) - 1), len(self.blocks), dtype=np.int64)
        self._hint_rank[self.blocks] = np.arange(len(self.blocks))

    def advance(self, position: int) -> None:
        """The caller is about to read ``order[position:]``: hint every block needed before ``position + ahead``."""
        while self._next < len(self.blocks) and self.first_needed[self._next] < position + self.ahead:
            block = int(self.blocks[self._next])
            self.shards.readahead(int(self.bounds[block]), int(self.bounds[block + 1]))
            self._next += 1

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` sorted by when their bytes arrive from a cold disk: by the order
        in which their blocks are hinted, then by offset. A thread that decodes samples in this
        order works on data already read while the disk reads the rest."""
        blocks = np.searchsorted(self.bounds, indices, side="right") - 1
        return np.lexsort((indices, self._hint_rank[blocks]))


class Lookahead:
    """Everything a reader does ahead of its order: with a node cache, a :class:`Stager` copies
    whole shards into it; without one, :class:`BlockReadahead` hints blocks to the kernel (unless
    ``hint_blocks`` is False: a fully random order would read each block for one sample).
    Call :meth:`advance` as the order is consumed and :meth:`close` at the end."""

    def __init__(self, shards: ShardSet, bounds: np.ndarray, order: np.ndarray, window: int,
                 hint_blocks: bool = True) -> None:
        self.stager = shards.stage_ahead(order)
        self.blocks = BlockReadahead(shards, bounds, order, window) if hint_blocks and self.stager is None else None

    def advance(self, position: int) -> None:
        """The reader is about to read ``order[position:]``."""
        if self.stager is not None:
            self.stager.advance(position)
        if self.blocks is not None:
            self.blocks.advance(position)

    def arrival_order(self, indices: np.ndarray) -> np.ndarray:
        """Positions of ``indices`` in the order their bytes arrive (see :meth:`BlockReadahead.arrival_order`)."""
        return self.blocks.arrival_order(indices) if self.blocks is not None else np.argsort(indices, kind="stable")

    def close(self) -> None:
        """Stop staging."""
        if self.stager is not None:
            self.stager.close()
