"""The batches' memory: tensors over anonymous maps, and a ring of batches the Loader reuses.
(Each thread's scratch memory, reused from one image to the next, is stoker/decode/scratch.py's.)"""

from __future__ import annotations

import math
import mmap
import os
import sys

import numpy as np
import torch

from stoker.decode.scratch import anonymous_map
from stoker.errors import OptionError


def mapped_pixels(shape: tuple[int, ...], memory: mmap.mmap | np.ndarray | None = None) -> torch.Tensor:
    """A uint8 tensor of ``shape`` over ``memory``, or over an anonymous memory map of its own,
    unmapped when the last tensor over it is freed. glibc serves allocations under its dynamic
    mmap threshold (up to 32 MB) from a heap it rarely gives back: measured here, batches of 256 at
    160 px (19.7 MB each) took the Loader's peak PSS from 293 to ~480 MB that way. The pages are
    mapped in at once (MAP_POPULATE): faulting them in one by one while decoding into them cost
    ~150 us per 230 KB frame here (decoding into a batch of 16 clips of 320x240: 439 us per frame;
    populated: 314; reused memory: 283). A shape of no bytes (the Loader's batch of whole images,
    which keeps its pixels per sample) gets an empty tensor: there is nothing to map."""
    nbytes = math.prod(shape)
    if nbytes == 0:
        return torch.empty(shape, dtype=torch.uint8)
    if memory is None:
        memory = anonymous_map(nbytes)
    return torch.frombuffer(memory, dtype=torch.uint8, count=nbytes).view(shape)


class BatchRing:
    """At most ``slots`` batch buffers of ``shape``, each handed out again only once nothing
    outside the ring holds it.

    The Loader makes its batches in these rather than in fresh memory, so its own memory stays at
    ``slots`` batches (the batches being made, and the one the training loop holds) however long
    the epoch. A batch the loop keeps (in a list, or a view or numpy array of it) holds its buffer:
    that buffer is not handed out until the last tensor over it is gone, so a held batch stays valid.
    A ``shared`` ring makes all its buffers at once in shared memory (``shared_buffers``), for
    worker processes to write batches into (stoker/loader/process_batches.py); the rule is the same.
    """

    # What sys.getrefcount reports for a buffer nobody else holds: the ring's list, the loop's
    # variable and getrefcount's own argument. Every tensor over a buffer (views included: they
    # share its storage) holds one more reference through the buffer protocol.
    _UNHELD = 3

    def __init__(self, shape: tuple[int, ...], slots: int, shared: bool = False) -> None:
        self.shape, self.slots = shape, slots
        if slots * math.prod(shape) > _physical_memory():
            raise self._too_large(f"more than this machine's {_physical_memory() / 2**30:.1f} GiB of memory")
        try:
            # shared: the tensors worker processes get (torch shares their memory with fork and spawn)
            self.shared_buffers = [torch.empty(shape, dtype=torch.uint8).share_memory_() for _ in range(slots * shared)]
        except (RuntimeError, OSError) as e:
            raise self._too_large(f"cannot be allocated: {e}") from None
        self._memory: list[mmap.mmap | np.ndarray] = [buffer.numpy() for buffer in self.shared_buffers]

    def free(self) -> int | None:
        """The slot of a buffer nobody holds (made now while fewer than ``slots`` exist); None when all are held."""
        for slot in range(len(self._memory)):  # (enumerate would hold one more reference, in the tuple it reuses)
            memory = self._memory[slot]
            if sys.getrefcount(memory) == self._UNHELD:
                return slot
        if len(self._memory) < self.slots:
            try:
                self._memory.append(anonymous_map(math.prod(self.shape)))
            except OSError as e:
                raise self._too_large(f"cannot be allocated: {e.strerror}") from None
            return len(self._memory) - 1
        return None

    def pixels(self, slot: int) -> torch.Tensor:
        """The buffer of ``slot`` as a uint8 tensor of ``shape``: held until the last tensor over it is gone."""
        return mapped_pixels(self.shape, self._memory[slot])

    def _too_large(self, why: str) -> OptionError:
        """The error for buffers that do not fit: their size, and what makes them smaller."""
        each = math.prod(self.shape)
        return OptionError(f"the Loader's batch buffers, {self.slots} batches (prefetch + 1, or + 2 with worker "
                           f"processes) of {self.shape[0]} samples x {each // max(self.shape[0], 1):,} bytes "
                           f"({self.slots * each / 2**30:,.1f} GiB), {why}: lower batch_size, the crop size or prefetch")

    def take(self) -> torch.Tensor | None:
        """A buffer nobody holds, as a uint8 tensor of ``shape``; None when all ``slots`` are held."""
        slot = self.free()
        return None if slot is None else self.pixels(slot)


def _physical_memory() -> int:
    """Bytes of memory this machine has (what no set of buffers may exceed)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

