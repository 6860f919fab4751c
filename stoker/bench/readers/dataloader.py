"""Reader: torch DataLoader with Pillow decode + RandomResizedCrop + flip per sample, over the loose
photos (``--source loose``, an ImageFolder) or over the packed shards (``--source shards``,
stoker.ShardDataset); ``--workers 0`` loads in the main process."""

from __future__ import annotations

import _epochs
import torch
from _pillow_crop import random_resized_crop
from torch.utils.data import DataLoader

import stoker
from stoker.bench.folder import FolderDataset


class _Crop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image) -> torch.Tensor:
        return torch.from_numpy(random_resized_crop(image, self.size))


def main() -> None:
    source = _epochs.pop_option("--source")
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return
    crop = _Crop(args.size)
    dataset: FolderDataset | stoker.ShardDataset
    if source == "loose":
        dataset = FolderDataset(args.photos, decode="pil", transform=crop)
    else:
        dataset = stoker.ShardDataset(args.shards, decode="pil", transform=crop)
    _epochs.report_epochs(lambda epoch: DataLoader(dataset, args.batch, shuffle=True, num_workers=args.workers),
                          args)


if __name__ == "__main__":
    main()
