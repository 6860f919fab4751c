"""Peer reader: SPDL 0.8.0 (venv bench-envs/spdl, made by bench/peer-envs.sh; FFmpeg 5.1 from Debian).

prepare: nothing. SPDL has no format of its own; like its ImageNet example it reads the JPEG files
of ``--photos`` directly.

run: ``spdl.dataloader.DataLoader`` (a ``spdl.pipeline`` of threads, no processes): the source is a
shuffled list of (path, label) per epoch; the preprocessor, on ``--workers`` threads, runs
``spdl.io.demux_image`` + ``spdl.io.decode_packets`` with an FFmpeg filter that does the
RandomResizedCrop (torchvision's algorithm and defaults, box drawn here from the image's size) +
horizontal flip (``crop,scale=S:S:flags=bilinear[,hflip],format=rgb24``); the aggregator packs a batch
of frames with ``spdl.io.convert_frames`` into one buffer, handed to torch with ``spdl.io.to_torch``.
Output: uint8 (B, size, size, 3) tensors and int64 labels, completion order (SPDL's default and
fastest). Caveats: FFmpeg's crop on YUV 4:2:0 rounds the box's left/top to even pixels; SPDL's
extension is loaded in the main thread first (a race in its lazy loading aborts the process).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _epochs
import spdl.io
import torch
from _pillow_crop import random_crop_box
from spdl.dataloader import DataLoader


def main() -> None:
    args = _epochs.parse_args(__doc__.splitlines()[0])
    if args.action == "prepare":
        return
    paths, labels = _epochs.image_folder(args.photos)
    size, rng = args.size, random.Random()
    # spdl 0.8 loads its FFmpeg extension lazily, and two threads doing so at once abort the process
    # ("Check failed: !IsGoogleLoggingInitialized() You called InitGoogleLogging() twice!"): load it here.
    spdl.io.demux_image(str(paths[0]))

    def decode(item: tuple[Path, int]) -> tuple[Any, int]:
        path, label = item
        packets = spdl.io.demux_image(str(path))
        left, top, w, h = random_crop_box(packets.width, packets.height, rng)
        flip = "hflip," if rng.random() < 0.5 else ""
        desc = f"crop={w}:{h}:{left}:{top},scale={size}:{size}:flags=bilinear,{flip}format=pix_fmts=rgb24"
        return spdl.io.decode_packets(packets, filter_desc=desc), label

    def collate(items: list[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = spdl.io.to_torch(spdl.io.convert_frames([frames for frames, _ in items]))
        return images, torch.tensor([label for _, label in items], dtype=torch.int64)

    def make_epoch(epoch: int) -> Iterator[Any]:
        order = list(zip(paths, labels))
        random.Random(epoch).shuffle(order)
        loader = DataLoader(order, preprocessor=decode, batch_size=args.batch, aggregator=collate,
                            num_threads=args.workers, buffer_size=3)
        yield from loader

    _epochs.report_epochs(make_epoch, args)


if __name__ == "__main__":
    main()
