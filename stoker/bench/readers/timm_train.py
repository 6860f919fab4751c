"""Reader: timm's training transform, ``create_transform(--size, is_training=True)`` with timm's
defaults (RandomResizedCropAndInterpolation, flip, ColorJitter 0.4/0.4/0.4, MaybeToTensor,
Normalize), made ``--via``:

    timm       timm's own path, as its train.py takes it: create_dataset over the loose photos (an
               ImageFolder tree) and create_loader (a torch DataLoader with ``--workers`` processes
               and the same transform; use_prefetcher=False: its prefetcher normalizes on a CUDA device)
    transform  stoker.Loader(ShardDataset(shards), transform=<the same transform>)

Needs timm (run the benchmark with a Python that has it, e.g. .venv-tv/bin/stoker).
"""

from __future__ import annotations

import _epochs


def main() -> None:
    via = _epochs.pop_option("--via")
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":  # nothing to prepare: done before the imports (seconds each)
        return
    import torch  # imported before any loader is made, as a training script does
    from timm.data import create_dataset, create_loader, create_transform

    from stoker import Loader, ShardDataset

    transform = create_transform(args.size, is_training=True)
    loader: object
    if via == "timm":
        dataset = create_dataset("", root=str(args.photos))
        loader = create_loader(dataset, input_size=(3, args.size, args.size), batch_size=args.batch, is_training=True,
                               use_prefetcher=False, num_workers=args.workers, device=torch.device("cpu"))
        if repr(dataset.transform) != repr(transform):
            raise AssertionError(f"timm's loader made {dataset.transform!r}, not {transform!r}")
    else:
        loader = Loader(ShardDataset(args.shards), args.batch, transform=transform, threads=args.workers + 1)
    _epochs.report_epochs(lambda epoch: loader, args)


if __name__ == "__main__":
    main()
