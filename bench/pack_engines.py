"""Pack throughput of the Ray engine against the local engine, same input, same run (issue 9).

The local engine runs `workers` processes; the Ray engine one task per shard on a local Ray
cluster with as many CPUs (`ray start --head`, before the clock, as a cluster would be), first
as the CLI runs it (a driver process of its own per pack), then inside a Ray session of this
process (the tasks alone). Runs alternate A, B, A, B; the source is in the page cache, so both
are bound by CPU (checking, re-encoding, writing) and the difference is the engine's overhead.
Also prints the per-core rates that the cluster model in docs/distributed.md is built from.

    .venv/bin/python bench/pack_engines.py                      # as stored (header checks only)
    .venv/bin/python bench/pack_engines.py --max-side 256       # re-encoding every photo
    .venv/bin/python bench/pack_engines.py --videos 24          # 10 s 320x240 videos to JPEG frames
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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

    with local_cluster(args.workers):
        # As `stoker pack --engine ray` runs: a driver process of its own joins the cluster each time.
        run("local")
        driver = median_runs({"local": lambda: run("local"), "ray": lambda: run("ray")}, args.repeat)
        # Inside a Ray session of this process (as a pipeline already on Ray runs): the tasks alone.
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
        run("ray")
        session = median_runs({"local": lambda: run("local"), "ray": lambda: run("ray")}, args.repeat)
        ray.shutdown()
    print(f"data: {len(files)} {unit}, {total / 1e6:.0f} MB, {shards['local']} shards; {args.workers} workers; "
          f"{options}; medians of {args.repeat}")
    print(f"{'engine':44} {unit + '/s':>9} {'source MB/s':>12} {'per core':>9} {'vs local':>9}   runs")
    for title, results in (("driver process per pack (the CLI)", driver), ("in this process's Ray session", session)):
        local = med(results["local"])
        for name, runs in (("local (baseline)", results["local"]), (f"ray, {title}", results["ray"])):
            rate = med(runs)
            mb = rate * total / len(files) / 1e6
            print(f"{name:44} {rate:9.1f} {mb:12.1f} {mb / args.workers:9.1f} {rate / local:9.0%}   "
                  + ", ".join(f"{v:.1f}" for v in runs))
    print("target: ray >= 80% of local")


@contextmanager
def local_cluster(cpus: int) -> Iterator[None]:
    """A Ray cluster on this machine, started as `ray start --head` starts one, joined through RAY_ADDRESS."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_MODE="disabled")
    ray_cli = str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray_cli, "start", "--head", f"--num-cpus={cpus}", f"--port={port}", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([ray_cli, "stop", "--force"], check=True, capture_output=True)


if __name__ == "__main__":
    main()
