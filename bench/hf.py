"""A Hugging Face Dataset in training: set_transform + a DataLoader against stoker.loader_for(dataset),
the same images and the same torchvision transform, in the same run.

The sample photos (~500x375 JPEGs) become a Hugging Face Dataset (an Image feature holding the JPEG
bytes, a ClassLabel), saved to disk and loaded back memory-mapped, as load_dataset and
load_from_disk give one:

  HF + DataLoader   ds.with_transform(the transform on each image), DataLoader(shuffle=True,
                    num_workers=--workers), as the Hugging Face image-classification examples do
  stoker            stoker.loader_for(ds, transform, batch): packed once beforehand (its time is
                    printed apart), then the Loader's passes

Transform: RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize (torchvision).
Prints img/s of whole passes (median of --repeat, A-B-A order) and the ratio stoker / HF.

Needs datasets and torchvision in one environment (pip install datasets into a venv with torchvision):

    python bench/hf.py              # 2,000 photos, batch 64, 3 repeats
    python bench/hf.py --quick      # 256 photos, batch 32, 1 repeat: under a minute
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import stoker
from stoker.sample_data import make_sample_photos

from _common import header, med, median_runs

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def saved_dataset(data: Path, count: int) -> Any:
    """``count`` sample photos as a Hugging Face Dataset, saved under ``data`` once and loaded back."""
    import datasets

    folder = data / f"hf-{count}"
    if not (folder / "dataset_info.json").is_file():
        photos = make_sample_photos(data / f"photos-{count}", count=count, num_classes=10, progress=False)
        files = sorted(photos.rglob("*.jpg"))
        names = sorted({f.parent.name for f in files})
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
        table = datasets.Dataset.from_dict({"image": [{"bytes": f.read_bytes(), "path": f.name} for f in files],
                                            "label": [names.index(f.parent.name) for f in files]}, features=features)
        table.save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


def train_transform() -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


class OnEachImage:
    """The with_transform function of the Hugging Face examples: the transform on each image of a batch of rows."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, rows: dict) -> dict:
        return {"pixel_values": [self.transform(image.convert("RGB")) for image in rows["image"]],
                "label": rows["label"]}


def collate(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([item["pixel_values"] for item in items]), torch.tensor([item["label"] for item in items])


def images_per_second(loader: Any) -> float:
    """One whole pass over ``loader``: images per second, from the first request to the last batch."""
    started, images = time.perf_counter(), 0
    for batch, _ in loader:
        images += len(batch)
    return images / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader workers (default: cores)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="256 photos, batch 32, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.count, args.batch, args.repeat = 256, 32, 1
    header("Hugging Face set_transform + DataLoader against stoker.loader_for(dataset)")
    table = saved_dataset(args.data, args.count)
    transform = train_transform()
    hf = DataLoader(table.with_transform(OnEachImage(transform)), batch_size=args.batch, shuffle=True,
                    num_workers=args.workers, collate_fn=collate)
    started = time.perf_counter()
    loader = stoker.loader_for(table, transform, args.batch, pack_dir=args.data / f"hf-{args.count}-pack", progress=False)
    print(f"data: {len(table)} photos, batch {args.batch}; stoker.loader_for packed them in "
          f"{time.perf_counter() - started:.1f} s (once; a later call reuses the pack)")
    runs = median_runs({"HF + DataLoader": lambda: images_per_second(hf), "stoker": lambda: images_per_second(loader)},
                       args.repeat)
    for name, rates in runs.items():
        print(f"{name:<18} {med(rates):8.0f} img/s  (runs: {', '.join(f'{r:.0f}' for r in rates)})")
    print(f"stoker / HF + DataLoader ({args.workers} workers): {med(runs['stoker']) / med(runs['HF + DataLoader']):.2f}x")


if __name__ == "__main__":
    main()
