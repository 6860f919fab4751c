"""Peer reader: LitData 0.2.76 (venv bench-envs/litdata, made by bench/peer-envs.sh).

prepare: ``litdata.optimize`` with ``--workers`` processes and 64 MB chunks; each sample is
``{"jpeg": the original file bytes, "label": int}`` (LitData's JPEG serializer would keep the bytes
too, but decodes with torchvision, which this venv must not have: it would pull a CUDA torch).

run: the documented setup: ``StreamingDataset(input_dir=..., shuffle=True)``, subclassed so that
``__getitem__`` decodes with Pillow and does RandomResizedCrop + horizontal flip (``_pillow_crop``,
torchvision's algorithm and defaults, as the DataLoader baselines run it) to uint8 HWC, read by
``StreamingDataLoader`` with ``--workers`` processes. Output: uint8 (B, size, size, 3) tensors and
int64 labels. LitData shuffles the chunks and the samples within each chunk a worker reads, so a
batch draws from few chunks (here a first batch held about 20 of the 100 classes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _epochs
import numpy as np
from _pillow_crop import random_resized_crop_of
from litdata import StreamingDataLoader, StreamingDataset, optimize


class CroppedDataset(StreamingDataset):
    def __init__(self, input_dir: str, size: int) -> None:
        super().__init__(input_dir=input_dir, shuffle=True)
        self.crop_size = size

    def __getitem__(self, index: Any) -> tuple[np.ndarray, int]:
        sample = super().__getitem__(index)
        return random_resized_crop_of(sample["jpeg"], self.crop_size), int(sample["label"])


def to_sample(item: tuple[str, int]) -> dict[str, Any]:
    return {"jpeg": Path(item[0]).read_bytes(), "label": item[1]}


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    if args.action == "prepare":
        if (args.work / "index.json").exists():
            return
        paths, labels = _epochs.image_folder(args.photos)
        optimize(fn=to_sample, inputs=[(str(p), label) for p, label in zip(paths, labels)], output_dir=str(args.work),
                 chunk_bytes="64MB", num_workers=args.workers, mode="overwrite", verbose=False)
        return
    loader: StreamingDataLoader | None = None

    def make_epoch(epoch: int) -> Iterator[Any]:
        nonlocal loader
        if loader is None:  # built inside the first epoch's timing, as the other readers
            loader = StreamingDataLoader(CroppedDataset(str(args.work), args.size), batch_size=args.batch,
                                         num_workers=args.workers)
        yield from loader  # every pass over the loader is LitData's next epoch

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
