"""``on_error="skip"``: which sample takes a damaged one's place, one rule for ShardDataset and the Loader.

The rule: the first sample at or after the damaged one (wrapping past the end) that reads and
decodes. It depends on the data alone, so the replacement is the same whatever the threads,
processes or timing. Each reader keeps a :class:`Skips` per process that remembers what it found
unreadable as a jump table (a numpy array, made at the first damage), so that every later search
passes over it in one step:

    samples      ... 7 [8 9 10] 11 ...     8, 9, 10 damaged
    jumps        ... 0  3 2 1   0  ...     from 8 (or 9, 10) straight to 11, the path shortened as it is followed

A shard that cannot be read at all (its file lost, its index damaged: an error tied to no
sample) is marked whole at its first failure. So a lost shard of N samples costs one try, and
any damaged run of N samples N tries in all, where trying sample after sample cost N^2 / 2.
Each damaged shard is named in one warning per process, not once per sample.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from stoker.errors import CorruptDataError

log = logging.getLogger(__name__)

T = TypeVar("T")

# The shards (paths) this process has named in a warning: bounded by the data's shards. A forked
# child warns anew, with a lock of its own (the parent's may have been held at the fork).
_warned: tuple[int, threading.Lock, set[str]] = (os.getpid(), threading.Lock(), set())


class Skips:
    """What one reader found damaged in this process, and its next readable sample.
    ``bounds``: the first sample of each shard in the reader's index space, then its length (a
    :meth:`Manifest.shard_starts`), so that a shard that cannot be read is passed over whole.
    Thread-safe; pickled (to a worker process) without what it found: each process finds its own."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = np.asarray(bounds, np.int64)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._jumps: np.ndarray | None = None  # per sample: 0, not known damaged; k: it and the k - 1 after it are

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def first_readable(self, start: int, read: Callable[[int], T], root: str) -> tuple[int, T]:
        """``(index, read(index))`` for the first sample at or after ``start`` (wrapping) whose
        ``read`` raises no CorruptDataError; a CorruptDataError naming ``root`` when none is left."""
        n = len(self)
        index, passed = start, 0
        while passed < n:
            jump = self._jump(index, n - passed)
            if jump:
                index, passed = (index + jump) % n, passed + jump
                continue
            try:
                return index, read(index)
            except CorruptDataError as e:
                self._found(index, e)
        raise CorruptDataError(root, None, f"no readable sample left (all {n} damaged)")

    def _jump(self, index: int, most: int) -> int:
        """How many samples from ``index`` on are known damaged (at most ``most``), following the
        jumps from there and shortening them to lead straight to the end of the run."""
        jumps = self._table()
        if jumps is None or not jumps[index]:
            return 0
        n, path, total, at = len(jumps), [], 0, index
        while total < most and jumps[at]:
            path.append((at, total))
            total += int(jumps[at])
            at = (at + int(jumps[at])) % n
        total = min(total, most)
        for at, before in path:  # every step of the path now leads to the run's end (a true fact: no lock needed)
            jumps[at] = total - before
        return total

    def _found(self, index: int, error: CorruptDataError) -> None:
        """Remember that sample ``index`` is damaged, its whole shard when ``error`` is tied to no
        sample (the shard or its index cannot be read); warn once per damaged shard per process."""
        jumps = self._table(create=True)
        assert jumps is not None
        if error.key is None:
            shard = int(np.searchsorted(self.bounds, index, side="right")) - 1
            first, end = int(self.bounds[shard]), int(self.bounds[shard + 1])
            jumps[first:end] = np.arange(end - first, 0, -1)
            if _first_warning(error.shard):
                log.warning("skipping damaged sample: %s; none of the %d samples of this shard can be read, the next "
                            "readable sample takes the place of each (counted in skipped)", error, end - first)
            return
        jumps[index] = max(int(jumps[index]), 1)
        if _first_warning(error.shard):
            log.warning("skipping damaged sample: %s; the next readable sample takes its place, and further damage in "
                        "%s is skipped without a warning (counted in skipped)", error, error.shard)

    def _table(self, create: bool = False) -> np.ndarray | None:
        """The jump table of this process (None until something is found damaged, unless ``create``)."""
        if self._pid != os.getpid():  # a forked child: its own table (the parent's lock may be held)
            self._pid, self._lock, self._jumps = os.getpid(), threading.Lock(), None
        if self._jumps is None and create:
            with self._lock:
                if self._jumps is None:
                    self._jumps = np.zeros(len(self), np.int64)
        return self._jumps

    def __getstate__(self) -> dict:
        return {"bounds": self.bounds}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["bounds"])  # type: ignore[misc]


def _first_warning(shard: str) -> bool:
    """Whether this process has not yet warned about ``shard`` (and now counts it as warned)."""
    global _warned
    if _warned[0] != os.getpid():
        _warned = (os.getpid(), threading.Lock(), set())
    _, lock, warned = _warned
    with lock:
        if shard in warned:
            return False
        warned.add(shard)
        return True
