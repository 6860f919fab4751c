"""Object-store probes: how a data set at an fsspec URL (``s3://``, ``gs://``, ``https://``) answers,
and the stager's settings that follow.

    first byte    ranged 1-byte GETs one at a time: the round trip every request pays (p50, p99)
    one request   large ranged GETs one at a time: what one stream carries (MB/s)
    in flight     reads of the proposed size with 1, 2, 4, 8, ... requests in flight, until the
                  throughput grows under 10% from one level to the next: what fills the link

Every probe is bounded by a number of requests, a number of bytes and seconds (``Bounds``), so the
doctor never downloads a data set to examine it. Reads go straight to fsspec (no retries: a slow
or failed request is a measurement), each a range of a shard of a packed data set, or a whole
file of a folder of loose images.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import fsspec
import numpy as np

from stoker.doctor.numbers import rounded
from stoker.doctor.target import Target
from stoker.errors import StokerError

MIB = 1 << 20
# Request sizes a proposal picks from (powers of two), and a request's share of time spent
# streaming rather than waiting for its first byte that the proposed size reaches.
MIN_READ, MAX_READ, STREAMING_SHARE = 1 * MIB, 64 * MIB, 0.8
# A level of reads in flight counts as growth when it moves this much more than the best before it;
# the proposal is the fewest in flight within FILLED of the best measured.
GROWTH, FILLED = 1.10, 0.9
MAX_IN_FLIGHT = 64
# First-byte requests made whatever the seconds (a busy machine still gets a median).
_AT_LEAST = 3


@dataclass(frozen=True)
class Bounds:
    """What the object-store probes may spend: requests for first bytes, requests for one stream,
    bytes in all, and about ``seconds`` in all (each phase still makes its first few requests,
    and the reads in flight get at least a second, however busy the machine)."""

    first_byte_requests: int
    stream_requests: int
    max_bytes: int
    seconds: float

    def to_dict(self) -> dict:
        return {"first_byte_requests": self.first_byte_requests, "stream_requests": self.stream_requests,
                "max_bytes": self.max_bytes, "seconds": self.seconds}

    def in_words(self) -> str:
        return (f"at most {self.first_byte_requests} + {self.stream_requests} requests one at a time, "
                f"{self.max_bytes / 1e6:,.0f} MB and {self.seconds:.0f} s in all")


@dataclass(frozen=True)
class Level:
    """``requests`` reads of ``nbytes`` in all with ``in_flight`` at a time, in ``seconds``."""

    in_flight: int
    requests: int
    nbytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {"in_flight": self.in_flight, "requests": self.requests, "bytes": self.nbytes,
                "seconds": round(self.seconds, 4), "mb_per_s": round(self.mb_per_s, 2)}


@dataclass
class RemoteReport:
    """What the object store did: each first byte's wait (ms), each large request (bytes, seconds),
    the size of each read in flight and every level measured, why the levels stopped (``stop``:
    settled, most, bytes or seconds; see :func:`_levels`); ``reads_in_flight`` and
    ``read_bytes`` are the proposal, ``stage`` the node cache proposed for a packed data set
    (set by the run, which knows the data set's size and the RAM; see :func:`propose_cache`)."""

    url: str
    packed: bool
    bounds: Bounds
    first_byte_ms: np.ndarray
    streams: list[tuple[int, float]]
    read_bytes: int
    levels: list[Level]
    mean_item_bytes: float
    seconds: float
    bytes_read: int
    stop: str
    stage: dict | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def first_byte_p50_ms(self) -> float:
        return float(np.median(self.first_byte_ms)) if len(self.first_byte_ms) else math.nan

    @property
    def one_request_mb_per_s(self) -> float:
        """Bytes over seconds of one large request at a time, median over the requests (first byte included)."""
        return float(np.median([n / s / 1e6 for n, s in self.streams if s > 0])) if self.streams else 0.0

    @property
    def best(self) -> Level | None:
        return max(self.levels, key=lambda level: level.mb_per_s) if self.levels else None

    @property
    def reads_in_flight(self) -> int:
        """The fewest reads in flight that moved at least ``FILLED`` of the best level's MB/s."""
        best = self.best
        if best is None:
            return 1
        return min(level.in_flight for level in self.levels if level.mb_per_s >= FILLED * best.mb_per_s)

    @property
    def expected_mb_per_s(self) -> float:
        """What the proposed reads in flight moved (MB/s)."""
        return next((level.mb_per_s for level in self.levels if level.in_flight == self.reads_in_flight), 0.0)

    def images_per_s(self, mb_per_s: float) -> float:
        """``mb_per_s`` in items of the mean size."""
        return mb_per_s * 1e6 / self.mean_item_bytes if self.mean_item_bytes else 0.0

    def to_dict(self) -> dict:
        """The report's ``object_store`` section."""
        lat = self.first_byte_ms
        pct = np.percentile(lat, [50, 99]) if len(lat) else np.full(2, math.nan)
        return {"url": self.url, "packed": self.packed, "bounds": self.bounds.to_dict(),
                "first_byte_ms": {"requests": len(lat), "p50": rounded(float(pct[0]), 3), "p99": rounded(float(pct[1]), 3),
                                  "max": rounded(float(lat.max()) if len(lat) else None, 3)},
                "one_request": {"requests": len(self.streams), "bytes": int(sum(n for n, _ in self.streams)),
                                "mb_per_s": round(self.one_request_mb_per_s, 2)},
                "levels": [level.to_dict() for level in self.levels],
                "proposed": {"reads_in_flight": self.reads_in_flight, "read_bytes": self.read_bytes,
                             "stage": self.stage, "expected_mb_per_s": round(self.expected_mb_per_s, 2),
                             "expected_images_per_s": round(self.images_per_s(self.expected_mb_per_s), 1)},
                "stopped": self.stop, "mean_item_bytes": round(self.mean_item_bytes, 1), "bytes_read": self.bytes_read,
                "seconds": round(self.seconds, 3),
                "failures": [{"item": name, "reason": reason} for name, reason in self.failures], "notes": self.notes}


def probe_remote(target: Target, bounds: Bounds) -> RemoteReport:
    """Measure the object store holding ``target`` (a packed data set or loose files at a URL)
    within ``bounds``: first bytes, one large request at a time, then reads in flight."""
    fs, _ = fsspec.core.url_to_fs(target.description, **(target.storage_options or {}))
    objects = _objects(target, fs)
    if not objects:
        raise StokerError(f"{target.description}: no object to read")
    packed = target.kind == "packed"
    largest = max(size for _, size in objects)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    probe = _Requests(fs, bounds.max_bytes)
    probe.timed(objects[0][0], 0, 1)  # not counted: opens the connection and signs in
    # Each phase has its share of the seconds, but always makes its first few requests.
    phase = time.perf_counter() + 0.2 * bounds.seconds
    first: list[float] = []
    for k in range(bounds.first_byte_requests):
        if k >= _AT_LEAST and time.perf_counter() > phase:
            break
        if (seconds := probe.timed(*_range(objects, 1, rng))) is not None:
            first.append(seconds * 1000)
    first_ms = np.array(first, dtype=np.float64)
    first_byte = float(np.median(first_ms)) / 1000 if first else 0.0
    stream_size = min(MAX_READ, largest, bounds.max_bytes // (4 * max(1, bounds.stream_requests)))
    phase = time.perf_counter() + 0.2 * bounds.seconds
    streams: list[tuple[int, float]] = []
    for k in range(bounds.stream_requests):
        if (k >= 1 and time.perf_counter() > phase) or not probe.room(stream_size if packed else largest):
            break
        path, start, end = _range(objects, stream_size, rng) if packed else _whole(objects, rng)
        if (seconds := probe.timed(path, start, end)) is not None:
            streams.append((end - start if end is not None and start is not None else probe.size(path), seconds))
    read = read_size(first_byte, _stream_rate(streams, first_byte), largest) if packed else 0
    levels, stop = _levels(probe, objects, read or largest, packed, rng,
                           max(started + bounds.seconds, time.perf_counter() + 1.0))
    report = RemoteReport(target.description, packed, bounds, first_ms, streams,
                          read or int(np.mean([size for _, size in objects])), levels, target.item_bytes(),
                          time.perf_counter() - started, probe.nbytes, stop, failures=probe.failures)
    if stop in ("bytes", "seconds"):
        bound = f"{bounds.max_bytes / 1e6:,.0f} MB" if stop == "bytes" else f"{bounds.seconds:.0f} s"
        report.notes.append(f"the reads in flight stopped at the probes' bound ({bound}) while the throughput still "
                            f"grew at {levels[-1].in_flight if levels else 1} in flight: more in flight may move more")
    return report


def size_words(read_bytes: int) -> str:
    """A read's size as a report says it: ``8 MiB``, ``0.6 MB``, or ``whole files`` (0)."""
    if not read_bytes:
        return "whole files"
    return f"{read_bytes >> 20} MiB" if read_bytes % MIB == 0 else f"{read_bytes / 1e6:,.1f} MB"


def read_size(first_byte: float, stream_mb_per_s: float, largest: int) -> int:
    """The smallest power-of-two request of ``MIN_READ``..``MAX_READ`` bytes that spends
    ``STREAMING_SHARE`` of its time streaming after a first byte of ``first_byte`` seconds at
    ``stream_mb_per_s`` (larger requests: fewer to pay the wait for), at most ``largest``
    (an object's whole size)."""
    wanted = STREAMING_SHARE / (1 - STREAMING_SHARE) * first_byte * stream_mb_per_s * 1e6
    size = MIN_READ
    while size < wanted and size < MAX_READ:
        size *= 2
    return min(size, largest)


class _Requests:
    """Ranged GETs through one fsspec file system, counted, within a byte bound; a failure is
    recorded (the object and the reason), not raised."""

    def __init__(self, fs: fsspec.AbstractFileSystem, max_bytes: int) -> None:
        self.fs, self.max_bytes = fs, max_bytes
        self.nbytes = 0
        self.sizes: dict[str, int] = {}
        self.failures: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more stay within the byte bound."""
        return self.nbytes + nbytes <= self.max_bytes

    def size(self, path: str) -> int:
        """Bytes the last whole read of ``path`` returned."""
        return self.sizes.get(path, 0)

    def timed(self, path: str, start: int | None, end: int | None) -> float | None:
        """Seconds of one request (None: it failed; the failure is kept)."""
        began = time.perf_counter()
        try:
            data = self.fs.cat_file(path, start=start, end=end)
        except (OSError, ValueError) as e:  # s3fs and aiohttp raise OSError subclasses; ValueError for bad ranges
            with self._lock:
                self.failures.append((path, f"{type(e).__name__}: {e}"))
            return None
        seconds = time.perf_counter() - began
        with self._lock:
            self.nbytes += len(data)
            if start is None:
                self.sizes[path] = len(data)
        return seconds


def _objects(target: Target, fs: fsspec.AbstractFileSystem) -> list[tuple[str, int]]:
    """(fsspec path, size) of what the probes read: every shard, or the sampled loose files."""
    if target.kind == "packed":
        root = fs._strip_protocol(target.description)  # noqa: SLF001 -- fsspec's own URL-to-path rule
        return [(f"{root}/{entry.name}", entry.bytes) for entry in target.dataset.shards.manifest.shards if entry.bytes]
    return [(fs._strip_protocol(url), size) for url, size in zip(target.paths, target.sizes) if size]  # noqa: SLF001


def _range(objects: list[tuple[str, int]], size: int, rng: np.random.Generator) -> tuple[str, int, int]:
    """A random range of ``size`` bytes (or the whole object when smaller) of a random object."""
    path, total = objects[int(rng.integers(len(objects)))]
    length = min(size, total)
    start = int(rng.integers(0, total - length + 1))
    return path, start, start + length


def _whole(objects: list[tuple[str, int]], rng: np.random.Generator) -> tuple[str, None, None]:
    """A random object, read whole."""
    return objects[int(rng.integers(len(objects)))][0], None, None


def _stream_rate(streams: list[tuple[int, float]], first_byte: float) -> float:
    """MB/s of one stream once its first byte came (median over the requests)."""
    rates = [n / max(s - first_byte, s / 10) / 1e6 for n, s in streams if s > 0]
    return float(np.median(rates)) if rates else 0.0


def _levels(probe: _Requests, objects: list[tuple[str, int]], each: int, ranged: bool, rng: np.random.Generator,
            deadline: float) -> tuple[list[Level], str]:
    """Reads of ``each`` bytes (``ranged``; else whole objects of at most ``each``) with 1, 2, 4,
    ... in flight, three rounds of each level's count; and why it stopped: ``settled`` (a level
    grew under ``GROWTH`` over the best before it), ``most`` (``MAX_IN_FLIGHT`` measured), or
    ``bytes`` / ``seconds`` (the bound ran out first)."""
    levels: list[Level] = []
    in_flight = 1
    while in_flight <= MAX_IN_FLIGHT:
        if time.perf_counter() > deadline:
            return levels, "seconds"
        requests = max(3, 3 * in_flight)
        if not probe.room(requests * each):
            requests = in_flight  # one round still measures the level
            if not probe.room(requests * each):
                return levels, "bytes"
        ranges = [_range(objects, each, rng) if ranged else _whole(objects, rng) for _ in range(requests)]
        before = probe.nbytes
        began = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            done = sum(t is not None for t in pool.map(lambda r: probe.timed(*r), ranges))
        levels.append(Level(in_flight, done, probe.nbytes - before, time.perf_counter() - began))
        if len(levels) > 1 and levels[-1].mb_per_s < GROWTH * max(level.mb_per_s for level in levels[:-1]):
            return levels, "settled"
        in_flight *= 2
    return levels, "most"


def propose_cache(dataset_bytes: float, available_ram: float, ssd: str | None) -> dict:
    """Where the node cache goes: RAM (``/dev/shm``) when the data set fits in half the available
    RAM, else the local SSD folder given, else RAM with a limit of half of it (the stager then
    keeps whole shards within it, each fetched once per epoch)."""
    if dataset_bytes < 0.5 * available_ram:
        return {"cache_dir": "/dev/shm/stoker", "cache_limit": None, "fits": True}
    if ssd:
        return {"cache_dir": f"{ssd.rstrip('/')}/stoker-cache", "cache_limit": None, "fits": True}
    return {"cache_dir": "/dev/shm/stoker", "cache_limit": int(0.5 * available_ram), "fits": False}


def fetch_sample(target: Target, folder: Path, in_flight: int, seconds: float) -> tuple[Target, list[str]]:
    """The sampled items of ``target`` (at a URL) fetched ``in_flight`` at a time into ``folder``
    for at most about ``seconds``, as a local folder target (the decode, transform and loader
    probes then time the CPU side on local copies), and a note on what was not fetched."""
    folder.mkdir(parents=True, exist_ok=True)
    read = target.reader()
    deadline = time.perf_counter() + seconds
    failures: list[str] = []

    def fetch(k: int) -> str | None:
        if time.perf_counter() > deadline:
            return None
        try:
            data = read(k)
        except (OSError, StokerError) as e:
            failures.append(f"{target.name(k)}: {type(e).__name__}: {e}")
            return None
        path = folder / f"{k:05d}-{PurePosixPath(target.name(k)).name}"
        path.write_bytes(data)
        return str(path)

    with ThreadPoolExecutor(max(1, in_flight)) as pool:
        paths = [p for p in pool.map(fetch, range(target.sample_size)) if p is not None]
    if not paths:
        raise StokerError(f"{target.description}: none of the {target.sample_size} sampled items could be fetched"
                          + (f"; first: {failures[0]}" if failures else f" in {seconds:.0f} s"))
    notes = [f"the decode, transform and loader rows ran on {len(paths)} sampled items fetched into a local folder "
             f"({in_flight} at a time), warm: the object store is measured apart"]
    if len(paths) < target.sample_size:
        notes.append(f"{len(paths)} of the {target.sample_size} sampled items were fetched within about {seconds:.0f} s"
                     + (f"; {len(failures)} failed, first: {failures[0]}" if failures else ""))
    local = Target("folder", str(folder), target.num_samples, target.estimated, paths=paths,
                   sizes=[os.path.getsize(p) for p in paths])
    return local, notes
