"""Pack rate and size, byte-exact against ``--restart-rows``, for ``stoker bench loader --restart-rows``.

Each pack runs in a fresh process (as a user's ``stoker pack`` would), into a new folder, with the
photos evicted from the page cache first when the benchmark is cold; the modes alternate (A, B, A,
B, ...) so that drift hits both alike. The process times ``pack()`` itself: Python's start-up is
not counted, the worker pool's is. Shards are 32 MiB here: a pack runs one worker process per shard,
so with the default 256 MiB a few thousand photos would keep one worker busy and the other idle,
unlike any data set of more than a few shards.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from stoker.bench.measure import measure
from stoker.storage import evict

_PACK = """
import json, sys, time
from stoker.pack import pack
start = time.perf_counter()
result = pack(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]), restart_rows=sys.argv[4] == "1",
              shard_bytes=32 << 20, progress=False)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "images": result.num_samples, "bytes": result.total_bytes}))
"""


@dataclass
class PackRow:
    """One mode's runs: images per second and the data set's bytes (tar shards and indexes)."""

    restart_rows: bool
    rates: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "stoker pack --restart-rows" if self.restart_rows else "stoker pack (byte-exact)"


def measure_packs(photos: Path, work: Path, *, workers: int, repeat: int = 3, cold: bool = False) -> list[PackRow]:
    """Pack ``photos`` both ways ``repeat`` times, interleaved; the output goes under ``work`` and is removed."""
    rows = [PackRow(False), PackRow(True)]
    sources = [p for p in photos.rglob("*") if p.is_file()]
    for _ in range(repeat):
        for row in rows:
            out = work / ("restart" if row.restart_rows else "exact")
            shutil.rmtree(out, ignore_errors=True)
            if cold:
                evict(sources)
            report = measure([sys.executable, "-c", _PACK, str(photos), str(out), str(workers),
                              "1" if row.restart_rows else "0"]).reports[-1]
            row.rates.append(report["images"] / report["seconds"])
            row.sizes.append(sum(p.stat().st_size for p in out.iterdir() if p.suffix in (".tar", ".idx")))
            shutil.rmtree(out)
    return rows


def pack_report(rows: list[PackRow], workers: int) -> str:
    """The pack table and the ratios the targets are stated in (rate >= 50%, size within +2%)."""
    lines = [f"{f'pack, {workers} workers':52} {'img/s':>9} {'MB':>9}"]
    for row in rows:
        lines.append(f"{row.name:52} {statistics.median(row.rates):9.0f} {statistics.median(row.sizes) / 1e6:9.1f}")
    exact, restart = rows
    rate = statistics.median(restart.rates) / statistics.median(exact.rates)
    size = statistics.median(restart.sizes) / statistics.median(exact.sizes) - 1
    lines.append(f"pack --restart-rows / byte-exact: rate {rate:.0%} (target >= 50%), size {size:+.1%} (target <= +2%)")
    return "\n".join(lines)
