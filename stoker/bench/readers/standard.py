"""Reader: the standard torchvision pipelines (``--pipeline train``: RandomResizedCrop, flip,
ColorJitter 0.4/0.4/0.4, ToTensor, Normalize; ``val``: Resize(size * 8/7), CenterCrop, ToTensor,
Normalize), made ``--via``:

    dataloader  torch DataLoader over torchvision's ImageFolder of the loose photos, ``--workers`` processes
    transform   stoker.Loader(ShardDataset(shards), transform=<the same Compose>)
    hand        stoker.Loader(crop=CropSpec) + stoker.augment written by hand (the same ops), ``out=`` reused

Needs torchvision (run the benchmark with a Python that has it, e.g. .venv-tv/bin/stoker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import _epochs
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import stoker.augment as A
from stoker import CropSpec, Loader, ShardDataset  # imported at start, as a training script does
from stoker.bench.pipelines import MEAN, STD, pipeline


class _ByHand:
    """The same pipeline as CropSpec + stoker.augment, written by hand; the output buffer reused."""

    def __init__(self, loader: Loader, augment: A.Augment) -> None:
        self.loader, self.augment, self.out = loader, augment, None

    def __iter__(self):
        for number, (images, labels) in enumerate(self.loader):
            reuse = self.out is not None and len(self.out) == len(images)
            self.out = self.augment(images, out=self.out if reuse else None, step=number)
            yield self.out, labels


def main() -> None:
    via = _epochs.pop_option("--via")
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return
    transform, size = pipeline(args.pipeline, args.size), args.size
    make: Callable[[int], Iterable[Any]]
    if via == "dataloader":
        dataset = ImageFolder(args.photos, transform=transform)
        make = lambda epoch: DataLoader(dataset, args.batch, shuffle=True, num_workers=args.workers)  # noqa: E731
    elif via == "transform":
        loader = Loader(ShardDataset(args.shards), args.batch, transform=transform, threads=args.workers + 1)
        make = lambda epoch: loader  # noqa: E731
    else:
        train = args.pipeline == "train"
        crop = CropSpec("random_resized" if train else "center", (size, size), flip=train)
        ops = (A.ColorJitter(0.4, 0.4, 0.4),) if train else ()
        by_hand = _ByHand(Loader(ShardDataset(args.shards), args.batch, crop=crop, threads=args.workers + 1),
                          A.Augment(*ops, A.Normalize(MEAN, STD), seed=0, device="cpu", threads=args.workers))
        make = lambda epoch: by_hand  # noqa: E731
    _epochs.report_epochs(make, args)


if __name__ == "__main__":
    main()
