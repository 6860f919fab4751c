"""The stager: a thread that copies shards into the node cache in the order a reader will need
them, ahead of the reader, within the cache's byte budget."""

from __future__ import annotations

import logging
import threading

import numpy as np

from stoker.errors import CorruptDataError
from stoker.storage.cache import ShardCache

log = logging.getLogger("stoker.storage")


class Stager:
    """Fetch ``shards`` (in the order they are first needed, at positions ``first``; each last
    needed at ``last``) into ``cache`` while a reader walks the same order.

    It fetches as far ahead as the budget allows (``ahead``: at most that many shards beyond the
    ones already open), and never a shard the reader is already past (``trail`` positions before
    the position it is about to read: the batches it may still be reading). Its order and its
    reader's position are on record in the cache (:meth:`ShardCache.needs`), so room is made from
    the shards the node's readers, every rank's, need last; a shard is fetched only when room can
    be made from shards needed later than it. Each shard is marked consumed once the reader is
    past its last sample. Call :meth:`advance` as the reader moves (staging starts at the first
    call) and :meth:`close` at the end. A shard whose object is damaged at the source is passed
    over (logged; the cache records it, so every reader of it gets the CorruptDataError at once).
    Any other error stops the staging (logged): readers then fetch shards themselves or read the
    source, and report a source that fails for good.
    """

    def __init__(self, cache: ShardCache, shards: np.ndarray, first: np.ndarray, last: np.ndarray,
                 ahead: int | None = None, trail: int = 0) -> None:
        self.cache = cache
        self.shards, self.first, self.last = shards, first, last
        self.ahead, self.trail = ahead, trail
        self._position = 0
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stoker-stager", daemon=True)
        try:
            self._needs = cache.needs(shards, first, last)
        except OSError as e:  # a cache that cannot be written: readers go on without staging
            log.warning("not staging: %s", e)
            self._stopped = True

    def advance(self, position: int) -> None:
        """The reader is about to read the order from ``position`` on, and may still be reading
        ``trail`` positions before it (batches in flight); on record at once: the node's readers
        make room by it."""
        with self._changed:  # held while the record changes: it is never written after it was closed
            started = self._thread.ident is not None
            if self._stopped or (started and position <= self._position):
                return
            self._position = max(position, self._position)
            if not started:  # staging starts where the reader does
                self._thread.start()
            self._changed.notify()
            try:
                self._needs.advance(max(0, self._position - self.trail), self._position)
            except OSError as e:  # the record lags; staging goes on
                log.warning("node cache: cannot record the reader's position (%s)", e)

    def close(self) -> None:
        """Stop staging (a fetch under way completes in the background)."""
        with self._changed:
            if not self._stopped and self._thread.ident is None:  # never started: its thread cannot end the record
                self._needs.close()
            self._stopped = True
            self._changed.notify()

    def _run(self) -> None:
        try:
            self._stage()
        except Exception as e:  # noqa: BLE001 -- a thread must not die unheard; readers go on without it
            log.warning("staging stopped: %s", e)
        finally:
            with self._changed:
                self._stopped = True
                self._needs.close()

    def _stage(self) -> None:
        next_fetch, finished = 0, 0
        by_last = np.argsort(self.last, kind="stable")
        n = len(self.shards)
        while True:
            with self._changed:
                stopped, position = self._stopped, self._position
            done = position - self.trail  # every read before it has ended
            while finished < n and self.last[by_last[finished]] < done:
                self.cache.consumed(int(self.shards[by_last[finished]]))
                finished += 1
            if stopped or finished == n:
                return
            while next_fetch < n and self.last[next_fetch] < done:
                next_fetch += 1  # the reader is past it: never fetched for nothing
            open_now = int(np.searchsorted(self.first, position, side="right"))
            if next_fetch < n and (self.ahead is None or next_fetch < open_now + self.ahead):
                try:
                    fetched = self.cache.fetch(int(self.shards[next_fetch]), staging=True)
                except CorruptDataError as e:
                    log.warning("not staging a damaged shard: %s", e)
                    next_fetch += 1
                    continue
                if fetched:
                    next_fetch += 1
                    continue
            with self._changed:
                if not self._stopped and self._position == position:
                    self._changed.wait(timeout=0.5)
