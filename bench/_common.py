"""What every benchmark prints and how it repeats: machine state, disk profile, medians of A-B-A runs."""

from __future__ import annotations

import os
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import stoker
from stoker.bench.loader import prepare_data


def header(title: str) -> None:
    """Print the command, the machine and whether reads are throttled, as every result must say."""
    print(f"# {title}")
    print(f"command: {' '.join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])}")
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"disk profile: {disk_profile()}")
    if load[0] > 0.5:
        print("warning: the machine is not idle; figures may be noisy")


def disk_profile() -> str:
    """'HDD profile (...)' when this process runs inside ../shared/hdd-profile's blkio group, else 'none'."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(",") and "hdd-profile" in path:
            group = Path("/sys/fs/cgroup/blkio") / path.lstrip("/")
            iops = (group / "blkio.throttle.read_iops_device").read_text().split()
            bps = (group / "blkio.throttle.read_bps_device").read_text().split()
            return f"HDD profile: {iops[-1]} IOPS, {int(bps[-1]) >> 20} MiB/s read limits on {iops[0]}"
    return "none (fast virtual disk; run under ../shared/hdd-profile -- ... to emulate a spinning disk)"


def prepared_photos(data: Path, count: int) -> tuple[Path, Path]:
    """Sample photos and their packed shards under ``data``, made once and reused."""
    return prepare_data(data, count)


def packed_photos(data: Path, count: int, shard_bytes: int) -> Path:
    """The sample photos packed into shards of about ``shard_bytes`` (made once, beside the others)."""
    photos, _ = prepared_photos(data, count)
    shards = data / f"shards-{shard_bytes >> 20}m"
    if not (shards / "stoker.json").is_file():
        stoker.pack(photos, shards, shard_bytes=shard_bytes, workers=os.cpu_count() or 1)
    return shards


def median_runs(runs: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Call each run ``repeat`` times, interleaved (A, B, C, A, B, C, ...), so drift hits all alike."""
    results: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            results[name].append(run())
    return results


def med(values: list[float]) -> float:
    return statistics.median(values)
