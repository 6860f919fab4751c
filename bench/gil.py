"""GIL held per image by a running stoker.Loader, beside the per-image path, measured two ways.

The GIL is what stops a process's threads from adding speed: a process makes at most
1 / (GIL seconds per image) images per second, whatever its cores. This script starts a Loader in
a process of its own, lets it warm up, then, while counting the images it makes:

  py-spy     samples it with ``py-spy record --gil`` (only the thread holding the GIL is recorded,
             so samples / rate = seconds the GIL was held), and says where the GIL was held most.
             Wall-clock time: a thread preempted while it holds the GIL counts the whole time, so
             on a machine with fewer cores than runnable threads (2 cores: the loader's threads,
             the loop and py-spy) short holds are inflated many times over.
  CPU        (in a window of its own, before py-spy's)
             the process's CPU time less the CPU time its threads spent inside the native calls
             that run without the GIL (decode_chunk, the photometric apply_chunk, and the per-image
             path's decodes and exact resizes: simplejpeg's decode_jpeg, decode_region,
             resize_crop; timed per call with the calling thread's CPU clock): an upper bound on
             the CPU time spent holding the GIL (other C code that releases it, OpenCV's resizes,
             flips and the per-image augmentation among it, counts as held), which preemption does
             not inflate.

Rows, in one run, A-B-A (medians of ``--repeat``):
    native     stoker.Loader as built (one native call per chunk of samples: decode_chunk)
    per-image  the same Loader without decode_chunk (per_image.py per image: the path before it)
    cached     with ``--cache``: the native Loader over the same shards through a node cache in
               /dev/shm holding every shard (``ShardDataset(cache_dir=...)``, staged before the
               Loader starts), as a multi-node set-up reads them

Pipelines: ``crop`` (CropSpec RandomResizedCrop + flip to uint8), ``exact`` (CropSpec center 224
exact: a translated Resize(256) + CenterCrop(224), Pillow's resize, to uint8), and through
``Loader(transform=)`` (need torchvision, e.g. .venv-tv) ``train`` (the standard torchvision train
Compose) and ``val`` (Resize(256) + CenterCrop(224) + ToTensor + Normalize).

    .venv/bin/python bench/gil.py --pipeline crop --threads 2
    .venv/bin/python bench/gil.py --pipeline crop --threads 1 --cache
    .venv-tv/bin/python bench/gil.py --pipeline train --threads 2
    .venv-tv/bin/python bench/gil.py --pipeline val --threads 2

``--quick`` (1,000 photos under ``--data``/quick, one round of 3 s per row) shows the direction in
about a minute; the figures to report come from the full run on an idle machine.

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
import threading
import time
import types
from collections import Counter
from pathlib import Path

from _common import header, prepared_photos

PATHS = ("native", "per-image", "cached")
PIPELINES = ("crop", "exact", "train", "val")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


IMAGES, PROCESS_CPU, NATIVE_CPU = range(3)  # the measured process's progress, in a shared array
# The measured process's CPU seconds inside the counted calls, per thread: each thread adds to its own
# entry (no lock in the call's path: the per-image path makes several such calls per image), and the
# loop publishes their sum with each batch, beside the process's CPU time.
_native_seconds: dict[int, float] = {}


def _cpu_counted(function):
    """``function``, adding the calling thread's CPU time inside it to its ``_native_seconds``."""

    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            thread = threading.get_ident()
            _native_seconds[thread] = _native_seconds.get(thread, 0.0) + time.thread_time() - start

    return timed


def run_loader(shards: str, pipeline: str, threads: int, path: str, batch: int, progress, ready,
               cache_dir: str | None) -> None:
    """The measured process: a Loader over ``shards`` (through a node cache in ``cache_dir``, every
    shard staged first, for the ``cached`` row) made epoch after epoch; ``progress`` its images, its
    CPU time, and the CPU time its threads spent in the native calls that release the GIL."""
    import simplejpeg

    import stoker
    from stoker.augment import native
    from stoker.decode import per_image
    from stoker.loader import native_chunk, thread_augment

    if path == "per-image":  # the Loader as it runs where the extensions' chunk calls are missing
        native_chunk.decode_chunk = None
        native.apply_chunk = None
    else:
        native_chunk.decode_chunk = _cpu_counted(native_chunk.decode_chunk)
        thread_augment.augment_chunk = _cpu_counted(thread_augment.augment_chunk)
    for name in ("decode_region", "resize_crop"):  # what the per-image path runs without the GIL
        if getattr(per_image, name) is not None:
            setattr(per_image, name, _cpu_counted(getattr(per_image, name)))
    per_image.simplejpeg = types.SimpleNamespace(decode_jpeg_header=simplejpeg.decode_jpeg_header,
                                                 decode_jpeg=_cpu_counted(simplejpeg.decode_jpeg))
    dataset = stoker.ShardDataset(shards, cache_dir=cache_dir)
    if dataset.shards.cache is not None:
        if not dataset.shards.cache.holds_everything:
            raise SystemExit(f"the node cache in {cache_dir} cannot hold every shard")
        for shard in range(len(dataset.shards.manifest.shards)):
            dataset.shards.cache.fetch(shard)
    if pipeline in ("train", "val"):  # the standard Composes (train: stoker/bench/readers/standard.py)
        import torchvision.transforms as T

        geometry = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4)] \
            if pipeline == "train" else [T.Resize(256), T.CenterCrop(224)]
        transform = T.Compose([*geometry, T.ToTensor(), T.Normalize(MEAN, STD)])
        loader = stoker.Loader(dataset, batch, transform=transform, threads=threads)
    else:
        crop = stoker.CropSpec("random_resized", (224, 224)) if pipeline == "crop" else \
            stoker.CropSpec("center", (224, 224), flip=False, exact=True)
        loader = stoker.Loader(dataset, batch, crop=crop, threads=threads)
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for _, labels in loader:
            with progress.get_lock():
                progress[IMAGES] += len(labels)
                progress[PROCESS_CPU] = time.process_time()
                progress[NATIVE_CPU] = sum(list(_native_seconds.values()))
        if epoch == 0:
            ready.set()
        epoch += 1


