"""Whether other processes read the disk, or take the CPU, while the doctor measures.

Jobs that share one disk slow each other, and a storage figure taken beside another job's reads
is lower than the disk gives one job. The kernel counts the sectors read from each block device
(``/proc/diskstats``) and the bytes each process caused to be read from storage
(``/proc/self/io``, all threads, and children once reaped); what the device read beyond this
process's own share was read for someone else. Network and virtual file systems (NFS, FUSE, overlay) have no block device of
their own: there the check says it could not look.

Jobs that share the cores slow each other too: a loader timed while other processes run gets
less CPU than it would alone. The kernel counts each core's busy time (``/proc/stat``) and each
process's CPU time (``/proc/<pid>/stat``); the cores' busy time beyond that of this process and
its children (DataLoader workers) went to someone else. Only the cores this process may run on
are counted (a CPU quota of a cgroup is not seen).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from stoker.counters import TICKS, busy_cpu_seconds, own_read_bytes
from stoker.doctor.numbers import rounded

_SECTOR = 512
# Other processes' reads count as sharing the disk past this many bytes and this share of our own.
SHARED_BYTES = 1 << 20
SHARED_SHARE = 0.1
# Other processes count as sharing the CPU past this many cores' worth of it.
SHARED_CORES = 0.25


@dataclass(frozen=True)
class Contention:
    """Reads from the data's block device during a measurement: ours and everyone else's."""

    device: str | None  # "major:minor", None where the data has no block device
    seconds: float
    own_bytes: int
    other_bytes: int

    @property
    def shared(self) -> bool:
        """Other processes read enough from the device to slow the measurement."""
        return self.device is not None and self.other_bytes > max(SHARED_BYTES, SHARED_SHARE * self.own_bytes)

    def describe(self) -> str:
        """One line for the report."""
        if self.device is None:
            return "other readers of the disk: not measurable (no block device: a network or virtual file system)"
        other = f"{self.other_bytes / 1e6:,.1f} MB ({self.other_bytes / 1e6 / max(self.seconds, 1e-9):,.1f} MB/s)"
        if self.shared:
            return (f"the disk ({self.device}) is shared: other processes read {other} while the probe read "
                    f"{self.own_bytes / 1e6:,.1f} MB; the storage figures are lower than this disk gives one job")
        return f"no other process read much from the disk ({self.device}) during the probe: {other}"

    def to_dict(self) -> dict:
        """The report's ``storage.contention`` entry."""
        return {"device": self.device, "seconds": round(self.seconds, 3), "own_mb": round(self.own_bytes / 1e6, 3),
                "other_mb": round(self.other_bytes / 1e6, 3),
                "other_mb_per_s": rounded(self.other_bytes / 1e6 / self.seconds if self.seconds else None, 3),
                "shared": self.shared}


class DiskWatch:
    """Counts reads from the block device holding ``path`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.device = block_device(path)
        self._started = 0.0
        self._device_bytes = self._own_bytes = 0

    def start(self) -> DiskWatch:
        """Take the first reading."""
        self._started = time.perf_counter()
        self._device_bytes, self._own_bytes = device_read_bytes(self.device), own_read_bytes()
        return self

    def stop(self) -> Contention:
        """Reads since :meth:`start`; the device's reads beyond ours were another process's."""
        seconds = time.perf_counter() - self._started
        if self.device is None:
            return Contention(None, seconds, 0, 0)
        device = device_read_bytes(self.device) - self._device_bytes
        own = own_read_bytes() - self._own_bytes
        return Contention(self.device, seconds, own, max(0, device - own))


def block_device(path: str | os.PathLike) -> str | None:
    """``major:minor`` of the block device holding ``path``, if /proc/diskstats lists it."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    name = f"{os.major(dev)}:{os.minor(dev)}"
    return name if _diskstats_line(name) is not None else None


def device_read_bytes(device: str | None) -> int:
    """Bytes read from ``device`` since boot (sectors read x 512; 0 where unknown)."""
    fields = _diskstats_line(device) if device else None
    return int(fields[5]) * _SECTOR if fields else 0


def _diskstats_line(device: str) -> list[str] | None:
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return None
    major, minor = device.split(":")
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[0] == major and fields[1] == minor:
            return fields
    return None


@dataclass(frozen=True)
class CpuShare:
    """CPU time on this process's cores during a measurement: ours (this process and its
    children) and everyone else's (``None``: not measurable, no /proc/stat)."""

    cores: int
    seconds: float
    own_cpu_s: float
    other_cpu_s: float | None

    @property
    def other_cores(self) -> float | None:
        """The cores' worth of CPU other processes used, on average over the measurement."""
        if self.other_cpu_s is None or self.seconds <= 0:
            return None
        return min(float(self.cores), self.other_cpu_s / self.seconds)

    @property
    def shared(self) -> bool:
        """Other processes took enough CPU to slow the measurement."""
        return (self.other_cores or 0.0) > SHARED_CORES

    def to_dict(self) -> dict:
        """One entry of the report's ``cpu_contention``."""
        return {"cores": self.cores, "seconds": round(self.seconds, 3), "own_cores": rounded(
            self.own_cpu_s / self.seconds if self.seconds else None, 3), "other_cores": rounded(self.other_cores, 3),
            "shared": self.shared}


class CpuWatch:
    """Counts the CPU time of this process's cores between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        self._started = self._busy = self._own = 0.0

    def start(self) -> CpuWatch:
        """Take the first reading."""
        self._started = time.perf_counter()
        self._busy, self._own = busy_cpu_seconds(self.cpus) or 0.0, own_cpu_seconds()
        return self

    def stop(self) -> CpuShare:
        """CPU time since :meth:`start`; the cores' busy time beyond ours was another process's."""
        seconds = time.perf_counter() - self._started
        own = own_cpu_seconds() - self._own
        busy = busy_cpu_seconds(self.cpus)
        other = None if busy is None else max(0.0, busy - self._busy - own)
        return CpuShare(len(self.cpus), seconds, own, other)


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its descendants, live (threads included) or reaped."""
    stats = _process_stats()
    if not stats:  # no /proc: this process and its reaped children only
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        ticks += stats[pid][1] if pid in stats else 0
        todo += children.get(pid, [])
    return ticks / TICKS


def _process_stats() -> dict[int, tuple[int, int]]:
    """Every process's parent and CPU ticks (its own and its reaped children's), from /proc/<pid>/stat."""
    out: dict[int, tuple[int, int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces
        out[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    return out
