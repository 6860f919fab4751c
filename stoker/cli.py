"""The ``stoker`` command: pack, info, verify, cat, sample, doctor, stage, bench, env."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from stoker import ranges
from stoker.bench.command import add_bench_command
from stoker.errors import StokerError
from stoker.format import DEFAULT_SHARD_BYTES, MANIFEST_NAME, REJECTED_NAME, read_manifest

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``256MB``, ``1g``, ``500k`` or plain bytes; binary units (1 MB = 2**20 bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 256MB, 1GB, 65536)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


class _UsageError(StokerError):
    """A command line argparse refused; the message starts with the (sub)command."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error reported as every other error is: one line, exit status 1."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stoker`` console command; returns the exit status. Every error is one
    line on stderr and exit status 1: bad arguments, bad input, files that cannot be read or written."""
    try:
        args = _parser().parse_args(argv)
        status = args.run(args)
        sys.stdout.flush()  # here, so that a reader gone away is noticed while we can still handle it
        return status
    except _UsageError as e:
        print(e, file=sys.stderr)
        return 1
    except BrokenPipeError:  # `stoker info DST | head -1`: the reader has what it wanted
        _silence_stdout()
        return 1
    except (StokerError, OSError) as e:
        message = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename and e.strerror else e
        print(f"stoker: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still buffered
    for the closed pipe does not print a traceback on the way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (captured, in tests)
        pass


def _pack(args: argparse.Namespace) -> int:
    from stoker.pack import pack
    from stoker.sources.listing import counted_extensions

    result = pack(args.src, args.dst, shard_bytes=args.shard_size, workers=args.workers,
                  shuffle_seed=args.shuffle_seed, max_side=args.max_side, quality=args.quality,
                  verify_decode=args.verify_decode, restart_rows=args.restart_rows, strict=args.strict,
                  progress=not args.quiet,
                  video_mode=args.video_mode, fps=args.fps, short_side=args.short_side, gop=args.gop, crf=args.crf,
                  engine=args.engine, address=args.address, extensions=args.extensions,
                  image_column=args.image_column, label_column=args.label_column, unlabelled=args.unlabelled,
                  split=args.split)
    rate = result.source_bytes / result.seconds / 1e6 if result.seconds else 0.0
    print(f"packed {result.num_samples} samples into {result.num_shards} shards "
          f"({result.total_bytes / 1e6:.1f} MB) in {result.dst} in {result.seconds:.1f} s ({rate:.1f} MB/s read)")
    if result.reused_shards:
        print(f"reused {result.reused_shards} shards finished by an earlier run")
    if result.skipped_extensions:
        first = next((e for e in result.skipped_extensions if e), ".gif")
        print(f"not packed: {sum(result.skipped_extensions.values())} files in the class folders with other extensions "
              f"({counted_extensions(result.skipped_extensions)}); --extensions +{first[1:]} takes {first} files too")
    if result.repeated_folders:
        print(f"not followed: {result.repeated_folders} links to folders already listed (each real folder is packed once)")
    if result.restarts is not None:
        print(f"restart rows: {_restart_summary(result.restarts)}")
    if result.rejected:
        print(f"skipped {len(result.rejected)} bad inputs, listed in {result.dst}/{REJECTED_NAME}:")
        for path, reason in result.rejected[:5]:
            print(f"  {path}: {reason}")
    if result.notes:
        print(f"{len(result.notes)} videos whose container header is wrong (frames were counted by decoding):")
        for path, note in result.notes[:5]:
            print(f"  {path}: {note}")
    return 0


def _restart_summary(restarts: dict) -> str:
    """``N transcoded with restart markers, M stored as they are (reason: count, ...)``."""
    reasons = ", ".join(f"{reason}: {n}" for reason, n in restarts.get("kept_reasons", {}).items())
    return (f"{restarts.get('transcoded', 0)} JPEGs transcoded with restart markers, {restarts.get('kept', 0)} images "
            f"stored as they are{f' ({reasons})' if reasons else ''}")


def _stored_as(source: dict) -> str:
    """What the pack did to the inputs' bytes: kept them, capped the resolution, or added restart markers."""
    options = source.get("options", {})
    if "video" in options:
        return f"videos, {options['video'].get('mode')} mode"
    if source.get("restart_rows"):
        return f"restart rows: {_restart_summary(source['restart_rows'])}"
    if options.get("max_side"):
        return f"the source files' bytes, except images over {options['max_side']} px re-encoded as JPEG"
    return "the source files' bytes (byte-exact)"


