"""stoker.Loader reading shards from an object store at 20 ms round trip and 1 Gbit/s (moto on
loopback behind stoker.bench.link's ShapedLink, in a process of its own), against the same Loader
over the same shards on local disk (page cache warm) and plain s3fs reads of the shards, one run.

Reported: time to the first batch of 256 from the Loader's iteration start (the data set already
opened: manifest and indexes fetched, timed apart), the warm rate (img/s after the first batch),
the link's rate in img/s (its bytes/s over the mean stored photo), and s3fs's own rate:
``cat_ranges`` over every shard in 8 MiB ranges (its concurrency) and one ``cat_file`` per shard.

    .venv/bin/python bench/remote.py [--count 4000] [--repeat 3] [--delay-ms 20] [--rate-mbit 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import s3fs

import stoker
from stoker.bench.link_process import start_link_process
from stoker.format import read_manifest

from _common import header, packed_photos

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.s3server import S3Server  # noqa: E402 -- the tests' moto server, started the same way

BATCH = 256


# moto copies a whole object for every ranged GET, under a lock of the object's (moto/s3/models.py,
# FakeKey.value): over one 150 MB shard a 2 MiB range cost ~150 MB of copying and the ranges of a shard
# queued behind each other (210 img/s here, against 790 with these shards). S3 does neither.
SHARD_BYTES = 16 << 20


def loader_pass(dataset: stoker.ShardDataset) -> tuple[float, float]:
    """One pass of a fresh Loader (batches of 256): seconds to the first batch, img/s after it."""
    loader = stoker.Loader(dataset, BATCH, seed=0)
    start = time.perf_counter()
    first, n = float("nan"), 0
    for images, _ in loader:
        if n == 0:
            first = time.perf_counter() - start
        n += len(images)
    return first, (n - BATCH) / (time.perf_counter() - start - first)


def s3fs_mb_s(fs: s3fs.S3FileSystem, paths: list[str], sizes: list[int], whole: bool) -> float:
    """MB/s of plain s3fs reads of every shard: one cat_file each, or cat_ranges in 8 MiB ranges."""
    start = time.perf_counter()
    if whole:
        total = sum(len(fs.cat_file(path)) for path in paths)
    else:
        ranges = [(p, a, min(a + (8 << 20), size)) for p, size in zip(paths, sizes, strict=True)
                  for a in range(0, size, 8 << 20)]
        total = sum(len(b) for b in fs.cat_ranges(*map(list, zip(*ranges, strict=True))))
    return total / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    args = parser.parse_args()
    header(f"object store at {args.delay_ms:.0f} ms, {args.rate_mbit:.0f} Mbit/s")
    shards = packed_photos(args.data, args.count, SHARD_BYTES)
    manifest = read_manifest(shards)
    photo_bytes = sum(e.bytes for e in manifest.shards) / manifest.num_samples
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-remote-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "xdg")
    server = S3Server(work / "requests.log")
    link = start_link_process(server.port, delay=args.delay_ms / 1e3, rate=args.rate_mbit * 1e6 / 8)
    runs: dict[str, list[float]] = {k: [] for k in ("open", "first", "warm", "local_first", "local_warm", "ranges",
                                                    "whole")}
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        options = {**server.options, "client_kwargs": {**server.options["client_kwargs"], "endpoint_url": link.url}}
        fs = s3fs.S3FileSystem(**options)
        paths = [f"data/ds/{e.name}" for e in manifest.shards]
        sizes = [e.bytes for e in manifest.shards]
        for path in shards.iterdir():
            path.read_bytes()  # page cache warm for the local rows
        for _ in range(args.repeat):
            first, warm = loader_pass(stoker.ShardDataset(shards))
            runs["local_first"].append(first)
            runs["local_warm"].append(warm)
            shutil.rmtree(work / "xdg", ignore_errors=True)
            start = time.perf_counter()
            dataset = stoker.ShardDataset("s3://data/ds", storage_options=options)
            runs["open"].append(time.perf_counter() - start)
            first, warm = loader_pass(dataset)
            runs["first"].append(first)
            runs["warm"].append(warm)
            runs["ranges"].append(s3fs_mb_s(fs, paths, sizes, whole=False))
            runs["whole"].append(s3fs_mb_s(fs, paths, sizes, whole=True))
        counts = link.counts()
    finally:
        link.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    link_img_s = args.rate_mbit * 1e6 / 8 / photo_bytes
    bound = min(link_img_s, med(runs["local_warm"]))
    print(f"data: {len(manifest.shards)} shards, {manifest.num_samples} photos of {photo_bytes / 1e3:.0f} KB mean; "
          f"medians of {args.repeat} rounds; link: {counts['requests']} requests, {counts['connections']} connections")
    print(f"open the data set (manifest + indexes): {med(runs['open']):.2f} s")
    print(f"Loader first batch of {BATCH}: s3 {med(runs['first']):.2f} s   local disk {med(runs['local_first']):.2f} s")
    print(f"Loader warm rate: s3 {med(runs['warm']):,.0f} img/s   local disk {med(runs['local_warm']):,.0f} img/s   "
          f"link {link_img_s:,.0f} img/s   s3 / min(link, local) = {med(runs['warm']) / bound:.0%}")
    print(f"plain s3fs: cat_ranges (8 MiB ranges) {med(runs['ranges']):.0f} MB/s = "
          f"{med(runs['ranges']) * 1e6 / photo_bytes:,.0f} img/s; cat_file per shard {med(runs['whole']):.0f} MB/s = "
          f"{med(runs['whole']) * 1e6 / photo_bytes:,.0f} img/s")


if __name__ == "__main__":
    main()
