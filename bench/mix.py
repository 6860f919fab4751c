"""What stoker.Mix costs the Loader: its rate over a Mix of two halves of the sample photos against
its rate over one data set of the same photos, in the same run, A-B-A, medians.

The halves are the photos' classes split in two, each packed on its own (files hard-linked, not
copied); the Mix weighs them by size, so an epoch reads as many images as the whole set's. Each run
reads one warm epoch (the first, untimed, warms the page cache) with the default crop
(RandomResizedCrop 224 + flip) on ``--threads`` threads. Target (issue 32): the Mix under 5% slower.

    .venv/bin/python bench/mix.py [--data ~/.cache/stoker/bench] [--count 4000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import stoker  # noqa: E402

from _common import header, med, median_runs, prepared_photos  # noqa: E402


def halves(photos: Path, data: Path) -> dict[str, Path]:
    """The photos' classes split in two, each half packed as a data set of its own (made once)."""
    classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
    packs = {}
    for name, part in (("first", classes[: len(classes) // 2]), ("second", classes[len(classes) // 2 :])):
        tree = data / f"mix-{name}-src"
        for c in part:
            (tree / c).mkdir(parents=True, exist_ok=True)
            for f in (photos / c).iterdir():
                if not (tree / c / f.name).exists():
                    os.link(f, tree / c / f.name)
        packs[name] = data / f"mix-{name}"
        stoker.pack(tree, packs[name], progress=False)
    return packs


def epoch_rate(loader: stoker.Loader) -> float:
    """Images per second over one epoch of ``loader``."""
    start, images = time.perf_counter(), 0
    for batch, _ in loader:
        images += len(batch)
    return images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache" / "stoker" / "bench")
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=3)
    args = parser.parse_args()
    header("stoker.Mix of two halves against one data set of the same photos: Loader img/s")
    photos, shards = prepared_photos(args.data, args.count)
    parts = halves(photos, args.data)
    whole = stoker.ShardDataset(shards)
    sources = {name: stoker.ShardDataset(path) for name, path in parts.items()}
    mix = stoker.Mix(sources)  # weights: the halves' sizes
    loaders = {"one data set": stoker.Loader(whole, args.batch, threads=args.threads),
               "Mix of halves": stoker.Loader(mix, args.batch, threads=args.threads)}
    for loader in loaders.values():
        epoch_rate(loader)  # warm the page cache and the loader's buffers
    rates = median_runs({name: (lambda loader=loader: epoch_rate(loader)) for name, loader in loaders.items()},
                        args.repeat)
    print(f"images: {len(whole)} ({', '.join(f'{n} {len(s)}' for n, s in sources.items())}), batch {args.batch}, "
          f"threads {args.threads}, {args.repeat} runs each, A-B-A")
    for name, values in rates.items():
        print(f"{name:>14}: median {med(values):8.0f} img/s  (runs: {', '.join(f'{v:.0f}' for v in values)})")
    ratio = med(rates["Mix of halves"]) / med(rates["one data set"])
    print(f"Mix / one data set: {ratio:.3f} ({(1 - ratio) * 100:+.1f}% slower; target under 5%)")


if __name__ == "__main__":
    main()
