"""One stoker.Loader epoch with a disk trace: MB/s read every 0.1 s and when each batch came.

For looking into a cold-cache gap: it shows whether the disk idles while the loader waits (hints
too late or dropped) or the loader is CPU-bound while the disk idles. The libraries are paged in
first on a small data set of their own, so only the data set's reads are cold.

    ../shared/hdd-profile -- .venv/bin/python bench/loader_trace.py bench-data/loader-16k/shards --threads 3
    .venv/bin/python bench/loader_trace.py bench-data/loader-16k/shards --warm     # the same, warm cache
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import stoker
from stoker.sample_data import make_sample_photos
from stoker.storage import evict


def sectors_read(device: int) -> tuple[int, int]:
    """(reads completed, sectors read) so far from ``device`` (/proc/diskstats)."""
    major, minor = str(os.major(device)), str(os.minor(device))
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[0] == major and fields[1] == minor:
            return int(fields[3]), int(fields[5])
    raise SystemExit(f"device {major}:{minor} not in /proc/diskstats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", type=Path)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warm", action="store_true", help="do not evict the data set first")
    args = parser.parse_args()
    warmup = Path("bench-data/trace-warmup")
    make_sample_photos(warmup / "photos", count=300, progress=False)
    stoker.pack(warmup / "photos", warmup / "shards", progress=False)
    for _ in stoker.Loader(stoker.ShardDataset(warmup / "shards"), 64):
        pass
    if not args.warm:
        evict(p for p in args.shards.iterdir() if p.is_file())
    device = args.shards.stat().st_dev
    trace: list[tuple[float, tuple[int, int]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            trace.append((time.perf_counter(), sectors_read(device)))

    trace.append((time.perf_counter(), sectors_read(device)))
    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    loader = stoker.Loader(stoker.ShardDataset(args.shards), args.batch, threads=args.threads, window=args.window)
    batches, images = [], 0
    for _, labels in loader:
        images += len(labels)
        batches.append(time.perf_counter() - start)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    rates = [(s1 - s0) * 512 / (t1 - t0) / 1e6 for (t0, (_, s0)), (t1, (_, s1)) in zip(trace, trace[1:])]
    reads, sectors = (last - first for first, last in zip(trace[0][1], trace[-1][1]))
    print(f"{'warm' if args.warm else 'cold'}: {images / seconds:.0f} img/s ({images} images in {seconds:.2f} s, "
          f"{loader.threads} threads, window {args.window}); {sectors * 512 / 1e6:.0f} MB read in {reads} requests "
          f"of {sectors * 512 / max(1, reads) / 1024:.0f} KB on average")
    print("disk MB/s every 0.1 s:", " ".join(f"{r:.0f}" for r in rates))
    print("batches at (s):", " ".join(f"{t:.2f}" for t in batches))


if __name__ == "__main__":
    main()
