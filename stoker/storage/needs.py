"""What the stagers of a node will read, and where each is now: files in the node cache's
``.needs/`` folder, so that room is made from the shards the node needs last (the ranks of a node
share the cache; a rank's stager that evicted by its own order alone evicted what another rank
was about to read, and a shard came from the store two or three times in an epoch).

    .needs/<pid>-<tag>.plan   the stager's shards with the first and last position its reader needs each (int64)
    .needs/<pid>-<tag>.at     where its reader is: every read before the first position has ended,
                              the second is the next it is about to read (int64)
    .needs/<pid>-<tag>.lock   held (flock) while the stager lives: a dead one's files are ignored

Positions count a rank's own samples; ranks step together, so positions of different ranks are
comparable. Entries are made, removed and read only while the cache's ``.lock`` is held, so no
process sees an entry whose lock is not held yet, and a dead stager's files are removed by the
next process that makes room.
"""

from __future__ import annotations

import os
import uuid
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from stoker.format.layout import atomic_write
from stoker.storage.locks import exclusive, is_locked

_DTYPE = "<i8"


class Needs:
    """One stager's entry in ``folder`` (the cache's ``.needs``): it will read ``shards``, each
    first at position ``first`` and last at ``last``; registered while ``guard`` (the cache's
    ``.lock``) is held, its lock held until :meth:`close`."""

    def __init__(self, folder: Path, guard: Path, shards: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        folder.mkdir(exist_ok=True)
        self.guard = guard
        self.path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._held = ExitStack()
        with exclusive(guard, inherit=False):
            self._held.enter_context(exclusive(self.path.with_suffix(".lock"), inherit=False))
            atomic_write(self.path.with_suffix(".plan"), np.stack([shards, first, last]).astype(_DTYPE).tobytes())
            self.advance(0, 0)

    def advance(self, done: int, position: int) -> None:
        """The stager's reader is about to read from ``position`` on, and every read before ``done`` has ended."""
        atomic_write(self.path.with_suffix(".at"), np.array([done, position], _DTYPE).tobytes())

    def close(self) -> None:
        """The stager needs nothing more: its entry goes."""
        with exclusive(self.guard, inherit=False):
            for suffix in (".plan", ".at", ".lock"):
                self.path.with_suffix(suffix).unlink(missing_ok=True)
            self._held.close()


def next_needs(folder: Path, shards: int) -> np.ndarray | None:
    """For each of ``shards`` shards, how many positions ahead of the next its reader reads some
    live stager in ``folder`` next needs it: 0 while a reader may be inside it (reads not yet
    ended included), ``inf`` when none needs it again.
    None when no stager lives (the caller holds the cache's ``.lock``; a dead stager's files are
    removed)."""
    if not folder.is_dir():
        return None
    ahead = np.full(shards, np.inf)
    live = False
    for lock in folder.glob("*.lock"):
        entry = lock.with_suffix("")
        if not is_locked(lock):
            for suffix in (".plan", ".at", ".lock"):
                entry.with_suffix(suffix).unlink(missing_ok=True)
            continue
        live = True
        plan = np.frombuffer(entry.with_suffix(".plan").read_bytes(), _DTYPE).reshape(3, -1)
        done, position = np.frombuffer(entry.with_suffix(".at").read_bytes(), _DTYPE).tolist()
        shard, first, last = plan
        wanted = last >= done
        np.minimum.at(ahead, shard[wanted], np.maximum(first[wanted] - position, 0))
    return ahead if live else None
