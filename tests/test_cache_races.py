"""A node-cache copy evicted, and staged again, at every point of a read where the reader calls the
operating system: the read gives the sample's bytes, never a missing copy reported as damage.

The interleaving is driven from the reading thread itself: a profile hook (``sys.setprofile``)
sees each call the read makes into ``os`` and ``io`` (open, stat, pread, ...) and, from a chosen
call on, does what another process and another thread would do there: a second ShardCache on the
same folder evicts the copy (to make room for another shard), the reader's evicted copy is closed
as the ShardSet's sweep in another thread closes it, and from a later call the copy is staged
again. Each action waits, as the other process or thread would, while this thread holds a lock it
needs (the cache folder's, a shard's, the reader's). Every pair of points is tried, so the test
does not depend on timing."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import stoker
from stoker.storage.cache import ShardCache
from stoker.storage.locks import is_locked
from stoker.storage.settings import StorageSettings


class Others:
    """A profile hook: before the n-th OS call of this thread, the actions due by then that need
    nothing this thread holds, in order: evict shard 0's copy and close the reader's evicted copy
    (from call ``evict_at``), stage the copy again (from call ``restage_at``)."""

    def __init__(self, reader, cache: ShardCache, evict_at: int | None, restage_at: int | None) -> None:
        self.reader, self.cache = reader, cache
        self.schedule = {evict_at: [self.evict, self.sweep], restage_at: [self.restage]}
        self.due: list = []
        self.calls: list[str] = []

    def __call__(self, frame, event, arg) -> None:
        if event != "c_call" or getattr(arg, "__module__", None) not in ("posix", "io"):
            return
        self.due += self.schedule.pop(len(self.calls), [])
        self.calls.append(arg.__name__)
        while self.due and self.due[0]():
            self.due.pop(0)

    def free(self, *names: str) -> bool:
        folder = self.cache.folder
        return not any(is_locked(folder / ".lock" if name == ".lock" else folder / ".locks" / name) for name in names)

    def evict(self) -> bool:
        names = [entry.name for entry in self.cache.shards[:2]]
        if not self.free(".lock", *names):
            return False
        self.cache.fetch(1, staging=True)  # the limit holds one of shards 0 and 1: shard 0's copy goes
        return True

    def sweep(self) -> bool:
        if self.reader.source.copy._lock.locked():  # a thread sweeping would wait for the copy's lock
            return False
        self.reader.release_evicted()
        return True

    def restage(self) -> bool:
        if not self.free(".lock", *[entry.name for entry in self.cache.shards[:2]]):
            return False
        self.cache.fetch(0, staging=True)
        return True


@contextmanager
def others_acting(packed: Path, folder: Path, limit: int, evict_at: int | None, restage_at: int | None,
                  pinned: bool) -> Iterator[tuple[stoker.ShardDataset, Others]]:
    """A fresh ShardDataset whose cache holds shard 0 (open already when ``pinned``), and
    :class:`Others` acting at the given OS calls of this thread while the block runs."""
    with stoker.ShardDataset(packed, decode="raw", cache_dir=folder, cache_limit=limit) as dataset:
        other = ShardCache(packed, dataset.shards.manifest.shards, StorageSettings(cache_dir=folder, cache_limit=limit))
        other.fetch(0, staging=True)
        if pinned:
            dataset[0]
        others = Others(dataset.shards.reader(0), other, evict_at, restage_at)
        sys.setprofile(others)
        try:
            yield dataset, others
        finally:
            sys.setprofile(None)


def read_with_others(packed: Path, folder: Path, limit: int, evict_at: int | None, restage_at: int | None,
                     pinned: bool) -> list[str]:
    """Read sample 1 of shard 0 with :func:`others_acting`; the OS calls seen."""
    with others_acting(packed, folder, limit, evict_at, restage_at, pinned) as (dataset, others):
        got = dataset[1]
    assert got == stoker.ShardDataset(packed, decode="raw")[1], (evict_at, restage_at, others.calls)
    return others.calls


@pytest.mark.parametrize("pinned", [False, True], ids=["first-read", "copy-open"])
def test_a_copy_evicted_and_staged_again_anywhere_in_a_read_is_read_intact(packed, tmp_path, pinned):
    shards = stoker.ShardDataset(packed).shards.manifest.shards
    limit = max(shards[0].bytes, shards[1].bytes)  # one of shards 0 and 1, never both
    calls = len(read_with_others(packed, tmp_path / "dry", limit, None, None, pinned))
    assert calls >= 2
    for evict_at in range(calls):
        for restage_at in [*range(evict_at + 1, calls), None]:
            read_with_others(packed, tmp_path / f"{evict_at}-{restage_at}", limit, evict_at, restage_at, pinned)