def _info(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.dst)
    if args.json:  # the file as it is (checked above): keys this stoker does not know included
        print((Path(args.dst) / MANIFEST_NAME).read_text(encoding="utf-8"), end="")
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
    print(f"stored as    {_stored_as(manifest.source)}")
    print(f"options      {json.dumps(manifest.source.get('options', {}))}")
    if skipped := manifest.source.get("skipped_extensions"):
        from stoker.sources.listing import counted_extensions

        print(f"not packed   {counted_extensions(skipped)} (other extensions)")
    print(f"made by      stoker {manifest.created_by.get('stoker_version')} at {manifest.created_by.get('created')}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from stoker.format.verify import verify_dataset

    manifest = read_manifest(args.dst, check=False)  # an edited manifest is one of the problems verify reports
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
                    size=args.size, quick=args.quick, ssd=args.ssd, progress=not args.json and sys.stderr.isatty(),
                    prove=args.prove, nodes=args.nodes, ranks_per_node=args.ranks_per_node)
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


def _env(args: argparse.Namespace) -> int:
    from stoker.env import report

    print(report())
    return 0


class _PrintEnv(argparse.Action):
    """``stoker --version``: what ``stoker env`` prints, then exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_) -> None:
        _env(argparse.Namespace())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="stoker", description="Keep the GPU fed: pack and read image data sets fast.")
    parser.add_argument("--version", action=_PrintEnv, help="stoker's version and its optional fast paths (as stoker env)")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    p = commands.add_parser("pack", help="pack images (a folder, a list, Parquet, WebDataset tars, a Hugging Face "
                            "dataset) into shards",
                            description="Pack SRC into shards in DST. From Python, stoker.pack(src, dst) also takes a "
                            "Hugging Face Dataset (a DatasetDict with split=), a pandas DataFrame, a pyarrow Table and "
                            "any map-style Dataset (docs/user-guide.md, section 2).")
    p.add_argument("src", help="an ImageFolder-style tree (ROOT/<class>/<images>); a CSV/TSV of path,label rows (or "
                   "with a header row naming its columns); Parquet files holding images or their paths (a file, a "
                   "folder of them as Hugging Face writes them, or a pattern such as 'data/train-*.parquet'); "
                   "WebDataset .tar shards (a file or a folder of them; key.jpg + key.cls); a Hugging Face "
                   "save_to_disk folder")
    p.add_argument("dst", help="output folder (created; must be empty or a previous pack of the same input), "
                   "or an fsspec URL such as s3://bucket/prefix (each shard uploaded as soon as it is written)")
    p.add_argument("--shard-size", type=ranges.SHARD_BYTES.argument(parse_size), default=DEFAULT_SHARD_BYTES,
                   help="target shard size (default 256MB)")
    p.add_argument("--workers", type=ranges.PACK_WORKERS.argument(), default=None,
                   help="parallel processes, or with --engine ray tasks at once (default: all cores, or all the cluster's)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: processes on this machine; ray: one Ray task per shard (pip install 'stoker[ray]'); "
                   "DST must be reachable from every node (shared file system or object store URL)")
    p.add_argument("--address", default=None,
                   help="with --engine ray: the cluster to join (default: RAY_ADDRESS or a cluster on this node, "
                   "else a local Ray instance)")
    p.add_argument("--shuffle-seed", type=ranges.SHUFFLE_SEED.argument(), default=None,
                   help="shuffle the sample order at pack time")
    p.add_argument("--max-side", type=ranges.MAX_SIDE.argument(), default=None,
                   help="re-encode images larger than N pixels on a side")
    p.add_argument("--quality", type=ranges.QUALITY.argument(), default=None,
                   help="JPEG quality of re-encoded images and video frames (default 90)")
    p.add_argument("--extensions", default=None, metavar="EXT,...",
                   help="file extensions to pack from a folder (default: ImageFolder's: jpg,jpeg,png,ppm,bmp,pgm,tif,"
                   "tiff,webp; videos: mp4,m4v,mov,mkv,webm,avi); +gif adds to the default")
    p.add_argument("--image-column", default=None, metavar="NAME",
                   help="the column holding the images (encoded bytes, a Hugging Face Image struct of bytes and path, "
                   "or file paths) of Parquet, a CSV/TSV with a header row or a Hugging Face dataset (default: the "
                   "first such column; a CSV/TSV's 'path')")
    p.add_argument("--label-column", default=None, metavar="NAME",
                   help="the column holding the labels (integers or class names) of the same sources, or a WebDataset "
                   "sample's label member (default: 'label' or 'labels'; tars: .cls, .label, .class); a source where "
                   "none is found is refused")
    p.add_argument("--unlabelled", action="store_true",
                   help="the source has no labels: pack without them (else a source without labels is refused)")
    p.add_argument("--split", default=None, metavar="NAME",
                   help="the split to pack from a Hugging Face save_to_disk folder of several, or a folder of Parquet "
                   "splits (train-00000-of-00002.parquet, test-...)")
    p.add_argument("--verify-decode", action="store_true", help="fully decode every image to check it")
    p.add_argument("--restart-rows", action="store_true",
                   help="transcode baseline JPEGs losslessly with restart markers, so stoker.Loader decodes only the "
                        "rows its crops need (about +1.5%% size; other images are stored as they are)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad input instead of skipping it")
    p.add_argument("--video-mode", choices=["frames", "video"], default=None,
                   help="the inputs are videos: store frames as JPEGs, or keep the video bytes (both add a frame table)")
    p.add_argument("--fps", type=ranges.FPS.argument(), default=None,
                   help="frames mode: keep frames at this rate (default: all)")
    p.add_argument("--short-side", type=ranges.SHORT_SIDE.argument(), default=None,
                   help="frames mode: resize frames to this short side")
    p.add_argument("--gop", type=ranges.GOP.argument(), default=None,
                   help="video mode: re-encode (H.264) with a keyframe every N frames (any frame at most N-1 decodes away)")
    p.add_argument("--crf", type=ranges.CRF.argument(), default=None,
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
    p.add_argument("--count", type=ranges.SAMPLE_COUNT.argument(), default=1000)
    p.add_argument("--classes", type=ranges.SAMPLE_CLASSES.argument(), default=10)
    p.add_argument("--seed", type=ranges.SAMPLE_SEED.argument(), default=0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=_sample)

    p = commands.add_parser("doctor", help="measure where input time goes and say what to do")
    p.add_argument("path", help="an image folder, a path list (.csv/.tsv/.txt) or a packed stoker data set; or an "
                   "fsspec URL (s3://bucket/prefix: a packed data set or a folder of images; credentials and endpoint "
                   "as for pack and stage: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)")
    p.add_argument("--step-time", type=ranges.STEP_TIME.argument(),
                   help="the model's seconds per batch (for the verdict and GPU idle time)")
    p.add_argument("--batch-size", type=ranges.DOCTOR_BATCH.argument(), default=64)
    p.add_argument("--workers", type=ranges.DOCTOR_WORKERS.argument(),
                   help="the most DataLoader workers to try (default: every core)")
    p.add_argument("--size", type=ranges.DOCTOR_SIZE.argument(), default=224, help="training resolution (default 224)")
    p.add_argument("--ssd", type=Path, help="a local SSD folder: also measure copying onto it")
    p.add_argument("--quick", action="store_true", help="a smaller sample: under ~15 s")
    p.add_argument("--json", action="store_true", help="the report as JSON (schema: stoker/doctor/schema.json)")
    p.add_argument("--html", type=Path, help="also write an HTML report with charts to this file")
    p.add_argument("--prove", action="store_true", help="also run the top two remedies on the sample: predicted vs measured")
    p.add_argument("--nodes", type=ranges.DOCTOR_NODES.argument(),
                   help="also say what a job of this many nodes fetches from the store per node and epoch, and the "
                   "node cache each needs (a packed data set)")
    p.add_argument("--ranks-per-node", type=ranges.DOCTOR_RANKS.argument(), default=1, help="with --nodes (default 1)")
    p.set_defaults(run=_doctor)

    p = commands.add_parser("stage", help="copy a packed data set (a folder or an fsspec URL such as s3://...) "
                            "to a local folder, verified and resumable")
    p.add_argument("src", help="the data set: a folder, or a URL (s3://, gs://, https://, file://)")
    p.add_argument("dst", help="a local folder; files already there and intact are kept")
    p.add_argument("--no-verify", action="store_true", help="trust files already in DST whose size matches")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_stage)

    p = commands.add_parser("env", help="stoker's version and which optional fast paths work here, with their versions")
    p.set_defaults(run=_env)

    add_bench_command(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
