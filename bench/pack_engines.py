"""Pack throughput of the Ray engine against the local engine, same input, same run (issue 9).

The local engine runs `workers` processes; the Ray engine one task per shard on a local Ray
instance with as many CPUs, started before the clock (as a cluster would be). Runs alternate
A, B, A, B; the source is in the page cache, so both are bound by CPU (checking, re-encoding,
writing) and the difference is the engine's overhead. Also prints the per-shard costs that the
cluster model in docs/distributed.md is built from.

    .venv/bin/python bench/pack_engines.py                      # as stored (header checks only)
    .venv/bin/python bench/pack_engines.py --max-side 256       # re-encoding every photo
    .venv/bin/python bench/pack_engines.py --videos 24          # 10 s 320x240 videos to JPEG frames
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

import ray

from stoker.pack import pack
from stoker.sample_data import make_sample_photos

from _common import header, med, median_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/pack-engines"))
    parser.add_argument("--photos", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--max-side", type=int, default=None, help="re-encode photos larger than this")
    parser.add_argument("--videos", type=int, default=0, help="pack this many 10 s videos (frames mode) instead")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.videos:
        from video import make_videos  # bench/video.py's generated pans with sensor noise

        files = make_videos(args.data / "videos-320x240", args.videos, (320, 240), 10)
        source, unit, options = files[0].parent.parent, "videos", {"video_mode": "frames"}
    else:
        source = make_sample_photos(args.data / "photos", count=args.photos, num_classes=100, progress=True)
        files = sorted(source.rglob("*.jpg"))
        unit, options = "photos", {"max_side": args.max_side}
    total = sum(p.stat().st_size for p in files)
    header("bench/pack_engines.py: stoker pack --engine ray vs the local engine")
    started = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, logging_level=logging.WARNING)
    ray_start = time.perf_counter() - started
    shards: dict[str, int] = {}

    def run(engine: str) -> float:
        out = args.data / f"out-{engine}"
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        result = pack(source, out, shard_bytes=args.shard_mb << 20, workers=args.workers, progress=False, engine=engine,
                      **options)
        seconds = time.perf_counter() - start
        shards[engine] = result.num_shards
        shutil.rmtree(out, ignore_errors=True)
        return len(files) / seconds

    for engine in ("local", "ray"):  # warm-up: page cache, Ray's worker processes
        run(engine)
    results = median_runs({"local": lambda: run("local"), "ray": lambda: run("ray")}, args.repeat)
    ray.shutdown()
    local, remote = med(results["local"]), med(results["ray"])
    print(f"data: {len(files)} {unit}, {total / 1e6:.0f} MB, {shards['local']} shards; "
          f"{args.workers} workers; {options}; medians of {args.repeat} ({unit}/s runs: "
          + "; ".join(f"{k} {', '.join(f'{v:.0f}' for v in vals)}" for k, vals in results.items()) + ")")
    print(f"{'engine':32} {unit + '/s':>9} {'source MB/s':>12} {'per core':>9}")
    for name, rate in (("local (baseline)", local), ("ray, local instance", remote)):
        mb = rate * total / len(files) / 1e6
        print(f"{name:32} {rate:9.1f} {mb:12.1f} {mb / args.workers:9.1f}")
    print(f"ray / local: {remote / local:.0%} (target >= 80%); starting the local Ray instance took {ray_start:.1f} s")


if __name__ == "__main__":
    main()
