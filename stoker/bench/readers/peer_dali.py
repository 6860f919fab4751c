"""Peer reader: NVIDIA DALI 2.4.0, CPU only (venv bench-envs/dali, made by bench/peer-envs.sh).

prepare: nothing. DALI's ImageNet example reads the ImageFolder tree itself (``fn.readers.file``
with ``file_root``: labels are the sorted class-folder index, as here).

run: a CPU-only pipeline (``device_id=None``, ``num_threads=--workers``): ``fn.readers.file``
(``random_shuffle=True``), ``fn.decoders.image_random_crop(device="cpu")`` (RandomResizedCrop's
scale 0.08-1 and ratio 3/4-4/3, 10 attempts; decodes only the crop window, libjpeg-turbo via
nvImageCodec), ``fn.resize`` to ``--size`` (linear), ``fn.flip`` by ``fn.random.coin_flip``,
read through the PyTorch plugin's ``DALIGenericIterator`` with ``LastBatchPolicy.PARTIAL``.
Output: uint8 (B, size, size, 3) CPU tensors and int64 labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import _epochs
import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIGenericIterator


@pipeline_def
def train_pipeline(photos: str, size: int) -> tuple[Any, Any]:
    jpegs, labels = fn.readers.file(file_root=photos, random_shuffle=True, name="Reader")
    images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                           random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
    images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
    images = fn.flip(images, horizontal=fn.random.coin_flip())
    return images, fn.cast(labels, dtype=types.INT64)


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    if args.action == "prepare":
        return
    loader: DALIGenericIterator | None = None

    def make_epoch(epoch: int) -> Iterator[Any]:
        nonlocal loader
        if loader is None:  # built inside the first epoch's timing, as the other readers
            pipe = train_pipeline(str(args.photos), args.size, batch_size=args.batch, num_threads=args.workers,
                                  device_id=None)
            loader = DALIGenericIterator([pipe], ["images", "labels"], reader_name="Reader", auto_reset=True,
                                         last_batch_policy=LastBatchPolicy.PARTIAL)
        for data in loader:
            images, labels = data[0]["images"], data[0]["labels"].view(-1)
            yield images, labels

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
