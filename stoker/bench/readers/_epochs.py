"""What every reader script of ``stoker bench loader`` shares: its arguments and how it reports.

A reader script is run twice by the harness, each time in a fresh process, with its own Python
(a peer may live in a virtual environment of its own, so this file imports nothing but the
standard library):

    python READER.py prepare --photos P --shards S --work W     convert P into the reader's own
                                                                format under W (once; not timed)
    python READER.py run --photos P --shards S --work W ...     read ``--epochs`` epochs and print
                                                                one JSON line per epoch

Every reader makes the same output: ``--size`` x ``--size`` uint8 RGB images (RandomResizedCrop
with torchvision's defaults + horizontal flip; with ``--pipeline train`` or ``val`` a standard
torchvision pipeline's float32 (B, 3, size, size) instead) and int64 labels, in batches of ``--batch``, with
``--workers`` worker threads or processes, in random (or the reader's documented quasi-random)
order. ``--photos`` is an ImageFolder tree of JPEGs; ``--shards`` is the same photos packed by
``stoker pack``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def pop_option(name: str) -> str:
    """Take a reader's own ``name VALUE`` out of the command line (before :func:`parse_args`); VALUE."""
    at = sys.argv.index(name)
    value = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return value


def parse_args(description: str) -> argparse.Namespace:
    """The arguments every reader script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("action", choices=["prepare", "run"])
    parser.add_argument("--photos", type=Path, required=True, help="ImageFolder tree of JPEGs")
    parser.add_argument("--shards", type=Path, required=True, help="the same photos packed by stoker pack")
    parser.add_argument("--work", type=Path, required=True, help="folder for this reader's own format")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pipeline", choices=["crop", "train", "val"], default="crop",
                        help="crop: the uint8 crop every reader makes; train/val: a standard torchvision pipeline (float)")
    return parser.parse_args()


def report_epochs(make_epoch: Callable[[int], Iterable[Any]], args: argparse.Namespace,
                  count: Callable[[Any], int] = lambda batch: len(batch[1])) -> None:
    """Iterate ``make_epoch(e)`` for each of ``args.epochs`` and print ``{"epoch", "images",
    "seconds", "first_batch_s"}`` as one JSON line. ``first_batch_s`` counts from the call of
    ``make_epoch`` (building the loader included) to the first batch; ``count`` says how many images
    a batch holds. Each epoch's first ``(images, labels)`` batch is checked against the contract."""
    for epoch in range(args.epochs):
        start = time.perf_counter()
        first, images = None, 0
        for batch in make_epoch(epoch):
            if first is None:
                first = time.perf_counter() - start
                check_batch(batch, args)
            images += count(batch)
        seconds = time.perf_counter() - start
        print(json.dumps({"epoch": epoch, "images": images, "seconds": seconds, "first_batch_s": first}), flush=True)


def check_batch(batch: Any, args: argparse.Namespace) -> None:
    """Fail unless ``batch`` is (uint8 images, int64 labels) of at most ``--batch`` images of
    ``--size`` x ``--size`` x 3 (NHWC or NCHW). Batches without image tensors are not checked."""
    images, labels = batch
    if not hasattr(images, "dtype"):
        return
    size, shape = args.size, tuple(images.shape[1:])
    dtype = "torch.uint8" if getattr(args, "pipeline", "crop") == "crop" else "torch.float32"
    shapes = ((size, size, 3), (3, size, size)) if dtype == "torch.uint8" else ((3, size, size),)
    if str(images.dtype) != dtype or shape not in shapes:
        raise AssertionError(f"images are {images.dtype} {tuple(images.shape)}, not {dtype} (B, {size}, {size}, 3)")
    if str(labels.dtype) != "torch.int64" or not len(labels) == len(images) <= args.batch:
        raise AssertionError(f"labels are {labels.dtype} of length {len(labels)} for {len(images)} images")


def image_folder(photos: Path) -> tuple[list[Path], list[int]]:
    """(paths, labels) of an ImageFolder tree of JPEGs: classes are the sorted folder names."""
    classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((photos / name).iterdir()):
            paths.append(path)
            labels.append(label)
    return paths, labels
