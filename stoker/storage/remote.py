"""A packed data set at an fsspec URL (``s3://``, ``gs://``, ``https://``, ...), read in place.

Only the manifest and the indexes are fetched up front, into a local metadata folder (once per
node: :mod:`stoker.storage.metadata`), so indexes are memory-mapped as for a local data set; shard bytes are read by range
(:meth:`RemoteData.read_range`: resumed from the last good byte; several in flight at once
through :meth:`RemoteData.prefetch`), or whole files are downloaded (:meth:`RemoteData.download`,
used by ``stoker stage`` and the node cache). Every request, its retries included, gives up
``read_timeout`` seconds after its last progress, whatever the backend's own timeouts (see
:mod:`stoker.storage.deadline`); the backend is also handed connect and read timeouts within that
(s3fs's ``config_kwargs``, fsspec HTTP's ``timeout``) unless the storage options set them. A
local path works too (fsspec's local file system). Picklable: a DataLoader worker re-creates the
file system in its own process.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from stoker.errors import CorruptDataError, LocalWriteError, RemoteError
from stoker.format import FileChecksum, file_checksum
from stoker.storage.deadline import Deadline, NoAnswer, Progress, call_within
from stoker.storage.fetch_pool import FetchPool
from stoker.storage.files import raise_if_out_of_files
from stoker.storage.locks import ProcessLock
from stoker.storage.ranged import BrokenAnswer, read_into
from stoker.storage.retry import with_retries

log = logging.getLogger("stoker.storage")
T = TypeVar("T")

_CHUNK = 8 << 20
# A write into the local copy that fails with one of these is the local disk's fault, not the source's.
_LOCAL_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
# What fsspec's info() reports that changes when a file's content is replaced (s3fs, gcsfs, local).
_VERSION_KEYS = ("size", "ETag", "etag", "generation", "LastModified", "mtime", "ino")
# How long a read may go without progress, retrying, before it fails (an outage shorter than this is ridden out).
DEFAULT_READ_TIMEOUT = 120.0
# The longest a ranged read's first attempt waits for its answer, or for the next piece of it,
# before it abandons the connection and asks again (AWS advises retrying a small GET not answered
# within about 2 s); doubled on each attempt that brought nothing, so a slow store is still read.
_STALL = 2.0
# Connect and read timeouts handed to a backend (s3fs's own defaults), each at most read_timeout.
_CONNECT_TIMEOUT = 5.0
_SOCKET_READ_TIMEOUT = 15.0
# Ranged reads in flight at once per process (RemoteData.prefetch): at 20 ms and 1 Gbit/s, 2.5 MB
# in flight fill the link; 16 parts of 2 MiB leave room for a slower store's per-connection rate.
DEFAULT_PARALLEL = 16
# A whole file downloaded from an object store (the node cache, stage) comes in ranged reads of this
# size, ``parallel`` in flight: one request's stream is capped by the store's per-connection rate
# (S3 advises parallel byte ranges of 8-16 MB), and a part lost to a fault is all that is read again.
# Measured (bench/cache.py s3): 2.25x one streamed GET per file where each response was held to
# 400 Mbit/s; 0.56x where one stream was not held back (moto on loopback, 2 cores: each part costs
# moto a copy of the whole object). ``stoker doctor URL`` tells which a store is, and proposes
# ``reads_in_flight=1`` (one stream per file) where one request fills the link.
DOWNLOAD_PART = 8 << 20


def is_url(path: str | os.PathLike) -> TypeGuard[str]:
    """True for an fsspec URL other than a plain local path (``file://`` counts as a URL)."""
    return isinstance(path, str) and "://" in path


def cache_root() -> Path:
    """Where stoker keeps node-local files: ``$XDG_CACHE_HOME/stoker`` or ``~/.cache/stoker``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stoker"


class RemoteData:
    """The data set at ``url``: :meth:`read` reads one of its files (its manifest and indexes:
    :func:`stoker.storage.metadata.node_metadata`), :meth:`read_range` a range of one (:meth:`prefetch`: in the background),
    :meth:`download` copies a whole one. ``storage_options`` go to fsspec; failures raise
    ``error`` (a RemoteError) after ``retries`` (see :func:`with_retries`; ranged reads: any
    number) or ``read_timeout`` seconds without progress, whichever comes first; ``parallel``:
    ranged reads in flight at once (:meth:`tune` changes it, and ``part_bytes``: the size of the
    ranged reads a block or a whole file is fetched in, None for :data:`DOWNLOAD_PART` and the
    readers' own); :attr:`counts`: the reads done in this process."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, retries: int = 5,
                 backoff: float = 0.5, error: type[RemoteError] = RemoteError,
                 read_timeout: float = DEFAULT_READ_TIMEOUT, parallel: int = DEFAULT_PARALLEL) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retries, self.backoff, self.error = retries, backoff, error
        self.read_timeout, self.parallel = read_timeout, parallel
        self.part_bytes: int | None = None
        self.counts = ReadCounts()
        self._fs: fsspec.AbstractFileSystem | None = None
        self._root = ""
        self._pid = 0
        self._pool: FetchPool | None = None
        self._pool_lock = ProcessLock()  # a forked worker's own: a parent thread may hold it at the fork

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start:end`` of the data set's file ``name`` (all of it by default: its size asked
        first, one HEAD), retried on transient errors; a RemoteError names the URL when it fails
        for good. Read as :meth:`read_range` reads: the bytes kept as they arrive, each moving the
        deadline (a slow transfer that keeps moving is never cut), a retry resuming from the last
        good byte; an answer that ends early (the object replaced meanwhile) is read again whole.
        A server that does not say the size (HTTP without Content-Length) is read in one call."""
        got = bytearray()
        fs, path, first = self._filesystem(), f"{self._root}/{name}", start or 0
        size: list[int | None] = []  # the object's, once asked

        def rest(deadline: Deadline) -> None:
            if end is None and not size:
                size.append(call_within(fs, "info", deadline, path).get("size"))
            last = end if end is not None else size[0]
            if last is None:
                got[:] = call_within(fs, "cat_file", deadline, path, start=start)
                return
            read_into(fs, path, first, int(last), got, deadline, self.read_timeout)
            if first + len(got) < last:
                ended = first + len(got)
                del got[:], size[:]
                raise BrokenAnswer(f"the answer ended at byte {ended} of {last}; asking again")

        self._retried(f"{self.url}/{name}", rest)
        return bytes(got)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the data set's file ``name``. A read cut short (a reset, a body
        shorter than promised) is retried from its last good byte, an answer that is not the
        range asked (the Range ignored) asked again, a silent one abandoned after :data:`_STALL`
        seconds (more on later attempts), transient errors after jittered pauses from 50 ms
        growing to 1 s (a store back after an outage is read again within a second), until
        ``read_timeout`` seconds pass without progress; then a RemoteError naming the object,
        the range, the attempts and the last cause. An object shorter than the range, as two
        answers agree (or as the store states its size), raises CorruptDataError."""
        got = bytearray()
        fs = self._filesystem()
        path = f"{self._root}/{name}"
        short_at: list[int] = []  # where answers that said nothing of the object's size ended
        stall = _STALL

        def rest(deadline: Deadline) -> None:
            nonlocal stall
            before = len(got)
            try:
                size = read_into(fs, path, start, end, got, deadline, stall)
            except NoAnswer:
                if len(got) == before:  # slower than the bound, or silent: wait longer next time
                    stall *= 2
                raise
            if len(got) < end - start:
                if size is None and start + len(got) not in short_at:
                    short_at.append(start + len(got))
                    raise BrokenAnswer(f"the answer ended at byte {start + len(got)}; asking again")
                raise CorruptDataError(f"{self.url}/{name}", None,
                                       f"bytes {start}-{end} asked, the object ends after {start + len(got)}")

        # Once the main thread has ended, the process is exiting: the reads ahead give up at their first error.
        started = time.perf_counter()
        self._retried(f"{self.url}/{name} (bytes {start}-{end})", rest, retries=None, backoff=0.05, max_pause=1.0,
                      give_up=lambda: not threading.main_thread().is_alive())
        self.counts.add(len(got), time.perf_counter() - started)
        return bytes(got)

    def prefetch(self, name: str, start: int, end: int) -> Future[bytes]:
        """:meth:`read_range` in the background, queued behind earlier ones, ``parallel`` in flight."""
        with self._pool_lock:
            if self._pool is None or self._pid != os.getpid():
                self._filesystem()  # a forked child's: made once here, not by each thread of the pool
                self._pool = FetchPool(self.parallel, "stoker-remote")
            return self._pool.submit(self.read_range, name, start, end)

    def tune(self, parallel: int, part_bytes: int | None) -> None:
        """From now on ``parallel`` ranged reads in flight (those queued keep their order) of
        ``part_bytes`` (None: the defaults) for what is queued next: the Loader's tuner's knobs."""
        with self._pool_lock:
            self.parallel, self.part_bytes = parallel, part_bytes
            if self._pool is not None and self._pid == os.getpid():
                self._pool.resize(parallel)

    def read_many(self, names: list[str]) -> dict[str, bytes]:
        """Every file in ``names``, whole, by name: each as :meth:`read` reads it (its deadline
        moving as its bytes arrive), ``parallel`` at once. The first to fail for good raises; the
        others are not waited for (each ends within its own deadline)."""
        self._filesystem()  # made once here, not by each thread
        pool = ThreadPoolExecutor(max(1, min(self.parallel, len(names))), thread_name_prefix="stoker-metadata")
        try:
            reads = [pool.submit(self.read, name) for name in names]
            return {name: future.result() for name, future in zip(names, reads)}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def version(self, name: str) -> str:
        """What identifies the current content of the file ``name`` without reading it: its size
        and whichever of ETag, generation, modification time and inode the file system reports
        (one HEAD request on an object store). A file replaced or rewritten gets another."""
        info = self._info(name)
        return " ".join(f"{key}={info[key]}" for key in _VERSION_KEYS if info.get(key) is not None)

    def _info(self, name: str) -> dict[str, Any]:
        """What the file system says of the file ``name`` (one HEAD request on an object store)."""
        return self._retried(f"{self.url}/{name}", lambda deadline: call_within(
            self._filesystem(), "info", deadline, f"{self._root}/{name}"))

    def _retried(self, label: str, action: Callable[[Deadline], T], **retry: Any) -> T:
        """``action(deadline)`` retried (:func:`with_retries`, ``retry`` overriding this object's
        settings) until ``read_timeout`` seconds pass without progress; ``action`` hands the
        deadline to the backend, so no attempt outlives it."""
        deadline = Deadline(self.read_timeout)
        settings: dict[str, Any] = {"retries": self.retries, "backoff": self.backoff, "error": self.error, **retry}
        return with_retries(label, lambda: action(deadline), deadline=deadline, **settings)

    def download(self, name: str, size: int, checksum: str, partial: Path, commit: Callable[[Path], None]) -> None:
        """Copy the file ``name``: downloaded into ``partial`` (from an object store in ranged
        reads of :data:`DOWNLOAD_PART`, ``parallel`` in flight, each resumed from its last good
        byte as :meth:`read_range` is; with ``parallel=1`` in one streamed GET), checked against
        ``size`` and the manifest ``checksum``, then handed to ``commit`` (which moves it into
        place). A copy that does not match is fetched again (a transport may have mangled it);
        when a later fetch gives the same wrong bytes (same size and checksum) the object itself
        is damaged: CorruptDataError naming the URL, expected and found, with no more retries. A
        local write that fails (a full disk) raises LocalWriteError at once; a source that fails
        for good, RemoteError (``error``) after the retries of each request. ``partial`` is gone
        afterwards."""
        url = f"{self.url}/{name}"
        mismatches: list[tuple[int, str]] = []
        try:
            while (found := self._download_once(name, partial)) != (size, checksum):
                reason = (f"the object does not match the manifest: expected {size} bytes with checksum {checksum}, "
                          f"got {found[0]} bytes with checksum {found[1]}")
                if found in mismatches:
                    raise CorruptDataError(url, None, f"{reason}, the same on fetching it again: damaged at the source")
                mismatches.append(found)
                if len(mismatches) > self.retries:
                    raise self.error(f"{url}: {reason}; a different wrong copy on each of {len(mismatches)} fetches")
                log.warning("%s: %s; fetching it again (a transport may have mangled this copy only)", url, reason)
            try:
                commit(partial)
            except OSError as e:
                raise LocalWriteError(f"{partial}: cannot move the copy into place ({e.strerror or e})") from None
        finally:
            partial.unlink(missing_ok=True)

    def _download_once(self, name: str, partial: Path) -> tuple[int, str]:
        """Download ``name`` into ``partial`` (written to disk); its size and checksum."""
        url = f"{self.url}/{name}"
        fs = self._filesystem()
        with _local_writes(partial):
            if isinstance(fs, LocalFileSystem):
                found = self._retried(url, lambda _: _copy_hashing(Path(f"{self._root}/{name}"), partial))
            else:
                if self.parallel == 1:
                    started = time.perf_counter()
                    self._retried(url, lambda deadline: self._stream_to(name, partial, deadline))
                    self.counts.add(partial.stat().st_size, time.perf_counter() - started)
                else:
                    self._download_parts(name, partial)
                found = file_checksum(partial)
            with open(partial, "rb+") as f:
                os.fsync(f.fileno())
        return partial.stat().st_size, found

    def _stream_to(self, name: str, partial: Path, deadline: Deadline) -> None:
        """The object ``name`` into ``partial`` in one streamed GET (s3fs's get_file resumes a
        body cut short; measured on moto behind a 50 ms proxy, 274-322 MB/s against 105 MB/s for
        fsspec's file object's sequential 8 MiB requests), abandoned once ``deadline`` passes with
        no bytes arriving; a local write that fails raises LocalWriteError, which is not retried."""
        with _local_writes(partial):
            call_within(self._filesystem(), "get_file", deadline, f"{self._root}/{name}", str(partial),
                        callback=Progress(deadline))

    def _download_parts(self, name: str, partial: Path) -> None:
        """The object ``name``, as long as it is now (one HEAD: a damaged object may be shorter or
        longer than the manifest says), into ``partial`` in ranged reads of :data:`DOWNLOAD_PART`
        on the :meth:`prefetch` pool, each written at its offset as it arrives. An object that
        ends before that length (replaced meanwhile) leaves a short copy, a mismatch like any other."""
        length, part = int(self._info(name)["size"]), self.part_bytes or DOWNLOAD_PART
        parts = {self.prefetch(name, start, min(start + part, length)): start for start in range(0, length, part)}
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while parts:
                done, _ = wait(parts, return_when=FIRST_COMPLETED)
                for future in done:
                    start = parts.pop(future)
                    try:
                        data = future.result()  # a part that failed for good raises here
                    except CorruptDataError:
                        os.ftruncate(fd, start)
                        return
                    _write_at(fd, data, start)
        finally:
            for future in parts:
                future.cancel()
            os.close(fd)

    def _filesystem(self) -> fsspec.AbstractFileSystem:
        if self._fs is None or self._pid != os.getpid():  # made again in a forked or spawned worker
            options = _with_timeouts(self.url, self.storage_options, self.read_timeout)
            self._fs, self._root = fsspec.core.url_to_fs(self.url, **options)
            self._pid = os.getpid()
            self._pool = None  # a forked child has none of the parent's threads
        return self._fs

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options, "retries": self.retries,
                "backoff": self.backoff, "error": self.error, "read_timeout": self.read_timeout,
                "parallel": self.parallel}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)


