"""stoker.Loader on 1 and 2 threads and in worker processes, in one run, and what that predicts for
16, 32 and 96 cores.

Rows (warm cache, RandomResizedCrop 224 + flip to uint8, batches of 256; A-B-C-A-B-C, medians):
    threads=1            one thread in the loop's process
    threads=2            two threads
    processes=2          two worker processes of one thread each (batches in shared memory)
    processes=1 x 2      one worker process of two threads

The model: a process whose threads each spend c CPU seconds per image, g of them holding the GIL,
makes at most 1/g images per second, and N cores at most N/c; threads-only on N cores then give
    R(N) = min(e * N / c, 1 / g)              (one process)
    R(N) = min(e * N / c, P / g)              (P worker processes)
with c the CPU per image on one thread (1 / its rate), g the CPU the process spends outside the
native calls (bench/gil.py's CPU bound: it holds the GIL at most that long), and e the efficiency
measured on this machine's cores (rate on 2 threads / (2 x rate on 1)). It leaves out what 2 cores
cannot show: memory bandwidth and the last-level cache shared by many cores, and the disk.

    .venv/bin/python bench/scaling.py            # --data bench-data/loader (4,000 sample photos, made once)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import stoker
from stoker.loader import native_chunk

from _common import header, prepared_photos

CONFIGS = {"threads=1": (0, 1), "threads=2": (0, 2), "processes=2": (2, 1), "processes=1 x 2": (1, 2)}


def rate(shards: Path, processes: int, threads: int, batch: int, epochs: int) -> tuple[float, float]:
    """(img/s over ``epochs`` warm epochs, CPU seconds outside decode_chunk per image) for one configuration."""
    loader = stoker.Loader(stoker.ShardDataset(shards), batch, crop=stoker.CropSpec("random_resized", (224, 224)),
                           processes=processes, threads=threads)
    for _ in loader:  # warm: the page cache, the buffers, the workers' imports
        pass
    native = [0.0]
    decode = native_chunk.decode_chunk

    def timed(*args):
        start = time.thread_time()
        try:
            return decode(*args)
        finally:
            native[0] += time.thread_time() - start

    native_chunk.decode_chunk = timed
    try:
        images, start, cpu = 0, time.perf_counter(), time.process_time()
        for _ in range(epochs):
            for _, labels in loader:
                images += len(labels)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        native_chunk.decode_chunk = decode
    return images / elapsed, (cpu - native[0]) / images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    header("stoker.Loader on 1 and 2 threads and in worker processes (RandomResizedCrop 224 + flip, uint8)")
    _, shards = prepared_photos(args.data, args.count)
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    gil: list[float] = []
    for _ in range(args.repeat):
        for name, (processes, threads) in CONFIGS.items():
            measured, outside = rate(shards, processes, threads, args.batch, args.epochs)
            rates[name].append(measured)
            if name == "threads=1":
                gil.append(outside)
            print(f"  {name:16} {measured:7.0f} img/s")
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nmedians of {args.repeat} ({args.epochs} warm epochs each):")
    for name, value in median.items():
        print(f"  {name:16} {value:7.0f} img/s")
    one, two = median["threads=1"], median["threads=2"]
    print(f"  threads=2 / threads=1: {two / one:.2f}x (target >= 1.9x)")
    print(f"  processes=2 / threads=2: {median['processes=2'] / two:.2f}x (target >= 0.95x)")
    print(f"  processes=1 x 2 / threads=2: {median['processes=1 x 2'] / two:.2f}x")
    c, g, e = 1 / one, statistics.median(gil), two / (2 * one)
    print(f"\nmodel: c = {c * 1e6:.0f} us CPU per image on one thread, g <= {g * 1e6:.1f} us outside the native "
          f"calls (the GIL held at most that), e = {e:.2f} on 2 cores")
    for cores in (16, 32, 96):
        threads_only = min(e * cores / c, 1 / g)
        processes = max(1, cores // 8)
        print(f"  {cores:3} cores: threads only {threads_only:9,.0f} img/s; {processes} processes "
              f"{min(e * cores / c, processes / g):9,.0f} img/s; compute bound {e * cores / c:9,.0f}")


if __name__ == "__main__":
    main()
