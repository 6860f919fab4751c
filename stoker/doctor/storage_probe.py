"""Storage probes: how fast the sampled items come off the storage, cold and warm, one at a time
and in parallel, read whole in large pieces, and copied into RAM or onto a local SSD.

Cold means the page cache of exactly the files read was dropped first (``posix_fadvise``
DONTNEED, no root needed); whether that worked is checked with ``mincore`` and reported, since
NFS, FUSE or tmpfs may keep the pages, and then "cold" figures are warm ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stoker.doctor.contention import Contention, DiskWatch
from stoker.doctor.numbers import rounded
from stoker.doctor.target import Target
from stoker.errors import StokerError
from stoker.storage import evict, resident_bytes

STALL_SECONDS = 0.1
_CHUNK = 1 << 20
_COPY_CAP = 256 << 20


@dataclass
class ReadStats:
    """One pass of reads: count, bytes, wall seconds, per-read latencies and the reads over 100 ms."""

    reads: int
    nbytes: int
    seconds: float
    concurrency: int
    latencies_ms: np.ndarray
    items: list[int] = field(default_factory=list)
    stalls: list[tuple[str, float]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        """Reads completed per second of wall time."""
        return self.reads / self.seconds if self.seconds else 0.0

    @property
    def mb_per_second(self) -> float:
        """Megabytes (10^6) read per second of wall time."""
        return self.nbytes / self.seconds / 1e6 if self.seconds else 0.0

    def to_dict(self) -> dict:
        """One pass in the report (latencies as percentiles; the full list stays in memory for charts)."""
        pct = np.percentile(self.latencies_ms, [50, 90, 99]) if len(self.latencies_ms) else np.zeros(3)
        return {"reads": self.reads, "bytes": self.nbytes, "seconds": round(self.seconds, 4),
                "concurrency": self.concurrency, "reads_per_s": round(self.per_second, 1),
                "mb_per_s": round(self.mb_per_second, 2),
                "latency_ms": {"p50": round(float(pct[0]), 3), "p90": round(float(pct[1]), 3),
                               "p99": round(float(pct[2]), 3),
                               "max": round(float(self.latencies_ms.max()) if len(self.latencies_ms) else 0.0, 3)},
                "stalls": [{"item": name, "ms": round(ms, 1)} for name, ms in self.stalls],
                "failures": [{"item": name, "reason": reason} for name, reason in self.failures]}


@dataclass
class StorageReport:
    """Every storage measurement; a probe that could not run is ``None`` with its reason in ``notes``
    (the one-at-a-time passes, ``cold`` and ``warm``, always run)."""

    cold: ReadStats
    warm: ReadStats
    cold_parallel: ReadStats | None
    eviction_worked: bool
    still_cached_bytes: int
    sequential_mb_per_s: float | None
    copy_to_ram_mb_per_s: float | None
    copy_to_ssd_mb_per_s: float | None
    mean_item_bytes: float
    notes: list[str] = field(default_factory=list)
    contention: Contention | None = None

    def to_dict(self) -> dict:
        """The report's ``storage`` section."""
        stats = {name: (getattr(self, name).to_dict() if getattr(self, name) else None)
                 for name in ("cold", "warm", "cold_parallel")}
        return {**stats, "eviction_worked": self.eviction_worked, "still_cached_bytes": self.still_cached_bytes,
                "sequential_mb_per_s": rounded(self.sequential_mb_per_s, 2),
                "copy_to_ram_mb_per_s": rounded(self.copy_to_ram_mb_per_s, 2),
                "copy_to_ssd_mb_per_s": rounded(self.copy_to_ssd_mb_per_s, 2),
                "mean_item_bytes": round(self.mean_item_bytes, 1), "notes": self.notes,
                "contention": self.contention.to_dict() if self.contention else None}


def timed_reads(names: Sequence[str], read: Callable[[int], bytes], items: Sequence[int], concurrency: int,
                seconds: float) -> ReadStats:
    """Read ``items`` with ``concurrency`` threads, timing each read, until done or ``seconds`` pass."""
    latencies = np.full(len(items), np.nan)
    sizes = np.zeros(len(items), np.int64)
    failures: list[tuple[str, str]] = []
    deadline = time.perf_counter() + seconds

    def one(k: int) -> None:
        if time.perf_counter() > deadline:
            return
        start = time.perf_counter()
        try:
            sizes[k] = len(read(items[k]))
        except (OSError, StokerError) as e:  # reported, not fatal: the doctor examines damaged data too
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            failures.append((names[items[k]], f"{type(e).__name__}: {reason}"))
            return
        latencies[k] = (time.perf_counter() - start) * 1000

    start = time.perf_counter()
    if concurrency == 1:
        for k in range(len(items)):
            one(k)
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(len(items))))
    wall = time.perf_counter() - start
    done = ~np.isnan(latencies)
    stalls = sorted(((names[items[k]], float(latencies[k])) for k in np.flatnonzero(done).tolist()
                     if latencies[k] > STALL_SECONDS * 1000), key=lambda s: -s[1])
    return ReadStats(int(done.sum()), int(sizes[done].sum()), wall, concurrency, latencies[done],
                     [items[k] for k in np.flatnonzero(done).tolist()], stalls, failures)


