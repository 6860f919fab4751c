"""``make demo``: generate sample photos, ask ``stoker doctor`` where input time goes, pack them, read
them back through a DataLoader with 2 workers, and compare loose files with shards (cold page cache
for both)."""

from __future__ import annotations

import argparse
from pathlib import Path

from torch.utils.data import DataLoader

import stoker
from stoker.data.folder import FolderDataset
from stoker.doctor import time_loader
from stoker.format.verify import verify_dataset
from stoker.sample_data import make_sample_photos
from stoker.storage import evict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-data"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    photos, shards = args.out / "photos", args.out / "shards"

    print(f"1. sample photos: {args.count} JPEGs in {photos}")
    make_sample_photos(photos, count=args.count, num_classes=10, progress=True)
    sizes = [p.stat().st_size for p in photos.rglob("*.jpg")]
    print(f"   mean {sum(sizes) / len(sizes) / 1e3:.0f} KB, {sum(sizes) / 1e6:.0f} MB in all")

    print(f"   stoker doctor {photos} --quick --step-time 0.05 --batch-size 64:")
    report = stoker.doctor(photos, step_time=0.05, batch_size=64, quick=True)
    print("   " + report.to_text().replace("\n", "\n   "))

    print(f"2. stoker pack {photos} {shards} --shard-size 32MB")
    result = stoker.pack(photos, shards, shard_bytes=32 << 20)
    print(f"   {result.num_samples} samples in {result.num_shards} shards "
          f"({'reused from an earlier run' if result.reused_shards == result.num_shards else f'{result.seconds:.1f} s'})")
    problems = verify_dataset(shards)
    print(f"   stoker verify: {'OK' if not problems else problems}")

    print(f"3. read back through torch DataLoader, {args.workers} workers, batches of 64, cold page cache:")
    loose = FolderDataset(photos, decode="raw")
    packed = stoker.ShardDataset(shards, decode="raw")
    runs = [
        ("loose files, random order, raw bytes", loose, dict(shuffle=True), loose.paths),
        ("shards + QuasiRandomSampler, raw bytes", packed, dict(sampler=stoker.QuasiRandomSampler(packed)),
         [shards / s.name for s in packed.shards.manifest.shards]),
        ("loose files, random order, decoded (tensor)", FolderDataset(photos, decode="tensor"), dict(shuffle=True),
         loose.paths),
        ("shards + QuasiRandomSampler, decoded (tensor)", stoker.ShardDataset(shards, decode="tensor"),
         dict(sampler=stoker.QuasiRandomSampler(packed)), [shards / s.name for s in packed.shards.manifest.shards]),
    ]
    print(f"   {'what':48} {'img/s':>8} {'MB/s':>8}")
    for name, dataset, options, files in runs:
        evict(files)
        loader = DataLoader(dataset, batch_size=64, num_workers=args.workers, collate_fn=_collate, **options)
        rate = time_loader(loader)
        mb = f"{rate.mb_per_second:8.1f}" if name.endswith("raw bytes") else f"{'-':>8}"
        print(f"   {name:48} {rate.per_second:8.0f} {mb}")
    print("   On this machine's fast disk both are quick; on a spinning disk or NFS loose files fall to")
    print("   ~100-200 img/s while shards read sequentially. See BENCHMARKS.md and bench/io.py.")
    image, label = stoker.ShardDataset(shards)[0]
    print(f"4. ShardDataset({str(shards)!r})[0] -> {type(image).__name__} {image.size}, "
          f"label {label} ({stoker.ShardDataset(shards).classes[label]})")


def _collate(batch):
    """Raw bytes stay a list; decoded tensors of different sizes stay a list too (no resize here)."""
    images, labels = zip(*batch)
    return list(images), list(labels)


if __name__ == "__main__":
    main()
