"""Peer reader: WebDataset 1.0.2 (venv bench-envs/webdataset, made by bench/peer-envs.sh).

prepare: the photos, in a shuffled order (seed 0, as WebDataset's docs advise for training data),
into tar shards written by ``wds.ShardWriter`` (``.jpg`` original bytes + ``.cls`` label), about
32 shards (so every DataLoader worker gets several) of at most 256 MB each.

run: the documented training pipeline: ``wds.WebDataset(shards, shardshuffle=len(shards))``, a
1,000-sample shuffle buffer, ``decode("pil")``, RandomResizedCrop + horizontal flip
(``_pillow_crop``, torchvision's algorithm and defaults, as the DataLoader baselines run it) to
``--size`` uint8 HWC, batched inside the workers (``.batched``, the documented fast path) and
loaded by ``wds.WebLoader(batch_size=None, num_workers=--workers)`` (processes). Output: uint8
(B, size, size, 3) tensors and int64 labels; every worker's last batch may be partial.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _epochs
import webdataset as wds
from _pillow_crop import random_resized_crop


def prepare(photos: Path, work: Path) -> None:
    if (work / "shards.json").exists():
        return
    paths, labels = _epochs.image_folder(photos)
    order = list(range(len(paths)))
    random.Random(0).shuffle(order)
    work.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(work / "train-%06d.tar"), maxcount=math.ceil(len(paths) / 32), maxsize=256 << 20,
                         verbose=0) as sink:
        for i in order:
            sink.write({"__key__": f"{i:09d}", "jpg": paths[i].read_bytes(), "cls": labels[i]})
    shards = sorted(p.name for p in work.glob("train-*.tar"))
    (work / "shards.json").write_text(json.dumps(shards))


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    if args.action == "prepare":
        prepare(args.photos, args.work)
        return
    shards = [str(args.work / name) for name in json.loads((args.work / "shards.json").read_text())]
    size = args.size
    loader: wds.WebLoader | None = None

    def make_epoch(epoch: int) -> Iterator[Any]:
        nonlocal loader
        if loader is None:  # built inside the first epoch's timing, as the other readers
            dataset = (wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False)
                       .shuffle(1000)
                       .decode("pil")
                       .to_tuple("jpg", "cls")
                       .map_tuple(lambda image: random_resized_crop(image, size), int)
                       .batched(args.batch, partial=True))
            loader = wds.WebLoader(dataset, batch_size=None, num_workers=args.workers)
        yield from loader

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
