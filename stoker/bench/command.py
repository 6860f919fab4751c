"""``stoker bench``: the benchmarks' command-line arguments, and running them (the benchmarks
themselves are imported only when one runs: ``stoker --help`` stays fast)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stoker import ranges


def add_bench_command(commands: Any) -> None:
    """Add ``bench`` and its benchmarks to ``commands`` (the ``stoker`` parser's subparsers)."""
    bench = commands.add_parser("bench", help="benchmarks to run on your machine").add_subparsers(
        required=True, metavar="BENCHMARK")
    p = bench.add_parser("loader", help="stoker.Loader vs torch DataLoader and peer loaders, same images and output")
    p.add_argument("--data", type=Path, default=Path("stoker-bench"), help="work folder (default ./stoker-bench)")
    p.add_argument("--images", type=Path, help="your ImageFolder of JPEGs (default: generated sample photos)")
    p.add_argument("--count", type=ranges.BENCH_COUNT.argument(), default=4000,
                   help="number of sample photos to generate (default 4000)")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=PYTHON",
                   help="also measure a peer (ffcv, dali, webdataset, streaming, litdata, spdl) with the Python "
                        "of an environment where it is installed; repeatable")
    p.add_argument("--only", default="", help="comma-separated readers to run: stoker, stoker160, stoker-noext, limit, "
                   "loose0..N, shards1..N and peer names (default: all)")
    p.add_argument("--repeat", type=ranges.BENCH_REPEAT.argument(), default=3,
                   help="runs per reader; medians are reported (default 3)")
    p.add_argument("--batch", type=ranges.BENCH_BATCH.argument(), default=256)
    p.add_argument("--cold", action="store_true", help="evict the data from the page cache before every run, "
                   "and add a disk row: the shards read sequentially")
    p.add_argument("--force", action="store_true", help="run even when other processes load the machine")
    p.add_argument("--restart-rows", action="store_true", help="also stoker.Loader on the photos packed with "
                   "--restart-rows (224 and 160 px), and the pack's rate and size with and without it")
    p.add_argument("--transform", choices=["standard", "timm"], help="standard: torchvision's training and "
                   "validation pipelines through a DataLoader, stoker.Loader(transform=) and CropSpec + stoker.augment "
                   "by hand (needs torchvision; --only train-dataloader,train-transform,train-hand,val-...); timm: "
                   "timm's create_transform(size, is_training=True) through timm's own dataset and DataLoader and "
                   "through stoker.Loader(transform=) (needs timm; --only timm-timm,timm-transform)")
    p.set_defaults(run=_bench_loader)


def _bench_loader(args: argparse.Namespace) -> int:
    from stoker.bench.loader import bench_loader

    peers = dict(peer.split("=", 1) for peer in args.peer)
    print(bench_loader(args.data, count=args.count, images=args.images, peers=peers, only=args.only,
                       repeat=args.repeat, batch=args.batch, cold=args.cold, force=args.force,
                       restart_rows=args.restart_rows, transform=args.transform))
    return 0