def measure(shards: Path, args: argparse.Namespace, path: str, spy: str) -> tuple[float, float, float, Counter]:
    """(py-spy's GIL us per image, the CPU bound's, images per second,
    GIL samples by the function holding it) for one run."""
    context = mp.get_context("spawn")
    progress, ready = context.Array("d", 3), context.Event()
    cache_dir = tempfile.mkdtemp(prefix="stoker-bench-gil-", dir="/dev/shm") if path == "cached" else None
    child = context.Process(target=run_loader, args=(str(shards), args.pipeline, args.threads, path, args.batch, progress,
                                                     ready, cache_dir), daemon=True)
    child.start()
    try:
        if not ready.wait(300):
            raise SystemExit("the Loader did not finish its first epoch in 300 s")
        with progress.get_lock():  # first a window without py-spy: its pauses cost the process CPU time
            before = list(progress)
        time.sleep(args.seconds)
        with progress.get_lock():
            after = list(progress)
        cpu = (after[PROCESS_CPU] - before[PROCESS_CPU] - (after[NATIVE_CPU] - before[NATIVE_CPU])) / \
            (after[IMAGES] - before[IMAGES]) * 1e6
        with tempfile.TemporaryDirectory() as folder:
            raw = Path(folder) / "gil.txt"
            with progress.get_lock():
                before, start = list(progress), time.perf_counter()
            subprocess.run([spy, "record", "--gil", "--rate", str(args.rate), "--duration", str(args.seconds),
                            "--format", "raw", "--output", str(raw), "--pid", str(child.pid)],
                           check=True, capture_output=True)
            with progress.get_lock():
                after, elapsed = list(progress), time.perf_counter() - start
            samples: Counter = Counter()
            for line in raw.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                samples[stack.split(";")[-1]] += int(n)
    finally:
        child.kill()
        child.join()
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    images = after[IMAGES] - before[IMAGES]
    held = sum(samples.values()) / args.rate
    return held / images * 1e6, cpu, images / elapsed, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"), help="sample photos and shards (made once)")
    parser.add_argument("--count", type=int, default=4000, help="sample photos to make when --data has none")
    parser.add_argument("--pipeline", choices=PIPELINES, default="crop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    # At ~5 us per image and ~1,300 img/s the GIL is held 0.65% of the time: 250 samples a second
    # for 30 s count ~50 with it held (+-14%); 8 s counted ~13 (+-28%), too few to tell 5 us from 7
    parser.add_argument("--seconds", type=int, default=30, help="sampling time per run")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", action="store_true", help="add the native Loader through a staged node cache")
    parser.add_argument("--quick", action="store_true", help="1,000 photos (under DATA/quick), one round of 3 s per row")
    args = parser.parse_args()
    if args.quick:
        args.data, args.count, args.seconds, args.repeat = args.data / "quick", 1000, 3, 1
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("bench/gil.py needs py-spy: pip install 'stoker[bench]'")
    header(f"GIL held per image, {args.pipeline} pipeline, {args.threads} threads, batches of {args.batch}")
    _, shards = prepared_photos(args.data, args.count)
    paths = PATHS if args.cache else PATHS[:2]
    results: dict[str, list[tuple[float, float, float]]] = {path: [] for path in paths}
    where: dict[str, Counter] = {path: Counter() for path in paths}
    order = paths * args.repeat  # A B A B ... (A B C A B C ... with --cache)
    for path in order:
        gil, cpu, rate, samples = measure(shards, args, path, spy)
        results[path].append((gil, cpu, rate))
        where[path] += samples
        held = sum(samples.values())
        print(f"  {path:9}  py-spy {gil:7.1f} us  CPU {_us(cpu)}  {rate:7.0f} img/s  "
              f"({held} samples with the GIL held: +-{100 / max(held, 1) ** 0.5:.0f}%)")
    print(f"\nmedians of {args.repeat} ({args.seconds} s each, {args.rate} samples/s), GIL held per image:")
    medians = {}
    for path in paths:
        gil = statistics.median(g for g, _, _ in results[path])
        cpu = statistics.median(c for _, c, _ in results[path])
        rate = statistics.median(r for _, _, r in results[path])
        medians[path] = gil, cpu
        bound = f"(at most {1e6 / cpu:,.0f} img/s per process)"
        print(f"  {path:9}  py-spy {gil:7.1f} us  CPU {_us(cpu)}  {rate:7.0f} img/s  {bound}")
    (gil_a, cpu_a), (gil_b, cpu_b) = medians["per-image"], medians["native"]
    print(f"  per-image / native: py-spy {gil_a / gil_b:.1f}x, CPU {cpu_a / cpu_b:.1f}x")
    if "cached" in medians:
        gil_c, cpu_c = medians["cached"]
        print(f"  cached / native: py-spy {gil_c / gil_b:.2f}x, CPU {cpu_c / cpu_b:.2f}x")
    for path in paths:
        total = sum(where[path].values())
        print(f"\nwhere the GIL was held, {path} (share of samples):")
        for function, n in where[path].most_common(8):
            print(f"  {n / total:6.1%}  {function}")


def _us(value: float) -> str:
    return f"{value:7.1f} us"


if __name__ == "__main__":
    main()
