"""The node cache: whole shards of one data set copied to a fast local folder (``/dev/shm``, a local
SSD), shared by every process on the node and kept within a byte budget.

Layout of ``cache_dir/<data set id>/``::

    shard-000003.tar            a complete copy, checked against the manifest checksum
    .partial-shard-000004.tar   a copy being written; counts as the whole shard from the start
    .verified/shard-000003.tar  "inode mtime size checksum" of the copy when it was last checked
    .consumed/shard-000002.tar  the reader that staged it is done with it this epoch
    .damaged/shard-000005.tar   the object at the source is damaged: its version there and what is wrong
    .needs/<stager>.*           what a live stager of the node will read, and where its reader is
    .locks/shard-000004.tar     held (flock) while one process fetches that shard
    .lock                       held while space is counted, reserved, freed, or a copy moved in
    limit                       the default limit, fixed when the folder was made
    source                      the data set this folder caches (for people)

Every rule that keeps it correct across processes:

- A shard is fetched by the process that holds its lock; another process wanting it waits for
  the lock, then finds it there: each shard is fetched once per node.
- Files are counted (copies, other files, and partials as the whole shard they will be), and a
  partial is created, a copy moved into place or removed, only while holding ``.lock``, so the
  files in the folder never add up to more than ``limit`` bytes. A copy that was evicted while a
  reader had it open keeps its space until the reader notices (see stoker.data.node_copy).
- A reader opens a copy and then checks it (:meth:`ShardCache.open_copy`), and reads only through
  that descriptor: an eviction between its check and its reads cannot make a copy vanish under
  it, nor give it another copy than the one it checked.
- While stagers live on the node, a reader fetches only shards some stager will read: the few
  samples a rank reads of another node's partitions at an epoch's end are read from the source.
- While stagers live on the node (``.needs``, see stoker.storage.needs), room is made from the
  copies the node's readers need last, all ranks together: first those no reader needs again
  this epoch, then those needed furthest ahead; never one a reader is inside. A stager evicts
  only copies needed later than the shard it fetches (else it waits), a reader (fetching the
  shard it reads now) any copy not needed now. With no stager, a reader evicts only copies marked
  consumed (a random order would otherwise evict a whole shard for each sample).
- A copy is trusted while its ``.verified`` record matches its inode and modification time; any
  write to it changes those, and it is checked again before use, and fetched again if damaged.
- A killed process leaves at most a partial, which is removed by the next process that needs
  room or opens the cache; locks die with their holder.
- Errors writing the cache (a full disk) make a fetch report "no room": readers then read from
  the source, which is never blamed for the cache's own trouble.
- An object whose bytes differ from the manifest the same way on two fetches is damaged at the
  source (CorruptDataError), not failing transport: that is recorded in ``.damaged`` with the
  object's version (size, ETag or modification time), so every process on the node gets the
  same error at once instead of fetching it again, until the object changes at the source.
  A cached copy damaged on local disk is never recorded: its check removes it and it is
  fetched again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Collection
from pathlib import Path

import numpy as np

from stoker.errors import CorruptDataError, LocalWriteError, OptionError, RemoteError
from stoker.format import ShardEntry, file_checksum
from stoker.format.layout import atomic_write, check_name
from stoker.storage.files import descriptor_limit
from stoker.storage.locks import exclusive, is_locked
from stoker.storage.needs import Needs, next_needs
from stoker.storage.remote import RemoteData
from stoker.storage.settings import StorageSettings

log = logging.getLogger("stoker.storage")

_PARTIAL = ".partial-"
_OWN_FILES = {"limit", "source", ".lock"}


class ShardCache:
    """Node-local copies of the shards of the data set at ``source`` (a folder or an fsspec URL)
    in ``settings.cache_dir``, within ``settings.cache_limit`` bytes. Without a limit, the one
    fixed when the folder was first made is used: half the space free there then. Shards are
    fetched through ``origin``, the data set's connection (made from ``settings`` when not given),
    so a data set read by range and cached shares one thread pool and file system.

    Picklable (a DataLoader worker gets the source, the shards, the settings and the origin's
    settings); every method may be called from any thread or process on the node.
    """

    def __init__(self, source: str | os.PathLike, shards: list[ShardEntry], settings: StorageSettings,
                 origin: RemoteData | None = None) -> None:
        if settings.cache_dir is None:
            raise OptionError("cache_dir=None: a node cache needs a folder")
        self.cache_dir = Path(settings.cache_dir)
        self.source = source if isinstance(source, str) and "://" in source else str(Path(source).resolve())
        self.shards = shards
        self.settings = settings
        self.origin = origin if origin is not None else settings.origin(self.source)
        self.folder = self.cache_dir / hashlib.sha256(self.source.encode()).hexdigest()[:16]
        self._numbers = {check_name(entry.name): i for i, entry in enumerate(shards)}
        for folder in (self.folder / ".locks", self.folder / ".verified", self.folder / ".consumed",
                       self.folder / ".damaged"):
            folder.mkdir(parents=True, exist_ok=True)
        if not (self.folder / "source").is_file():
            atomic_write(self.folder / "source", self.source.encode() + b"\n")
        self.explicit_limit = settings.cache_limit is not None
        self.limit = int(settings.cache_limit) if settings.cache_limit is not None else self._default_limit()
        self._warned = False
        with exclusive(self.folder / ".lock", inherit=False):
            self._remove_abandoned_partials()

    def warn_if_short(self, shards: Collection[int]) -> None:
        """Warn (once) when the default limit has no room for ``shards``, those an order stages:
        what a node reads is its ranks' share, not always the whole data set."""
        if self.explicit_limit or self._warned:
            return
        need = sum(self.shards[shard].bytes for shard in shards)
        if need > self.limit:
            self._warned = True
            log.warning("%s: the node cache in %s has room for %.1f GB (half its free space) of the %.1f GB of shards "
                        "this rank reads; pass cache_limit= to shuffle and stage whole shards within it",
                        self.source, self.cache_dir, self.limit / 1e9, need / 1e9)

    @property
    def holds_everything(self) -> bool:
        """Whether the whole data set fits within the limit."""
        return sum(entry.bytes for entry in self.shards) <= self.limit

    @property
    def holds_part(self) -> bool:
        """Whether a ``cache_limit`` given by the user holds only part of the data set. Orders
        depend on this, never on a default limit (free space differs from node to node and run
        to run, and every rank must compute the same order)."""
        return self.explicit_limit and not self.holds_everything

    def wanted_whole(self, shard: int) -> bool:
        """Whether a reader that finds ``shard`` missing should fetch it whole into the cache: yes
        with no stager on the node (no order to go by: a random order fills the cache), else only
        when some stager will read it. A shard no stager needs is one a rank reads a few samples of
        at an epoch's end, from another node's partitions: those samples are read where they are."""
        with exclusive(self.folder / ".lock", inherit=False):
            ahead = next_needs(self.folder / ".needs", len(self.shards))
        return ahead is None or bool(np.isfinite(ahead[shard]))

    def needs(self, shards: np.ndarray, first: np.ndarray, last: np.ndarray) -> Needs:
        """A stager's entry in the node's record of what its stagers will read (see :meth:`fetch`):
        ``shards``, each first needed at position ``first`` of its order and last at ``last``."""
        return Needs(self.folder / ".needs", self.folder / ".lock", shards, first, last)

    def path(self, shard: int) -> Path:
        """Where the copy of shard number ``shard`` lives (it may not be there)."""
        return self.folder / self.shards[shard].name

    def ready(self, shard: int) -> bool:
        """Whether an intact copy of ``shard`` is there (see :meth:`open_copy`)."""
        fd = self.open_copy(shard)
        if fd is not None:
            os.close(fd)
        return fd is not None

    def open_copy(self, shard: int) -> int | None:
        """A read-only descriptor of an intact copy of ``shard``, or None when there is none.

        The copy is opened first and checked through that descriptor (its ``.verified`` record,
        else its checksum), so what the caller reads is the copy that was checked, whatever
        happens to the path meanwhile: an eviction unlinks it but the descriptor still reads it,
        and a copy fetched again in its place is another file. A damaged copy is removed; no file
        descriptor left is a ResourceLimitError."""
        with descriptor_limit(self.path(shard)):
            try:
                fd = os.open(self.path(shard), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                if self.intact(shard, fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
        os.close(fd)
        return None

    def intact(self, shard: int, fd: int, recheck: bool = False) -> bool:
        """Whether the copy of ``shard`` open as ``fd`` matches the manifest: trusted while its
        ``.verified`` record matches, else (or with ``recheck``) checked against the manifest
        checksum. A copy that does not match is removed from the cache if it is still there."""
        entry = self.shards[shard]
        stat = os.fstat(fd)
        try:
            if not recheck and self._marker("verified", shard).read_text() == self._record(shard, stat):
                return True
        except FileNotFoundError:
            pass
        if stat.st_size == entry.bytes and file_checksum(fd) == entry.checksum:
            self._mark_verified(shard, stat)
            return True
        log.warning("%s: cached copy does not match the manifest; fetching it again", self.path(shard))
        with exclusive(self.folder / ".lock", inherit=False):
            if _inode(self.path(shard)) == stat.st_ino:  # not replaced by a fresh copy meanwhile
                self._remove(entry.name)
        return False

    def fetch(self, shard: int, staging: bool = False) -> bool:
        """Make sure an intact copy of ``shard`` is in the cache; True when it is.

        When the budget is full, copies are evicted to make room (see the module docstring): for a
        reader (``staging`` False) any that the node's stagers need later than now, or with no
        stager only those marked consumed; for a stager, those needed later than ``shard`` (with
        no stager on record, any other: consumed first, then least recently used).
        False when there is no room, or the cache cannot be written (logged). Waits while another
        process fetches the same shard. Source errors raise RemoteError after retries; an object
        damaged at the source raises CorruptDataError (see :meth:`damage`); no file descriptor
        left, ResourceLimitError.
        """
        entry = self.shards[shard]
        with descriptor_limit(self.path(shard)), exclusive(self._lock(shard), inherit=False):
            if self.ready(shard):
                self._marker("consumed", shard).unlink(missing_ok=True)  # needed again
                return True
            damage = self.damage(shard)
            if damage is not None:
                raise damage
            partial = self.folder / f"{_PARTIAL}{entry.name}"
            with exclusive(self.folder / ".lock", inherit=False):
                partial.unlink(missing_ok=True)
                if not self._make_room(entry.bytes, shard, staging):
                    return False
                partial.touch()  # from now on its shard's size counts as used, before a byte arrives
            try:
                self.origin.download(entry.name, entry.bytes, entry.checksum, partial,
                                     commit=lambda arrived: self._move_in(shard, arrived))
            except LocalWriteError as e:
                log.warning("node cache: %s; reading from the source instead", e)
                return False
            except CorruptDataError as e:
                self._record_damage(shard, e)
                raise
            return True

    def damage(self, shard: int) -> CorruptDataError | None:
        """The error recorded for ``shard``'s object when a fetch found it damaged at the source,
        while the object there is still the one that was fetched (one request to ask); else None,
        and a record of an object replaced since is removed."""
        marker = self._marker("damaged", shard)
        try:
            version, reason = marker.read_text().split("\n", 1)
        except (FileNotFoundError, ValueError):
            return None
        if self._version(shard) != version:
            marker.unlink(missing_ok=True)
            return None
        return CorruptDataError(f"{self.origin.url}/{self.shards[shard].name}", None, reason)

    def _version(self, shard: int) -> str:
        """What a damage record holds for: the manifest's size and checksum of ``shard`` and the
        version of its object at the source now (a new manifest or a replaced object ends it)."""
        entry = self.shards[shard]
        return f"{entry.bytes} {entry.checksum} {self.origin.version(entry.name)}"

    def _record_damage(self, shard: int, error: CorruptDataError) -> None:
        """Record that ``shard``'s object, in its version at the source now, is damaged (see :meth:`damage`)."""
        try:
            version = self._version(shard)
            atomic_write(self._marker("damaged", shard), f"{version}\n{error.reason}".encode())
        except (OSError, RemoteError) as e:  # without the record each process finds the damage itself
            log.warning("node cache: cannot record %s as damaged (%s)", error.shard, e)

    def touch(self, shard: int) -> None:
        """Record a use of ``shard`` (its access time), for least-recently-used eviction."""
        path = self.path(shard)
        try:
            stat = path.stat()
            # The modification time stays: the .verified record names it.
            os.utime(path, ns=(max(stat.st_atime_ns, time.time_ns()), stat.st_mtime_ns))
        except FileNotFoundError:
            pass

    def consumed(self, shard: int) -> None:
        """``shard`` will not be read again this epoch: it is the first to go when room is needed."""
        if self.path(shard).exists():
            self._marker("consumed", shard).touch()

    def usage(self) -> int:
        """Bytes of copies, partials and other files in the cache now."""
        return sum(size for _, size, _ in self._files())

    def _move_in(self, shard: int, arrived: Path) -> None:
        """Put a checked download in place and record it as checked, counted under ``.lock``."""
        with exclusive(self.folder / ".lock", inherit=False):
            os.replace(arrived, self.path(shard))
            self._marker("consumed", shard).unlink(missing_ok=True)
            self._marker("damaged", shard).unlink(missing_ok=True)
            self._mark_verified(shard, self.path(shard).stat())

    def _make_room(self, need: int, shard: int, staging: bool) -> bool:
        """Evict until ``need`` more bytes fit for ``shard`` (see :meth:`fetch`; the caller holds
        ``.lock``); False, evicting nothing, when they cannot."""
        self._remove_abandoned_partials()
        files = self._files()
        free = self.limit - sum(size for _, size, _ in files)
        if free >= need:
            return True
        consumed = set(os.listdir(self.folder / ".consumed"))
        ahead = next_needs(self.folder / ".needs", len(self.shards))
        copies = [(name, size, atime, self._numbers.get(name)) for name, size, atime in files
                  if not name.startswith(_PARTIAL) and name != self.shards[shard].name]
        if ahead is None:  # no stager: no order to go by
            later = [(0.0, name, size, atime) for name, size, atime, _ in copies if staging or name in consumed]
        else:
            bar = float(ahead[shard]) if staging else 0.0
            later = [(needed, name, size, atime) for name, size, atime, number in copies
                     if (needed := float("inf") if number is None else float(ahead[number])) > bar]
        victims = sorted((-needed, name not in consumed, atime, name, size) for needed, name, size, atime in later)
        chosen = []
        for *_, name, size in victims:
            if free >= need:
                break
            chosen.append(name)
            free += size
        if free < need:
            return False
        for name in chosen:
            self._remove(name)
        return True

    def _files(self) -> list[tuple[str, int, int]]:
        """(name, size, access time in ns) of every file counted: copies, partials (as the whole
        shard) and anything else in the folder (copies of an earlier version of the data set)."""
        found = []
        with os.scandir(self.folder) as entries:
            for item in entries:
                if item.name in _OWN_FILES or (item.name.startswith(".") and not item.name.startswith(_PARTIAL)):
                    continue  # ours, or another process's temporary file
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    stat = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                size = stat.st_size
                shard = self._numbers.get(item.name.removeprefix(_PARTIAL))
                if item.name.startswith(_PARTIAL) and shard is not None:
                    size = max(size, self.shards[shard].bytes)
                found.append((item.name, size, stat.st_atime_ns))
        return found

    def _remove(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)
        for kind in (".verified", ".consumed"):
            (self.folder / kind / name).unlink(missing_ok=True)

    def _record(self, shard: int, stat: os.stat_result) -> str:
        """What the .verified record of a copy says: any write to the copy changes it."""
        return f"{stat.st_ino} {stat.st_mtime_ns} {stat.st_size} {self.shards[shard].checksum}"

    def _mark_verified(self, shard: int, stat: os.stat_result) -> None:
        """Record that the copy with ``stat`` was checked. Without the record the copy is only
        checked again, so a failure to write it is logged, not raised."""
        try:
            atomic_write(self._marker("verified", shard), self._record(shard, stat).encode())
        except OSError as e:
            log.warning("node cache: cannot record %s as checked (%s)", self.path(shard), e)

    def _marker(self, kind: str, shard: int) -> Path:
        return self.folder / f".{kind}" / self.shards[shard].name

    def _lock(self, shard: int) -> Path:
        return self.folder / ".locks" / self.shards[shard].name

    def _default_limit(self) -> int:
        """Half the space free when the folder was first made, kept in ``limit`` so that every
        process and every later run uses the same."""
        with exclusive(self.folder / ".lock", inherit=False):
            try:
                return int((self.folder / "limit").read_text())
            except (FileNotFoundError, ValueError):
                limit = self.usage() + shutil.disk_usage(self.folder).free // 2
                atomic_write(self.folder / "limit", f"{limit}\n".encode())
                return limit

    def _remove_abandoned_partials(self) -> None:
        """Partials whose fetcher is gone (a killed process): nobody holds their shard's lock.
        The caller holds ``.lock``."""
        for item in self.folder.glob(f"{_PARTIAL}*"):
            name = item.name.removeprefix(_PARTIAL)
            if not (name in self._numbers and is_locked(self.folder / ".locks" / name)):
                item.unlink(missing_ok=True)

    def __getstate__(self) -> dict:
        return {"source": self.source, "shards": self.shards, "settings": self.settings, "origin": self.origin}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None

