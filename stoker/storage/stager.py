"""The stager: a thread that copies shards into the node cache in the order a reader will need
them, ahead of the reader, within the cache's byte budget."""

from __future__ import annotations

import logging
import threading

import numpy as np

from stoker.errors import CorruptDataError
from stoker.storage.cache import ShardCache
from stoker.storage.needs import Needs

log = logging.getLogger("stoker.storage")


class Stager:
    """Fetch ``shards`` (in the order they are first needed, at positions ``first``; each last
    needed at ``last``) into ``cache`` while a reader walks the same order.

    It fetches as far ahead as the budget allows (``ahead``: at most that many shards beyond the
    ones already open), and never a shard the reader is already past. The shards it has staged
    and still needs are recorded in the cache (:meth:`ShardCache.needs`), so no stager of the node
    evicts them; when the cache is full it evicts only shards no stager there needs, and marks
    each shard consumed once the reader is past its last sample, so those go first. Call
    :meth:`advance` as the reader moves and :meth:`close` at the end. A shard whose object is
    damaged at the source is passed over (logged; the cache records it, so every reader of it
    gets the CorruptDataError at once). Any other error stops the staging (logged): readers then
    fetch shards themselves or read the source, and report a source that fails for good.
    """

    def __init__(self, cache: ShardCache, shards: np.ndarray, first: np.ndarray, last: np.ndarray,
                 ahead: int | None = None) -> None:
        self.cache = cache
        self.shards, self.first, self.last = shards, first, last
        self.ahead = ahead
        self._position = 0
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stoker-stager", daemon=True)
        self._thread.start()

    def advance(self, position: int) -> None:
        """The reader is about to read the order from ``position`` on."""
        with self._changed:
            if position > self._position:
                self._position = position
                self._changed.notify()

    def close(self) -> None:
        """Stop staging (a fetch under way completes in the background)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _run(self) -> None:
        needs = None
        try:
            needs = self.cache.needs()
            self._stage(needs)
        except Exception as e:  # noqa: BLE001 -- a thread must not die unheard; readers go on without it
            log.warning("staging stopped: %s", e)
        finally:
            if needs is not None:
                needs.close()

    def _stage(self, needs: Needs) -> None:
        next_fetch, finished = 0, 0
        by_last = np.argsort(self.last, kind="stable")
        n = len(self.shards)
        kept = np.zeros(0, self.shards.dtype)
        while True:
            with self._changed:
                stopped, position = self._stopped, self._position
            while finished < n and self.last[by_last[finished]] < position:
                self.cache.consumed(int(self.shards[by_last[finished]]))
                finished += 1
            if stopped or finished == n:
                return
            while next_fetch < n and self.last[next_fetch] < position:
                next_fetch += 1  # the reader is past it: never fetched for nothing
            keep = self.shards[: next_fetch + 1][self.last[: next_fetch + 1] >= position]
            if not np.array_equal(keep, kept):
                needs.update(keep)
                kept = keep
            open_now = int(np.searchsorted(self.first, position, side="right"))
            if next_fetch < n and (self.ahead is None or next_fetch < open_now + self.ahead):
                try:
                    fetched = self.cache.fetch(int(self.shards[next_fetch]), set(keep.tolist()))
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
