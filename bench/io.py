"""Storage benchmark: loose JPEGs in random order vs stoker shards, cold page cache.

    make demo-style photos (10,000 x ~74 KB) -> pack -> evict page cache before every run:
      loose   torch DataLoader over the loose files, random order, raw bytes
      shards  DataLoader over ShardDataset(decode="raw") with QuasiRandomSampler
      seq     one process reading the shard files front to back (the disk's sequential rate)

Targets (issue 2): shards >= 10x loose in samples/s, and >= 80% of seq in bytes/s, under the
HDD profile. Prepare once, then measure under the profile:

    .venv/bin/python bench/io.py --prepare-only
    ../shared/hdd-profile -- .venv/bin/python bench/io.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader, SubsetRandomSampler

from stoker import QuasiRandomSampler, ShardDataset
from stoker.bench.folder import FolderDataset
from stoker.doctor import time_loader
from stoker.storage import evict

from _common import header, med, median_runs, prepared_photos

CHUNK = 8 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/io"))
    parser.add_argument("--photos", type=int, default=10_000)
    parser.add_argument("--loose-samples", type=int, default=1500, help="random loose files read per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-readahead", action="store_true", help="QuasiRandomSampler(readahead=False)")
    parser.add_argument("--prepare-only", action="store_true")
    args = parser.parse_args()
    photos, shards = prepared_photos(args.data, args.photos)
    if args.prepare_only:
        return
    header("bench/io.py: loose files vs shards, cold cache")

    loose = FolderDataset(photos, decode="raw")
    packed = ShardDataset(shards, decode="raw")
    shard_files = [shards / s.name for s in packed.shards.manifest.shards]
    shard_bytes = sum(s.bytes for s in packed.shards.manifest.shards)
    rng = np.random.default_rng(0)

    def loose_run() -> float:
        picks = rng.choice(len(loose), args.loose_samples, replace=False).tolist()
        evict(loose.paths)
        loader = DataLoader(loose, batch_size=64, sampler=SubsetRandomSampler(picks), num_workers=args.workers,
                            collate_fn=list_collate)
        return time_loader(loader).per_second

    def shards_run() -> float:
        evict(shard_files)
        loader = DataLoader(packed, batch_size=64, sampler=QuasiRandomSampler(packed, seed=int(rng.integers(1 << 30)),
                                                                    readahead=not args.no_readahead),
                            num_workers=args.workers, collate_fn=list_collate)
        rate = time_loader(loader)
        return rate.per_second

    def sequential_run() -> float:
        evict(shard_files)
        start = time.perf_counter()
        for path in shard_files:
            with open(path, "rb", buffering=0) as f:
                while f.read(CHUNK):
                    pass
        return shard_bytes / (time.perf_counter() - start)

    results = median_runs({"loose": loose_run, "shards": shards_run, "seq": sequential_run}, args.repeat)
    per_sample = shard_bytes / len(packed)
    loose_rate, shard_rate, seq_bytes = med(results["loose"]), med(results["shards"]), med(results["seq"])
    print(f"data: {len(packed)} photos, {shard_bytes / 1e6:.0f} MB in {len(shard_files)} shards; "
          f"{args.workers} DataLoader workers; medians of {args.repeat} (runs: "
          + ", ".join(f"{k} {', '.join(f'{v:.0f}' for v in vals)}" for k, vals in results.items()) + ")")
    print(f"{'reader':44} {'samples/s':>10} {'MB/s':>8}")
    print(f"{'loose files, random order (baseline)':44} {loose_rate:10.0f} {loose_rate * per_sample / 1e6:8.1f}")
    print(f"{'stoker shards, QuasiRandomSampler':44} {shard_rate:10.0f} {shard_rate * per_sample / 1e6:8.1f}")
    print(f"{'sequential read of the shard files':44} {seq_bytes / per_sample:10.0f} {seq_bytes / 1e6:8.1f}")
    print(f"shards / loose: {shard_rate / loose_rate:.1f}x (target >= 10x)")
    print(f"shards / sequential: {shard_rate * per_sample / seq_bytes:.0%} (target >= 80%)")


def list_collate(batch):
    images, labels = zip(*batch)
    return list(images), list(labels)


if __name__ == "__main__":
    main()