class ReadCounts:
    """The ranged reads (and streamed downloads) a :class:`RemoteData` made in this process so far:
    how many, their bytes, and the seconds they took, summed (retries included): what the Loader's
    tuner reads an object store's latency and rate from."""

    def __init__(self) -> None:
        self._lock = ProcessLock()
        self.requests, self.nbytes, self.seconds = 0, 0, 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        """One read of ``nbytes`` that took ``seconds``."""
        with self._lock:
            self.requests, self.nbytes, self.seconds = self.requests + 1, self.nbytes + nbytes, self.seconds + seconds

    def totals(self) -> tuple[int, int, float]:
        """(requests, bytes, seconds) so far."""
        with self._lock:
            return self.requests, self.nbytes, self.seconds


def _with_timeouts(url: str, options: dict[str, Any], read_timeout: float) -> dict[str, Any]:
    """``options`` for ``url``'s file system with connect and read timeouts handed to the backend
    where it takes them and the options do not set them: each at most ``read_timeout``, so a
    silent connection fails an attempt inside a read's deadline instead of outliving it."""
    connect, read = min(_CONNECT_TIMEOUT, read_timeout), min(_SOCKET_READ_TIMEOUT, read_timeout)
    protocol = url.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        return {**options, "config_kwargs": {"connect_timeout": connect, "read_timeout": read,
                                             **options.get("config_kwargs", {})}}
    if protocol in ("http", "https") and "timeout" not in options.get("client_kwargs", {}):
        import aiohttp  # fsspec's HTTP file system is built on it

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        return {**options, "client_kwargs": {**options.get("client_kwargs", {}), "timeout": timeout}}
    return options


