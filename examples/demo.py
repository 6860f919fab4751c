"""``make demo``: the whole path on sample photos. Generate them, ask ``stoker doctor`` where input
time goes, pack them, then feed the same torchvision training pipeline to a training loop (a model
that sleeps for its step time) through a DataLoader and through stoker.Loader, side by side:
images/s and the share of time the loop waited for data. Needs torchvision (make demo runs it in
.venv-tv)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import stoker
from stoker.format.verify import verify_dataset
from stoker.sample_data import make_sample_photos

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-data"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.05, help="seconds the model 'trains' per batch")
    parser.add_argument("--steps", type=int, default=30, help="training steps timed per loader")
    args = parser.parse_args()
    photos, shards = args.out / "photos", args.out / "shards"
    started = time.perf_counter()

    print(f"1. sample photos: {args.count} JPEGs in {photos}")
    make_sample_photos(photos, count=args.count, num_classes=10, progress=True)
    sizes = [p.stat().st_size for p in photos.rglob("*.jpg")]
    print(f"   mean {sum(sizes) / len(sizes) / 1e3:.0f} KB, {sum(sizes) / 1e6:.0f} MB in all")

    print(f"2. stoker doctor {photos} --quick --step-time {args.step_time} --batch-size {args.batch}:")
    report = stoker.doctor(photos, step_time=args.step_time, batch_size=args.batch, quick=True)
    print("   " + report.to_text().replace("\n", "\n   "))

    print(f"3. stoker pack {photos} {shards} --shard-size 32MB")
    result = stoker.pack(photos, shards, shard_bytes=32 << 20)
    print(f"   {result.num_samples} samples in {result.num_shards} shards "
          f"({'reused from an earlier run' if result.reused_shards == result.num_shards else f'{result.seconds:.1f} s'})"
          f"; stoker verify: {'OK' if not verify_dataset(shards) else 'problems'}")

    train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                       T.Normalize(MEAN, STD)])
    print("4. the same torchvision pipeline: " + " + ".join(type(t).__name__ for t in train.transforms))
    print(f"   a model that takes {args.step_time * 1000:.0f} ms per batch of {args.batch} "
          f"(wants {args.batch / args.step_time:.0f} img/s), {args.steps} steps each:")
    before = DataLoader(ImageFolder(photos, transform=train), args.batch, shuffle=True, num_workers=args.workers)
    after = stoker.Loader(stoker.ShardDataset(shards), args.batch, transform=train)  # the two-line change
    print(f"   {'':44} {'img/s':>7} {'data wait':>10}")
    for name, loader in ((f"DataLoader(ImageFolder, {args.workers} workers)", before),
                         ("stoker.Loader(ShardDataset, transform=same)", after)):
        rate, wait = train_for(loader, args.steps, args.step_time)
        print(f"   {name:44} {rate:7.0f} {wait:9.0%}")
    print("   stoker.Loader fuses the crop into the JPEG decode and runs ColorJitter, ToTensor and Normalize")
    print("   batched on its threads; loader.explain() says what runs where:")
    print("   " + after.explain().replace("\n", "\n   "))
    print(f"done in {time.perf_counter() - started:.0f} s")


def train_for(loader, steps: int, step_time: float) -> tuple[float, float]:
    """Images/s and the share of time spent waiting for data, over ``steps`` steps of a sleeping model."""
    images = 0
    watched = stoker.watch(loader, every=10**9)
    start = time.perf_counter()
    for step, (_images, labels) in enumerate(watched):
        time.sleep(step_time)  # the model
        images += len(labels)
        if step + 1 == steps:
            break
    return images / (time.perf_counter() - start), watched.summary().data_wait_fraction


if __name__ == "__main__":
    main()
