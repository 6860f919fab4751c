"""Peer reader: FFCV 1.0.2 (venv bench-envs/ffcv, built from the sdist by bench/peer-envs.sh).

prepare: ``DatasetWriter`` to one ``.beton`` file with ``RGBImageField(write_mode="jpg",
jpeg_quality=90)`` (FFCV's default quality; no ``max_resolution``, so the images keep their size)
and ``IntField`` labels, ``--workers`` processes. FFCV always decodes and re-encodes what it
writes, so its JPEGs are FFCV's own at quality 90, not the original bytes; ``raw``/``smart``/
``proportion`` modes or a smaller ``max_resolution`` (as in FFCV's ImageNet example) would read
faster but are not the same images.

run: FFCV's fastest documented settings: ``Loader(order=OrderOption.QUASI_RANDOM, os_cache=True,
drop_last=False, num_workers=--workers)`` (threads, numba-compiled pipeline) with
``RandomResizedCropRGBImageDecoder((size, size))`` (torchvision's scale and ratio defaults),
``RandomHorizontalFlip()`` and ``ToTensor()``; labels ``IntDecoder, ToTensor, Squeeze``. Output:
uint8 (B, size, size, 3) tensors and int64 labels. The first epoch includes numba's compilation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _epochs
from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor
from ffcv.writer import DatasetWriter
from PIL import Image


class Photos:
    """(RGB PIL image, label) by index, what ``DatasetWriter.from_indexed_dataset`` reads."""

    def __init__(self, photos: Path) -> None:
        self.paths, self.labels = _epochs.image_folder(photos)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.open(self.paths[index]).convert("RGB"), self.labels[index]


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    beton = args.work / "train.beton"
    if args.action == "prepare":
        if beton.exists():
            return
        args.work.mkdir(parents=True, exist_ok=True)
        partial = beton.with_suffix(".partial")
        writer = DatasetWriter(str(partial), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                               num_workers=args.workers)
        writer.from_indexed_dataset(Photos(args.photos), chunksize=100)
        partial.rename(beton)
        return
    loader: Loader | None = None

    def make_epoch(epoch: int) -> Iterator[Any]:
        nonlocal loader
        if loader is None:  # built inside the first epoch's timing, as the other readers
            pipelines = {"image": [RandomResizedCropRGBImageDecoder((args.size, args.size)), RandomHorizontalFlip(), ToTensor()],
                         "label": [IntDecoder(), ToTensor(), Squeeze()]}
            loader = Loader(str(beton), batch_size=args.batch, num_workers=args.workers, order=OrderOption.QUASI_RANDOM,
                            os_cache=True, drop_last=False, pipelines=pipelines)
        yield from loader

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
