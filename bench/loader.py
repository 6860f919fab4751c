"""Loader benchmark: stoker.Loader against torch DataLoader, same images, same output, warm cache.

Output for every reader: 224x224 uint8 batches of 256, RandomResizedCrop + horizontal flip.
    stoker.Loader          threads, decode fused with the crop (simplejpeg + OpenCV)
    DataLoader, loose      ImageFolder-style files, Pillow decode + crop + resize + flip, best of 0..cores workers
    DataLoader, shards     ShardDataset(decode="pil") with the same Pillow transform, best of 1..cores workers
    limit                  cores threads of simplejpeg (fastdct) decoding the same bytes, nothing else
Peers (FFCV, DALI, WebDataset, MosaicML Streaming, LitData, SPDL) are not in this script yet.

    .venv/bin/python bench/loader.py            # 4,000 sample photos, medians of 3
    ../shared/hdd-profile -- .venv/bin/python bench/loader.py --cold --only stoker,loose2
                                                # every run starts from a cold page cache
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader

from stoker import CropSpec, Loader, ShardDataset
from stoker.data.folder import FolderDataset
from stoker.loader.crops import crop_box
from stoker.storage import evict

from _common import header, med, median_runs, prepared_photos


class PillowRandomResizedCrop:
    """What a torchvision RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor pipeline does."""

    def __init__(self, spec: CropSpec) -> None:
        self.spec = spec

    def __call__(self, image: Image.Image) -> torch.Tensor:
        tries = np.random.random((10, 4))
        top, left, ch, cw = crop_box(self.spec, image.height, image.width, tries)
        out_h, out_w = self.spec.size
        image = image.resize((out_w, out_h), Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch))
        if np.random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def rate(loader) -> tuple[float, float]:
    """(images/s over one pass, seconds to the first batch)."""
    start = time.perf_counter()
    first, n = None, 0
    for _, labels in loader:
        first = first if first is not None else time.perf_counter() - start
        n += len(labels)
    return n / (time.perf_counter() - start), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--photos", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="evict the run's files from the page cache before each run")
    parser.add_argument("--only", default="", help="comma-separated run names (stoker, stoker160, limit, looseN, shardsN)")
    args = parser.parse_args()
    photos, shards = prepared_photos(args.data, args.photos)
    header("bench/loader.py: stoker.Loader vs torch DataLoader, warm cache")
    cores = os.cpu_count() or 1
    spec = CropSpec(size=(224, 224))
    small = CropSpec(size=(160, 160))
    transform = PillowRandomResizedCrop(spec)
    dataset = ShardDataset(shards)
    raw = [ShardDataset(shards, decode="raw")[i][0] for i in range(len(dataset))]  # also warms the cache
    loose = FolderDataset(photos, decode="pil", transform=transform)
    packed = ShardDataset(shards, decode="pil", transform=transform)
    first_batch = {}

    shard_files = [shards / s.name for s in dataset.shards.manifest.shards]

    def stoker_run(crop: CropSpec):
        def run() -> float:
            if args.cold:
                evict(shard_files)
            loader = Loader(dataset, args.batch, crop=crop, threads=cores)
            images_per_s, first_batch[crop.size] = rate(loader)
            return images_per_s
        return run

    def dataloader_run(ds, workers):
        def run() -> float:
            if args.cold:
                evict(loose.paths if ds is loose else shard_files)
            return rate(DataLoader(ds, args.batch, shuffle=True, num_workers=workers))[0]
        return run

    def limit_run() -> float:
        def decode(chunk: np.ndarray) -> None:
            buffer = bytearray(1024 * 1024 * 3)  # reused, as the loader does (photos are at most 1024x1024)
            for i in chunk:
                simplejpeg.decode_jpeg(raw[i], fastdct=True, fastupsample=True, buffer=buffer)

        start = time.perf_counter()
        with ThreadPoolExecutor(cores) as pool:
            list(pool.map(decode, np.array_split(np.arange(len(raw)), cores)))
        return len(raw) / (time.perf_counter() - start)

    runs = {"stoker": stoker_run(spec), "stoker160": stoker_run(small), "limit": limit_run}
    runs |= {f"loose{w}": dataloader_run(loose, w) for w in range(cores + 1)}
    runs |= {f"shards{w}": dataloader_run(packed, w) for w in range(1, cores + 1)}
    if args.only:
        runs = {k: v for k, v in runs.items() if k in args.only.split(",")}
    results = median_runs(runs, args.repeat)
    medians = {k: med(v) for k, v in results.items()}
    if args.only:
        print(f"{'cold' if args.cold else 'warm'} page cache; medians of {args.repeat}: "
              + "; ".join(f"{k} {medians[k]:.0f} img/s (runs {', '.join(f'{v:.0f}' for v in results[k])})"
                          for k in results))
        return
    best_loose = max((k for k in medians if k.startswith("loose")), key=medians.get)
    best_shards = max((k for k in medians if k.startswith("shards")), key=medians.get)
    print(f"data: {len(dataset)} photos (mean {np.mean([len(r) for r in raw]) / 1e3:.0f} KB), batch {args.batch}, "
          f"{cores} threads/workers; medians of {args.repeat}")
    print("runs: " + "; ".join(f"{k} {', '.join(f'{v:.0f}' for v in vals)}" for k, vals in results.items()))
    rows = [
        ("stoker.Loader, 224 px", medians["stoker"]),
        (f"DataLoader, loose files + Pillow ({best_loose.removeprefix('loose')} workers)", medians[best_loose]),
        (f"DataLoader, ShardDataset + Pillow ({best_shards.removeprefix('shards')} workers)", medians[best_shards]),
        (f"limit: {cores} threads of simplejpeg decode only", medians["limit"]),
        ("stoker.Loader, 160 px (reduced-DCT decode)", medians["stoker160"]),
    ]
    print(f"{'reader':58} {'img/s':>8}")
    for name, value in rows:
        print(f"{name:58} {value:8.0f}")
    print(f"stoker / best DataLoader over loose files: {medians['stoker'] / medians[best_loose]:.2f}x (target >= 1.8x)")
    print(f"stoker / limit: {medians['stoker'] / medians['limit']:.0%} (target >= 85%)")
    print(f"stoker 160 px / limit: {medians['stoker160'] / medians['limit']:.2f}x (target >= 1.3x)")
    print(f"time to first batch (warm, in-process): {first_batch[spec.size]:.3f} s")


if __name__ == "__main__":
    main()
