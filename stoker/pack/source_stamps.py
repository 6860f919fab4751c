"""What a stat says about each file a pack was made from, kept beside the cached pack, so that
:func:`stoker.loader_for` (stoker/pack/cache.py) notices files replaced, touched, added or removed since.

A stat per file and no read: cheap for a million files (a second or a few on a local disk),
where hashing every file would cost as much as packing again. A file counts as changed when its
size, modification time or status-change time (ctime) differs: ctime moves whenever the content
is written, even by a tool that sets the modification time back (``cp -p``, ``rsync -t``, ``touch -d``).
What a stat cannot see is not seen: a change within one timestamp tick of the stat taken before
packing, on a filesystem whose clock is that coarse.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from stoker.format.layout import atomic_write
from stoker.sources.listing import Source
from stoker.storage.remote import cache_root

_MISSING = -1  # the stat of a file that could not be stat'ed (gone, or no permission)


@dataclass(frozen=True)
class FileStamps:
    """Each listed file once, in listing order: ``paths`` (xxh3-64 of the path) and ``stats``
    (N, 3) int64: size, mtime_ns and ctime_ns (-1 where the stat failed)."""

    paths: np.ndarray
    stats: np.ndarray


@dataclass(frozen=True)
class StampChanges:
    """How the files differ from their stamps: ``changed`` (paths of files in both whose stat
    differs), and how many files were ``added`` and ``removed`` (a rename is one of each)."""

    changed: list[str]
    added: int
    removed: int

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    def describe(self, root: Path) -> str:
        """A line for the log: counts, and the first changed files relative to ``root``."""
        parts = []
        if self.changed:
            shown = ", ".join(os.path.relpath(p, root) for p in self.changed[:3])
            more = f" and {len(self.changed) - 3} more" if len(self.changed) > 3 else ""
            parts.append(f"{len(self.changed)} file{'s' if len(self.changed) > 1 else ''} changed "
                         f"(size or modification/status-change time: {shown}{more})")
        parts += [f"{n} file{'s' if n > 1 else ''} {what}" for n, what in ((self.added, "added"),
                                                                           (self.removed, "removed")) if n]
        return "; ".join(parts)


def listed_files(source: Source) -> list[str]:
    """The files ``source`` reads, each once in listing order: its paths, the Parquet and tar
    files its rows and members are in, or the files it names itself (a save_to_disk folder's)."""
    if source.files is not None:
        return list(source.files)
    return list(dict.fromkeys(ref if isinstance(ref, str) else str(ref[0]) for ref in source.refs))


def stamp_files(files: Sequence[str]) -> FileStamps:
    """A stat of each of ``files`` (following links, as reading them does)."""
    paths = np.fromiter((xxhash.xxh3_64_intdigest(os.fsencode(f)) for f in files), np.uint64, len(files))
    stats = np.full((len(files), 3), _MISSING, np.int64)
    for i, file in enumerate(files):
        try:
            st = os.stat(file)
        except OSError:
            continue  # the pack rejects it too; a later stat that works counts as a change
        stats[i] = st.st_size, st.st_mtime_ns, st.st_ctime_ns
    return FileStamps(paths, stats)


def compare(saved: FileStamps, now: FileStamps, files: Sequence[str]) -> StampChanges:
    """What changed from ``saved`` to ``now`` (whose files are ``files``)."""
    common, at_saved, at_now = np.intersect1d(saved.paths, now.paths, return_indices=True)
    differ = at_now[(saved.stats[at_saved] != now.stats[at_now]).any(axis=1)]
    return StampChanges([files[i] for i in np.sort(differ)], len(now.paths) - len(common),
                        len(saved.paths) - len(common))


def stamps_path(pack: Path) -> Path:
    """Where the stamps of the pack in ``pack`` are kept: in the cache, not in the pack folder
    (which holds only what stoker.pack writes)."""
    name = hashlib.sha256(str(pack.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "packs" / "stamps" / f"{name}.npz"


def load_stamps(path: Path) -> FileStamps | None:
    """The stamps saved at ``path``; None when there are none or they cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            stamps = FileStamps(saved["paths"], saved["stats"])
    except (OSError, ValueError, KeyError):
        return None
    if stamps.paths.dtype != np.uint64 or stamps.stats.shape != (len(stamps.paths), 3):
        return None
    return stamps


def save_stamps(path: Path, stamps: FileStamps) -> None:
    """Write ``stamps`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = io.BytesIO()
    np.savez(out, paths=stamps.paths, stats=stamps.stats)
    atomic_write(path, out.getvalue())


def same(a: FileStamps | None, b: FileStamps) -> bool:
    """Whether ``a`` are the stamps ``b``."""
    return a is not None and np.array_equal(a.paths, b.paths) and np.array_equal(a.stats, b.stats)
