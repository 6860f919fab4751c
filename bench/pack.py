"""Pack speed: `stoker pack` (no re-encoding) against a plain copy of the same files to the same disk.

Both start from a cold page cache for the source files, and both end with the data on disk
(`cp -r` then `sync`; stoker fsyncs each shard). Target (issue 2): pack >= 50% of the copy's rate.

    .venv/bin/python bench/pack.py --prepare-only
    ../shared/hdd-profile -- .venv/bin/python bench/pack.py      # a spinning disk
    .venv/bin/python bench/pack.py                                # this machine's fast disk
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from pathlib import Path

from stoker.pack import pack
from stoker.sample_data import make_sample_photos
from stoker.storage import evict

from _common import header, med, median_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/pack"))
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prepare-only", action="store_true")
    args = parser.parse_args()
    photos = make_sample_photos(args.data / "photos", count=args.photos, num_classes=100, progress=True)
    if args.prepare_only:
        return
    header("bench/pack.py: stoker pack vs plain copy, cold source cache")
    files = sorted(p for p in photos.rglob("*.jpg"))
    total = sum(p.stat().st_size for p in files)
    out = args.data / "out"

    def copy(sync: bool) -> float:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync", "-f", str(args.data)], check=True)
        evict(files)
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(photos), str(out)], check=True)
        if sync:
            subprocess.run(["sync", "-f", str(out)], check=True)
        return total / (time.perf_counter() - start)

    def pack_run() -> float:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync", "-f", str(args.data)], check=True)
        evict(files)
        start = time.perf_counter()
        pack(photos, out, workers=args.workers, progress=False)
        return total / (time.perf_counter() - start)

    results = median_runs({"copy": lambda: copy(True), "pack": pack_run, "copy-nosync": lambda: copy(False)},
                          args.repeat)
    shutil.rmtree(out, ignore_errors=True)
    copy_rate, pack_rate = med(results["copy"]), med(results["pack"])
    print(f"data: {len(files)} photos, {total / 1e6:.0f} MB; pack with {args.workers} workers; medians of {args.repeat} "
          f"(MB/s runs: "
          + "; ".join(f"{k} {', '.join(f'{v / 1e6:.1f}' for v in vals)}" for k, vals in results.items()) + ")")
    print(f"{'method':36} {'MB/s':>8} {'files/s':>8}")
    print(f"{'cp -r + sync (baseline)':36} {copy_rate / 1e6:8.1f} {copy_rate / total * len(files):8.0f}")
    print(f"{'stoker pack':36} {pack_rate / 1e6:8.1f} {pack_rate / total * len(files):8.0f}")
    nosync = med(results["copy-nosync"])
    print(f"{'cp -r, no sync (data left in cache)':36} {nosync / 1e6:8.1f} {nosync / total * len(files):8.0f}")
    print(f"pack / copy: {pack_rate / copy_rate:.0%} (target >= 50%); pack / copy without sync: {pack_rate / nosync:.0%}")


if __name__ == "__main__":
    main()
