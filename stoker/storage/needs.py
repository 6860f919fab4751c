"""What the stagers of a node still need from its cache: one small file per live stager in the
cache's ``.needs/`` folder, so that room is made only from shards no stager on the node needs
(the ranks of a node share the cache; without this, one rank's stager evicted what another's had
just staged for it).

    .needs/<pid>-<tag>        the shard numbers the stager has staged and still needs (int32)
    .needs/<pid>-<tag>.lock   held (flock) while the stager lives: a dead one's entry is ignored

Entries are made, removed and read only while the cache's ``.lock`` is held, so no process sees an
entry whose lock is not held yet, and a dead stager's files are removed by the next process that
makes room.
"""

from __future__ import annotations

import os
import uuid
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from stoker.format.layout import atomic_write
from stoker.storage.locks import exclusive, is_locked

_DTYPE = "<i4"


class Needs:
    """One stager's entry in ``folder`` (the cache's ``.needs``), registered while ``guard`` (the
    cache's ``.lock``) is held, its lock held until :meth:`close`."""

    def __init__(self, folder: Path, guard: Path) -> None:
        folder.mkdir(exist_ok=True)
        self.guard = guard
        self.path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._held = ExitStack()
        with exclusive(guard, inherit=False):
            self._held.enter_context(exclusive(self.path.with_suffix(".lock"), inherit=False))

    def update(self, shards: np.ndarray) -> None:
        """The stager now needs ``shards`` (shard numbers), and no others."""
        atomic_write(self.path, np.asarray(shards, dtype=_DTYPE).tobytes())

    def close(self) -> None:
        """The stager needs nothing more: its entry goes."""
        with exclusive(self.guard, inherit=False):
            self.path.unlink(missing_ok=True)
            self.path.with_suffix(".lock").unlink(missing_ok=True)
            self._held.close()


def needed(folder: Path) -> set[int]:
    """The shards some live stager's entry in ``folder`` names (the caller holds the cache's
    ``.lock``); the entries of dead stagers are removed."""
    found: set[int] = set()
    if not folder.is_dir():
        return found
    for lock in folder.glob("*.lock"):
        entry = lock.with_suffix("")
        if is_locked(lock):
            try:
                found.update(np.frombuffer(entry.read_bytes(), dtype=_DTYPE).tolist())
            except FileNotFoundError:  # registered, nothing staged yet
                pass
        else:
            entry.unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
    return found