def intact(path: Path, size: int, checksum: str, verify: bool = True) -> bool:
    """Whether ``path`` holds a file of ``size`` bytes with ``checksum`` (with ``verify=False``: of that size)."""
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    return not verify or file_checksum(path) == checksum



@contextmanager
def _local_writes(path: Path) -> Iterator[None]:
    """Turn an OSError of a full disk or a read-only folder while writing ``path`` into a
    LocalWriteError, and one of no descriptor left into a ResourceLimitError: never retried,
    never blamed on the source."""
    try:
        yield
    except OSError as e:
        raise_if_out_of_files(e, path)
        if e.errno in _LOCAL_WRITE_ERRNOS:
            raise LocalWriteError(f"{path}: cannot write the copy ({e.strerror})") from None
        raise


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """All of ``data`` at ``offset`` of ``fd`` (a write cut short by a full disk goes on, and raises)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _copy_hashing(src: Path, dst: Path) -> str:
    """Copy a local file in 8 MiB reads, hashing each piece as it passes; return the checksum.

    Measured under the HDD profile (bench/cache.py hdd, disk 157 MB/s), a copy followed by a
    checksum of the copy left the disk idle while hashing: the half-budget cache streamed 128-139
    MB/s; hashing while the kernel's read-ahead fetches the next piece streamed 147 MB/s.
    """
    digest = FileChecksum()
    buffer = memoryview(bytearray(_CHUNK))
    with open(src, "rb", buffering=0) as reader:
        try:
            writer = open(dst, "wb")
        except OSError as e:
            raise LocalWriteError(f"{dst}: cannot write the copy ({e.strerror or e})") from None
        with writer:
            while n := reader.readinto(buffer):
                digest.update(buffer[:n])
                try:
                    writer.write(buffer[:n])
                except OSError as e:
                    raise LocalWriteError(f"{dst}: cannot write the copy ({e.strerror or e})") from None
    return digest.hexdigest()
