"""The ``stoker`` command: pack, info, verify, cat, sample, doctor, stage, bench."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from stoker.errors import StokerError
from stoker.format import DEFAULT_SHARD_BYTES, REJECTED_NAME, read_manifest

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``256MB``, ``1g``, ``500k`` or plain bytes; binary units (1 MB = 2**20 bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 256MB, 1GB, 65536)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except StokerError as e:
        print(f"stoker: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130


def _pack(args: argparse.Namespace) -> int:
    from stoker.pack import pack

    result = pack(args.src, args.dst, shard_bytes=args.shard_size, workers=args.workers,
                  shuffle_seed=args.shuffle_seed, max_side=args.max_side, quality=args.quality,
                  verify_decode=args.verify_decode, strict=args.strict, progress=not args.quiet,
                  video_mode=args.video_mode, fps=args.fps, short_side=args.short_side, gop=args.gop, crf=args.crf,
                  engine=args.engine, address=args.address)
    rate = result.source_bytes / result.seconds / 1e6 if result.seconds else 0.0
    print(f"packed {result.num_samples} samples into {result.num_shards} shards "
          f"({result.total_bytes / 1e6:.1f} MB) in {result.dst} in {result.seconds:.1f} s ({rate:.1f} MB/s read)")
    if result.reused_shards:
        print(f"reused {result.reused_shards} shards finished by an earlier run")
    if result.rejected:
        print(f"skipped {len(result.rejected)} bad inputs, listed in {result.dst}/{REJECTED_NAME}:")
        for path, reason in result.rejected[:5]:
            print(f"  {path}: {reason}")
    if result.notes:
        print(f"{len(result.notes)} videos whose container header is wrong (frames were counted by decoding):")
        for path, note in result.notes[:5]:
            print(f"  {path}: {note}")
    return 0


def _info(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.dst)
    if args.json:
        print(manifest.to_json(), end="")
        return 0
    total = sum(s.bytes for s in manifest.shards)
    classes = manifest.classes or []
    print(f"data set     {args.dst}")
    print(f"samples      {manifest.num_samples}")
    print(f"shards       {len(manifest.shards)} ({total / 1e6:.1f} MB, mean {total / max(1, len(manifest.shards)) / 1e6:.1f} MB)")
    frames = [k for k, v in manifest.schema.items() if v == "frame"]
    fields = [f"{k} ({v})" for k, v in manifest.schema.items() if v != "frame"]
    if frames:
        fields.insert(0, f"{frames[0]}..{frames[-1]} (frames: up to {len(frames)} per video)")
    print(f"fields       {', '.join(fields)}")
    names = f" ({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''})" if classes else ""
    print(f"classes      {len(classes)}{names}")
    print(f"source       {manifest.source.get('kind')} {manifest.source.get('path')}")
    print(f"options      {json.dumps(manifest.source.get('options', {}))}")
    print(f"made by      stoker {manifest.created_by.get('stoker_version')} at {manifest.created_by.get('created')}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from stoker.format.verify import verify_dataset

    manifest = read_manifest(args.dst)
    with tqdm(total=len(manifest.shards), unit="shard", desc="verify", disable=args.quiet) as bar:
        problems = verify_dataset(args.dst, on_shard=lambda _: bar.update())
    for problem in problems:
        print(f"DAMAGED {problem}")
    if problems:
        print(f"{len(problems)} problems in {args.dst}", file=sys.stderr)
        return 1
    print(f"OK: {manifest.num_samples} samples in {len(manifest.shards)} shards match their checksums")
    return 0


def _cat(args: argparse.Namespace) -> int:
    from stoker.data.dataset import ShardDataset

    dataset = ShardDataset(args.dst, decode="raw")
    try:
        try:
            index = dataset.index_of(args.sample)  # a key first: keys may be all digits
        except KeyError:
            if not re.fullmatch(r"-?\d+", args.sample):
                raise
            index = int(args.sample) % len(dataset) if int(args.sample) < 0 else int(args.sample)
        members = dataset.read_sample(index)
    except (KeyError, IndexError, ZeroDivisionError):
        raise StokerError(f"{args.dst}: no sample {args.sample!r}") from None
    field = args.field or next(f for f in members if dataset.shards.manifest.schema.get(f) == "image")
    if field not in members:
        raise StokerError(f"{args.dst}: sample {args.sample!r} has no field {field!r} (has {', '.join(members)})")
    sys.stdout.buffer.write(members[field])
    sys.stdout.buffer.flush()
    return 0


def _sample(args: argparse.Namespace) -> int:
    from stoker.sample_data import make_sample_photos

    path = make_sample_photos(args.dst, count=args.count, num_classes=args.classes, seed=args.seed,
                              progress=not args.quiet)
    print(f"{args.count} sample photos in {path}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from stoker.doctor import doctor, write_html

    report = doctor(args.path, step_time=args.step_time, batch_size=args.batch_size, workers=args.workers,
                    size=args.size, quick=args.quick, ssd=args.ssd, progress=not args.json and sys.stderr.isatty())
    print(report.to_json() if args.json else report.to_text())
    if args.html:
        write_html(report, args.html)
        if not args.json:
            print(f"HTML report: {args.html}")
    return 0


def _stage(args: argparse.Namespace) -> int:
    from stoker.storage.stage import stage

    result = stage(args.src, args.dst, verify=not args.no_verify, progress=not args.quiet)
    print(f"staged {args.src} into {result.dst}: fetched {result.fetched} files ({result.fetched_bytes / 1e6:.1f} MB), "
          f"{result.skipped} already intact, in {result.seconds:.1f} s")
    return 0


def _bench_loader(args: argparse.Namespace) -> int:
    from stoker.bench.loader import bench_loader

    peers = dict(peer.split("=", 1) for peer in args.peer)
    print(bench_loader(args.data, count=args.count, images=args.images, peers=peers, only=args.only,
                       repeat=args.repeat, batch=args.batch, cold=args.cold, force=args.force, transform=args.transform))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoker", description="Keep the GPU fed: pack and read image data sets fast.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    p = commands.add_parser("pack", help="pack an image folder or a path,label list into shards")
    p.add_argument("src", help="ImageFolder-style tree (ROOT/<class>/<images>) or a CSV/TSV of path,label")
    p.add_argument("dst", help="output folder (created; must be empty or a previous pack of the same input), "
                   "or an fsspec URL such as s3://bucket/prefix (each shard uploaded as soon as it is written)")
    p.add_argument("--shard-size", type=parse_size, default=DEFAULT_SHARD_BYTES, help="target shard size (default 256MB)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel processes, or with --engine ray tasks at once (default: all cores, or all the cluster's)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: processes on this machine; ray: one Ray task per shard (pip install 'stoker[ray]'); "
                   "DST must be reachable from every node (shared file system or object store URL)")
    p.add_argument("--address", default=None,
                   help="with --engine ray: the cluster to join (default: RAY_ADDRESS or a cluster on this node, "
                   "else a local Ray instance)")
    p.add_argument("--shuffle-seed", type=int, default=None, help="shuffle the sample order at pack time")
    p.add_argument("--max-side", type=int, default=None, help="re-encode images larger than N pixels on a side")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (default 90)")
    p.add_argument("--verify-decode", action="store_true", help="fully decode every image to check it")
    p.add_argument("--strict", action="store_true", help="stop at the first bad input instead of skipping it")
    p.add_argument("--video-mode", choices=["frames", "video"], default=None,
                   help="the inputs are videos: store frames as JPEGs, or keep the video bytes (both add a frame table)")
    p.add_argument("--fps", type=float, default=None, help="frames mode: keep frames at this rate (default: all)")
    p.add_argument("--short-side", type=int, default=None, help="frames mode: resize frames to this short side")
    p.add_argument("--gop", type=int, default=None,
                   help="video mode: re-encode (H.264) with a keyframe every N frames (any frame at most N-1 decodes away)")
    p.add_argument("--crf", type=int, default=23,
                   help="with --gop: x264 quality, 0-51 (default 23, x264's own; higher: fewer bytes, coarser)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_pack)

    p = commands.add_parser("info", help="summary of a packed data set")
    p.add_argument("dst")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(run=_info)

    p = commands.add_parser("verify", help="check every shard and sample; exit 1 on damage")
    p.add_argument("dst")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=_verify)

    p = commands.add_parser("cat", help="write one member's bytes to stdout")
    p.add_argument("dst")
    p.add_argument("sample", help="sample key or global index")
    p.add_argument("field", nargs="?", help="member field (default: the image)")
    p.set_defaults(run=_cat)

    p = commands.add_parser("sample", help="generate a folder of realistic sample photos")
    p.add_argument("dst")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=_sample)

    p = commands.add_parser("doctor", help="measure where input time goes and say what to do")
    p.add_argument("path", help="an image folder, a path list (.csv/.tsv/.txt) or a packed stoker data set")
    p.add_argument("--step-time", type=float, help="the model's seconds per batch (for the verdict and GPU idle time)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, help="the most DataLoader workers to try (default: every core)")
    p.add_argument("--size", type=int, default=224, help="training resolution (default 224)")
    p.add_argument("--ssd", type=Path, help="a local SSD folder: also measure copying onto it")
    p.add_argument("--quick", action="store_true", help="a smaller sample: under ~15 s")
    p.add_argument("--json", action="store_true", help="the report as JSON (schema: stoker/doctor/schema.json)")
    p.add_argument("--html", type=Path, help="also write an HTML report with charts to this file")
    p.set_defaults(run=_doctor)

    p = commands.add_parser("stage", help="copy a packed data set (a folder or an fsspec URL such as s3://...) "
                            "to a local folder, verified and resumable")
    p.add_argument("src", help="the data set: a folder, or a URL (s3://, gs://, https://, file://)")
    p.add_argument("dst", help="a local folder; files already there and intact are kept")
    p.add_argument("--no-verify", action="store_true", help="trust files already in DST whose size matches")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_stage)

    bench = commands.add_parser("bench", help="benchmarks to run on your machine").add_subparsers(
        required=True, metavar="BENCHMARK")
    p = bench.add_parser("loader", help="stoker.Loader vs torch DataLoader and peer loaders, same images and output")
    p.add_argument("--data", type=Path, default=Path("stoker-bench"), help="work folder (default ./stoker-bench)")
    p.add_argument("--images", type=Path, help="your ImageFolder of JPEGs (default: generated sample photos)")
    p.add_argument("--count", type=int, default=4000, help="number of sample photos to generate (default 4000)")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=PYTHON",
                   help="also measure a peer (ffcv, dali, webdataset, streaming, litdata, spdl) with the Python "
                        "of an environment where it is installed; repeatable")
    p.add_argument("--only", default="", help="comma-separated readers to run: stoker, stoker160, limit, "
                   "loose0..N, shards1..N and peer names (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="runs per reader; medians are reported (default 3)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--cold", action="store_true", help="evict the data from the page cache before every run, "
                   "and add a disk row: the shards read sequentially")
    p.add_argument("--force", action="store_true", help="run even when other processes load the machine")
    p.add_argument("--transform", choices=["standard"], help="standard: torchvision's training and validation "
                   "pipelines through a DataLoader, stoker.Loader(transform=) and CropSpec + stoker.augment by hand "
                   "(needs torchvision; --only train-dataloader,train-transform,train-hand,val-...)")
    p.set_defaults(run=_bench_loader)
    return parser


if __name__ == "__main__":
    sys.exit(main())
