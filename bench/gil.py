"""GIL held per image by a running stoker.Loader, sampled by py-spy, beside the per-image path.

The GIL is what stops a process's threads from adding speed: a process makes at most
1 / (GIL seconds per image) images per second, whatever its cores. This script starts a Loader in
a process of its own, lets it warm up, then samples it with ``py-spy record --gil`` (only the
thread holding the GIL is recorded, so samples / rate = seconds the GIL was held) while counting
the images it made, and prints GIL us per image, the rate, and where the GIL was held most.

Rows, in one run, A-B-A (medians of ``--repeat``):
    native     stoker.Loader as built (one native call per chunk of samples: decode_chunk)
    per-image  the same Loader without decode_chunk (decode_crop.py per image: the path before it)

Pipelines: ``crop`` (CropSpec RandomResizedCrop + flip to uint8) and ``train`` (the standard
torchvision train Compose through ``Loader(transform=)``: needs torchvision, e.g. .venv-tv).

    .venv/bin/python bench/gil.py --pipeline crop --threads 2
    .venv-tv/bin/python bench/gil.py --pipeline train --threads 2

Needs py-spy (``pip install 'stoker[bench]'``) and the right to ptrace the child (root, or
kernel.yama.ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import header, prepared_photos

PATHS = ("native", "per-image")


def run_loader(shards: str, pipeline: str, threads: int, path: str, batch: int, count, ready) -> None:
    """The measured process: a Loader over ``shards`` made epoch after epoch, ``count`` its images."""
    import stoker
    from stoker.loader import native_chunk

    if path == "per-image":
        native_chunk.decode_chunk = None  # the Loader as it runs where the extension's decode_chunk is missing
    if pipeline == "train":
        from stoker.bench.readers.standard import pipeline as standard

        loader = stoker.Loader(stoker.ShardDataset(shards), batch, transform=standard("train", 224), threads=threads)
    else:
        loader = stoker.Loader(stoker.ShardDataset(shards), batch, crop=stoker.CropSpec("random_resized", (224, 224)),
                               threads=threads)
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for _, labels in loader:
            with count.get_lock():
                count.value += len(labels)
        if epoch == 0:
            ready.set()
        epoch += 1


def measure(shards: Path, args: argparse.Namespace, path: str, spy: str) -> tuple[float, float, Counter]:
    """(GIL us per image, images per second, GIL samples by the function holding it) for one run."""
    context = mp.get_context("spawn")
    count, ready = context.Value("q", 0), context.Event()
    child = context.Process(target=run_loader, args=(str(shards), args.pipeline, args.threads, path, args.batch, count,
                                                     ready), daemon=True)
    child.start()
    try:
        if not ready.wait(300):
            raise SystemExit("the Loader did not finish its first epoch in 300 s")
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "gil.txt"
            start_count, start = count.value, time.perf_counter()
            subprocess.run([spy, "record", "--gil", "--rate", str(args.rate), "--duration", str(args.seconds),
                            "--format", "raw", "--output", str(raw), "--pid", str(child.pid)],
                           check=True, capture_output=True)
            images, elapsed = count.value - start_count, time.perf_counter() - start
            samples: Counter = Counter()
            for line in raw.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                samples[stack.split(";")[-1]] += int(n)
    finally:
        child.kill()
        child.join()
    held = sum(samples.values()) / args.rate
    return held / images * 1e6, images / elapsed, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"), help="sample photos and shards (made once)")
    parser.add_argument("--count", type=int, default=4000, help="sample photos to make when --data has none")
    parser.add_argument("--pipeline", choices=("crop", "train"), default="crop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=int, default=10, help="sampling time per run")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("bench/gil.py needs py-spy: pip install 'stoker[bench]'")
    header(f"GIL held per image, {args.pipeline} pipeline, {args.threads} threads, batches of {args.batch}")
    _, shards = prepared_photos(args.data, args.count)
    results: dict[str, list[tuple[float, float]]] = {path: [] for path in PATHS}
    where: dict[str, Counter] = {path: Counter() for path in PATHS}
    order = [PATHS[i % 2] for i in range(2 * args.repeat + 1)][: 2 * args.repeat]  # A B A B ...
    for path in order:
        gil, rate, samples = measure(shards, args, path, spy)
        results[path].append((gil, rate))
        where[path] += samples
        print(f"  {path:9}  {gil:7.1f} us GIL per image  {rate:7.0f} img/s")
    print(f"\nmedians of {args.repeat} ({args.seconds} s each, {args.rate} samples/s):")
    for path in PATHS:
        gil = statistics.median(g for g, _ in results[path])
        rate = statistics.median(r for _, r in results[path])
        print(f"  {path:9}  {gil:7.1f} us GIL per image  {rate:7.0f} img/s  (at most {1e6 / gil:,.0f} img/s per process)")
    ratio = statistics.median(g for g, _ in results["per-image"]) / statistics.median(g for g, _ in results["native"])
    print(f"  per-image / native GIL: {ratio:.1f}x")
    for path in PATHS:
        total = sum(where[path].values())
        print(f"\nwhere the GIL was held, {path} (share of samples):")
        for function, n in where[path].most_common(8):
            print(f"  {n / total:6.1%}  {function}")


if __name__ == "__main__":
    main()
