"""Reader: stoker.Loader over the packed shards (threads, decode fused with the crop)."""

from __future__ import annotations

import _epochs

import stoker


def main() -> None:
    args = _epochs.parse_args(__doc__)
    if args.action == "prepare":
        return  # reads the shards that stoker pack made
    loader = None

    def epoch(number: int) -> stoker.Loader:
        nonlocal loader
        if loader is None:  # built inside the first epoch, so time to first batch includes opening the data set
            loader = stoker.Loader(stoker.ShardDataset(args.shards), args.batch, threads=args.workers,
                                   crop=stoker.CropSpec(size=(args.size, args.size)))
        return loader

    _epochs.report_epochs(epoch, args)


if __name__ == "__main__":
    main()