def probe_storage(target: Target, *, workers: int, seconds: float, ssd: str | os.PathLike | None = None) -> StorageReport:
    """All storage measurements of ``target`` within about ``seconds``: half the sample read cold
    one at a time (latency), the other half cold ``workers`` at a time (throughput), the first
    half again warm, then large files front to back and copies into RAM and onto ``ssd``; and
    how much other processes read from the same disk meanwhile."""
    notes: list[str] = []
    files = target.files_read()
    watch = DiskWatch(files[0] if files else target.description).start()
    read = target.reader()
    names = [target.name(i) for i in range(target.sample_size)]
    half = -(-target.sample_size // 2)
    first, second = list(range(half)), list(range(half, target.sample_size))
    evict(files)
    cached = sum(resident(f) for f in files)
    if cached:
        notes.append(f"the page cache kept {cached / 1e6:.1f} MB of the sampled files after eviction (the file "
                     "system ignores posix_fadvise DONTNEED): cold figures are warm ones")
    cold = timed_reads(names, read, first, 1, seconds * 0.35)
    cold_parallel = timed_reads(names, read, second, max(1, workers), seconds * 0.2) if second else None
    warm = timed_reads(names, read, cold.items, 1, seconds * 0.1)
    counted = [stats for stats in (cold, cold_parallel) if stats is not None]
    mean_bytes = sum(s.nbytes for s in counted) / max(1, sum(s.reads for s in counted))
    big = _large_files(target)
    sequential = sequential_rate(big, seconds * 0.15) if big else None
    if not big:
        notes.append("large sequential reads not measured: no sampled file is 4 MB or more (pack the data set, "
                     "then run stoker doctor on the packed folder)")
    copied = big or (target.paths[half:] if target.loose else [])
    ram = _copy_rate(copied, Path("/dev/shm"), seconds * 0.1, notes) if copied else None
    ssd_rate = _copy_rate(copied, Path(ssd), seconds * 0.1, notes) if ssd and copied else None
    contention = watch.stop()
    if contention.shared:
        notes.append(contention.describe())
    return StorageReport(cold, warm, cold_parallel, not cached, cached, sequential, ram, ssd_rate, mean_bytes, notes,
                         contention)


def resident(path: str) -> int:
    """Bytes of ``path`` in the page cache (0 where it cannot be read)."""
    try:
        return resident_bytes(path)
    except OSError:
        return 0


def _large_files(target: Target) -> list[str]:
    """Files to read front to back, largest first: the shards, or sampled loose files of 4 MB or more."""
    sized = []
    for path in (target.paths if target.loose else target.shard_files):
        try:
            sized.append((os.path.getsize(path), path))
        except OSError:  # unreadable: the random-read probes report it
            continue
    return [path for size, path in sorted(sized, reverse=True) if size >= 4 << 20 or not target.loose]


def sequential_rate(files: list[str], seconds: float) -> float:
    """MB/s of reading ``files`` front to back in 1 MiB pieces, each evicted just before it is
    read (so only the files read lose their cache), for about ``seconds``."""
    nbytes, start = 0, time.perf_counter()
    deadline = start + seconds
    for path in files:
        evict([path])
        with open(path, "rb", buffering=0) as f:
            while time.perf_counter() < deadline and (chunk := f.read(_CHUNK)):
                nbytes += len(chunk)
        if time.perf_counter() >= deadline:
            break
    return nbytes / (time.perf_counter() - start) / 1e6


def _copy_rate(files: list[str], into: Path, seconds: float, notes: list[str]) -> float | None:
    """MB/s of copying cold ``files`` (whole, or their start when time or room runs out) into a
    temporary folder under ``into``, removed afterwards: how fast data can be staged there. At most
    256 MB or a quarter of the free space there is copied; unreadable files are skipped."""
    if not into.is_dir():
        notes.append(f"{into} is not a folder here: the copy into it was not measured")
        return None
    room = min(_COPY_CAP, shutil.disk_usage(into).free // 4)
    try:
        with tempfile.TemporaryDirectory(prefix="stoker-doctor-", dir=into) as scratch:
            nbytes, start = 0, time.perf_counter()
            deadline = start + seconds
            for k, path in enumerate(files):
                if time.perf_counter() >= deadline or nbytes >= room:
                    break
                evict([path])
                try:
                    src = open(path, "rb", buffering=0)
                except OSError:  # the random-read probes report it
                    continue
                with src, open(Path(scratch) / str(k), "wb") as dst:
                    while time.perf_counter() < deadline and nbytes < room and (chunk := src.read(_CHUNK)):
                        nbytes += dst.write(chunk)
            return nbytes / (time.perf_counter() - start) / 1e6 if nbytes else None
    except OSError as e:
        notes.append(f"copy into {into} failed: {e}")
        return None
