"""Reader: stoker.Loader over the packed shards (threads, decode fused with the crop)."""

from __future__ import annotations

import _epochs

# Imported here, as a training script imports at its start: ``import stoker`` alone defers the
# Loader's modules (and torch) to first use, which would count them in the time to first batch.
from stoker import CropSpec, Loader, ShardDataset


def main() -> None:
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return  # reads the shards that stoker pack made
    loader = None

    def epoch(number: int) -> Loader:
        nonlocal loader
        if loader is None:  # built inside the first epoch, so time to first batch includes opening the data set
            loader = Loader(ShardDataset(args.shards), args.batch, threads=args.workers,
                            crop=CropSpec(size=(args.size, args.size)))
        return loader

    _epochs.report_epochs(epoch, args)


if __name__ == "__main__":
    main()
