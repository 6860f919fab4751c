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

    def advance(self, position: int) -> None:
        """The caller is about to read ``order[position:]``: hint every block needed before ``position + ahead``."""
        while self._next < len(self.blocks) and self.first_needed[self._next] < position + self.ahead:
            block = int(self.blocks[self._next])
            self.shards.readahead(int(self.bounds[block]), int(self.bounds[block + 1]))
            self._next += 1
