"""Batched per-sample augmentation: stoker.augment against kornia and torchvision, same run.

A batch of 256 real photographs at 3x224x224 (uint8) goes through RandomResizedCrop(224) +
horizontal flip + rotation within ±30° + colour jitter (0.4, 0.4, 0.4, hue 0.1) + normalize,
with random parameters per sample:

  stoker.augment.Augment          one affine map per sample, one sampling pass (OpenCV, threads)
  the same, out= reused           writing into the previous output instead of fresh memory
  kornia.augmentation (eager)     AugmentationSequential of the same ops (if installed)
  torchvision v2, per-sample loop the usual way to get per-sample parameters (if installed)
  torchvision v2, whole batch     one parameter set for the whole batch: not per-sample (reference)

Prints img/s (median of --repeats runs, in A-B-A order) and each row's ratio to stoker's. With
CUDA, also stoker on the GPU in float16 and float32 (img/s and peak GPU memory), and
stoker.Loader(decode="gpu") + the same augmentation from packed ~500x375 JPEGs (img/s).

    .venv/bin/python bench/augment.py                         # CPU, 2 threads
    /path/to/venv-with-torchvision/bin/python bench/augment.py  # with the torchvision rows

torchvision 0.29 needs torch 2.14.1 (not the 2.13.0 of .venv): BENCHMARKS.md says how the
venv for the torchvision rows was made.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

import stoker.augment as A
from stoker.sample_data import make_sample_photos

from _common import header

SIZE = 224


def photo_batch(n: int) -> torch.Tensor:
    """``n`` real photographs, centre-cropped and resized to 224x224, as (n, 3, 224, 224) uint8."""
    from pathlib import Path

    paths = sorted(make_sample_photos(Path("bench-data/augment-photos"), count=n, num_classes=1, seed=5).rglob("*.jpg"))
    images = []
    for path in paths[:n]:
        image = Image.open(path).convert("RGB")
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        images.append(np.asarray(image.crop((left, top, left + side, top + side)).resize((SIZE, SIZE))))
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()


def stoker_pipeline(device: str = "cpu", dtype: torch.dtype | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    return A.Augment(A.RandomResizedCrop(SIZE), A.HorizontalFlip(), A.Rotate(30), A.ColorJitter(0.4, 0.4, 0.4, 0.1),
                     A.Normalize(), device=device, dtype=dtype, seed=0)


def kornia_pipeline() -> Callable[[torch.Tensor], torch.Tensor] | str:
    try:
        import kornia.augmentation as K
    except ImportError as e:
        return f"not installed ({e})"
    sequence = K.AugmentationSequential(
        K.RandomResizedCrop((SIZE, SIZE)), K.RandomHorizontalFlip(), K.RandomRotation(30.0),
        K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0),
        K.Normalize(mean=torch.tensor([0.485, 0.456, 0.406]), std=torch.tensor([0.229, 0.224, 0.225])))
    return lambda batch: sequence(batch.float() / 255)


def torchvision_pipelines() -> dict[str, Callable[[torch.Tensor], torch.Tensor] | str]:
    try:
        from torchvision.transforms import v2
    except ImportError as e:
        reason = f"not installed ({e})"
        return {"torchvision v2, per-sample loop": reason, "torchvision v2, whole batch (one parameter set)": reason}
    compose = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(), v2.RandomRotation(30),
                          v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    return {"torchvision v2, per-sample loop": lambda batch: torch.stack([compose(image) for image in batch]),
            "torchvision v2, whole batch (one parameter set)": compose}


def rate(run: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor, sync: Callable[[], None]) -> float:
    """Images per second for one call on ``batch`` (after a warm-up call)."""
    run(batch)
    sync()
    start = time.perf_counter()
    run(batch)
    sync()
    return len(batch) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    header(f"per-sample augmentation of {args.batch} photos at {SIZE}x{SIZE}: crop+flip+rotate+jitter+normalize, "
           f"{args.threads} threads, torch {torch.__version__}")
    batch = photo_batch(args.batch)
    rows: dict[str, Callable[[torch.Tensor], torch.Tensor] | str] = {"stoker.augment (CPU, float32)": stoker_pipeline()}
    reused, buffer = stoker_pipeline(), None

    def into_previous(images: torch.Tensor) -> torch.Tensor:
        nonlocal buffer
        buffer = reused(images, out=buffer)
        return buffer

    rows["stoker.augment (CPU, float32), out= reused"] = into_previous
    rows["kornia.augmentation, eager"] = kornia_pipeline()
    rows.update(torchvision_pipelines())
    runs: dict[str, list[float]] = {name: [] for name, run in rows.items() if callable(run)}
    order = list(runs) + list(reversed(runs))  # A-B-A: each row measured early and late
    for _ in range(args.repeats):
        for name in order:
            runs[name].append(rate(rows[name], batch, lambda: None))
    base = statistics.median(runs["stoker.augment (CPU, float32)"])
    print("| implementation | img/s (median) | runs | stoker's rate / this one |")
    print("|---|---|---|---|")
    for name, run in rows.items():
        if not callable(run):
            print(f"| {name} | {run} | | |")
            continue
        median = statistics.median(runs[name])
        print(f"| {name} | {median:.0f} | {' / '.join(f'{r:.0f}' for r in runs[name])} | {base / median:.1f}x |")
    if torch.cuda.is_available():
        gpu(batch, args.repeats)
        gpu_decode(args.repeats)


def gpu(batch: torch.Tensor, repeats: int) -> None:
    """stoker.augment on the GPU, float16 against float32: img/s and peak memory."""
    device = torch.device("cuda")
    on_gpu = batch.to(device)
    print(f"\nGPU: {torch.cuda.get_device_name(device)}, batch of {len(batch)} already on the device")
    print("| dtype | img/s (median) | peak GPU memory |")
    print("|---|---|---|")
    for dtype in (torch.float16, torch.float32):
        run = stoker_pipeline("cuda", dtype)
        torch.cuda.reset_peak_memory_stats(device)
        rates = [rate(run, on_gpu, torch.cuda.synchronize) for _ in range(repeats)]
        peak = torch.cuda.max_memory_allocated(device)
        print(f"| {dtype} | {statistics.median(rates):.0f} | {peak / 2**20:.0f} MiB |")


def gpu_decode(repeats: int) -> None:
    """Loader(decode="gpu") + augmentation on the GPU from the packed sample photos, img/s per epoch."""
    from pathlib import Path

    import stoker
    from stoker.bench.loader import prepare_data

    _, shards = prepare_data(Path("bench-data/loader"), 4000, progress=False)
    loader = stoker.Loader(stoker.ShardDataset(shards), batch_size=256, decode="gpu",
                           crop=stoker.CropSpec("resize", size=(256, 256)))
    run = stoker_pipeline("cuda", torch.float16)
    rates = []
    for _ in range(repeats + 1):  # the first epoch warms nvJPEG and the page cache
        start, n = time.perf_counter(), 0
        for images, _ in loader:
            run(images)
            n += len(images)
        torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - start))
    print(f"\nLoader(decode='gpu') + augment, {n} photos of ~500x375 per epoch: "
          f"{statistics.median(rates[1:]):.0f} img/s (epochs: {' / '.join(f'{r:.0f}' for r in rates)})")


if __name__ == "__main__":
    main()
