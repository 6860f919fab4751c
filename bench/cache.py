"""The node cache (``cache_dir=``) against the reads it replaces, in one run per part.

``hdd`` (run it under ../shared/hdd-profile: cold cache, 150 IOPS, 150 MiB/s):
  - the disk's sequential bandwidth (one shard read cold with 8 MiB reads);
  - stoker.Loader epochs 1-3 with ``cache_dir=/dev/shm/...`` (whole data set fits), against the
    same Loader with every shard already in the page cache (the warm-cache rate);
  - a cache limit of half the data set: raw sample bytes delivered per second through a
    QuasiRandomSampler and a 2-worker DataLoader, against the disk's sequential bandwidth.
``s3``: the same data on a moto S3 server behind a proxy adding 50 ms to every request:
  time to the first batch and img/s of stoker.Loader with ``cache_dir=/dev/shm/...``, against
  the same Loader over the shards on local disk (page cache warm).

    ../shared/hdd-profile -- .venv/bin/python bench/cache.py hdd
    .venv/bin/python bench/cache.py s3
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

import torch.utils.data
from _latency_proxy import LatencyProxy

import stoker
from stoker.format import read_manifest
from stoker.storage import evict

from _common import header, prepared_photos

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.s3server import S3Server  # noqa: E402 -- the tests' moto server, started the same way

SHARD_BYTES = 32 << 20  # ~9 shards of the 4,000 photos: enough to cache half of them


def packed_data(data: Path, count: int) -> Path:
    """The sample photos packed into 32 MiB shards (made once)."""
    photos, _ = prepared_photos(data, count)
    shards = data / "shards-32m"
    if not (shards / "stoker.json").is_file():
        stoker.pack(photos, shards, shard_bytes=SHARD_BYTES, workers=os.cpu_count() or 1)
    return shards


def evict_all(shards: Path) -> None:
    for path in shards.iterdir():
        evict(path)


def warm_all(shards: Path) -> None:
    for path in shards.iterdir():
        path.read_bytes()


def sequential_mb_s(path: Path) -> float:
    """MB/s of one cold read of ``path`` in 8 MiB pieces."""
    evict(path)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return path.stat().st_size / 1e6 / (time.perf_counter() - start)


def loader_epochs(dataset: stoker.ShardDataset, epochs: int, batch: int = 256) -> tuple[list[float], float]:
    """img/s of each epoch of one stoker.Loader, and seconds to its first batch."""
    loader = stoker.Loader(dataset, batch, seed=0)
    rates, first_batch = [], float("nan")
    for epoch in range(epochs):
        start = time.perf_counter()
        n = 0
        for images, _ in loader:
            if epoch == 0 and n == 0:
                first_batch = time.perf_counter() - start
            n += len(images)
        rates.append(n / (time.perf_counter() - start))
    return rates, first_batch


def raw_epoch_mb_s(dataset: stoker.ShardDataset) -> float:
    """MB/s of stored image bytes delivered by a QuasiRandomSampler and 2 DataLoader workers."""
    sampler = stoker.QuasiRandomSampler(dataset, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2,
                                         collate_fn=lambda batch: sum(len(data) for data, _ in batch))
    start = time.perf_counter()
    total = sum(loader)
    return total / 1e6 / (time.perf_counter() - start)


def fresh_cache(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root


def hdd(shards: Path, repeat: int) -> None:
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    total = sum(entry.bytes for entry in read_manifest(shards).shards)
    names = sorted(shards.glob("*.tar"))
    seq, cached, warm, half, plain = [], [], [], [], []
    try:
        for _ in range(repeat):
            seq.append(statistics.median(sequential_mb_s(p) for p in names[:3]))
            evict_all(shards)
            rates, _ = loader_epochs(stoker.ShardDataset(shards, cache_dir=fresh_cache(cache)), 3)
            cached.append(rates)
            warm_all(shards)
            warm.append(statistics.median(loader_epochs(stoker.ShardDataset(shards), 2)[0]))
            evict_all(shards)
            half.append(raw_epoch_mb_s(stoker.ShardDataset(shards, decode="raw", cache_dir=fresh_cache(cache),
                                                           cache_limit=total // 2)))
            evict_all(shards)
            plain.append(raw_epoch_mb_s(stoker.ShardDataset(shards, decode="raw")))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    med = statistics.median
    print(f"data: {len(names)} shards, {total / 1e6:.0f} MB; medians of {repeat} rounds")
    print(f"disk sequential read: {med(seq):.0f} MB/s")
    for epoch in range(3):
        print(f"Loader, cache_dir=/dev/shm, epoch {epoch + 1}: {med(r[epoch] for r in cached):,.0f} img/s")
    print(f"Loader, page cache warm (no cache_dir): {med(warm):,.0f} img/s")
    print(f"ratio epoch 2 / warm: {med(r[1] for r in cached) / med(warm):.2f}  "
          f"epoch 3 / warm: {med(r[2] for r in cached) / med(warm):.2f}")
    print(f"raw bytes, cache_limit = half the data set: {med(half):.0f} MB/s = {med(half) / med(seq):.0%} of sequential")
    print(f"raw bytes, no cache (block read-ahead only): {med(plain):.0f} MB/s = {med(plain) / med(seq):.0%} of sequential")


def s3(shards: Path, repeat: int, delay: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-s3-"))
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-", dir="/dev/shm"))
    os.environ["XDG_CACHE_HOME"] = str(work / "xdg")
    server = S3Server(work / "requests.log")
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        proxy = LatencyProxy(server.port, delay)
        options = {**server.options, "client_kwargs": {**server.options["client_kwargs"], "endpoint_url": proxy.url}}
        remote, local, firsts = [], [], []
        for _ in range(repeat):
            warm_all(shards)
            local.append(loader_epochs(stoker.ShardDataset(shards), 2)[0])
            start = time.perf_counter()
            dataset = stoker.ShardDataset("s3://data/ds", storage_options=options, cache_dir=fresh_cache(cache))
            opened = time.perf_counter() - start
            rates, first = loader_epochs(dataset, 2)
            remote.append(rates)
            firsts.append((opened, first))
    finally:
        server.stop()
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    print(f"object store: moto on localhost behind a proxy adding {delay * 1e3:.0f} ms per request; "
          f"medians of {repeat} rounds")
    print(f"open the data set (manifest + indexes): {med(o for o, _ in firsts):.2f} s; "
          f"then first batch: {med(f for _, f in firsts):.2f} s")
    for epoch in range(2):
        print(f"Loader, s3 + cache_dir=/dev/shm, epoch {epoch + 1}: {med(r[epoch] for r in remote):,.0f} img/s   "
              f"local disk, page cache warm: {med(r[epoch] for r in local):,.0f} img/s   "
              f"ratio {med(r[epoch] for r in remote) / med(r[epoch] for r in local):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["hdd", "s3"])
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    args = parser.parse_args()
    header(f"node cache, part {args.part}")
    shards = packed_data(args.data, args.count)
    if args.part == "hdd":
        hdd(shards, args.repeat)
    else:
        s3(shards, args.repeat, args.delay_ms / 1e3)


if __name__ == "__main__":
    main()
