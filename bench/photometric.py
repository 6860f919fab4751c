"""The photometric ops of a translated torchvision train pipeline (ColorJitter(0.4, 0.4, 0.4),
ToTensor, Normalize; optionally RandomGrayscale and a hue jitter) per 224x224 crop: today's
``Augment.apply_image`` image by image beside ``_photometric.apply_chunk`` over the same crops and
draws, in one run, the default build (the fastest this CPU runs) first, then each slower one other
CPUs run. Prints us per image: the median of several passes of the thread's CPU time (a busy
machine distorts it less than wall time).

    PYTHONPATH=$PWD python bench/photometric.py [--size 224] [--batch 64] [--passes 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np

from stoker.augment import Augment, _photometric
from stoker.augment.color import ColorJitter, Grayscale, Normalize
from stoker.augment.native import encode

PIPELINES = {
    "ColorJitter(.4, .4, .4) + Normalize": (ColorJitter(0.4, 0.4, 0.4), Normalize()),
    "ColorJitter(.4, .4, .4, .1) + RandomGrayscale(.2) + Normalize": (ColorJitter(0.4, 0.4, 0.4, 0.1), Grayscale(0.2),
                                                                      Normalize()),
}


def per_image_us(run, images: int, passes: int) -> float:
    """The median over ``passes`` of one call of ``run``, in us per image."""
    times = []
    for _ in range(passes):
        start = time.thread_time()
        run()
        times.append(time.thread_time() - start)
    return statistics.median(times) / images * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    n, size = args.batch, args.size
    crops = np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    print(f"{n} crops of {size}x{size}, us per image (median of {args.passes} passes, one thread)")
    for name, ops in PIPELINES.items():
        old, *new = compare(Augment(*ops, seed=0, device="cpu", backend="opencv", threads=1), crops, args.passes)
        print(f"  {name}\n    apply_image loop {old:7.1f}   apply_chunk {new[0]:7.1f} (GIL released)   {old / new[0]:.2f}x")
        for build, us in zip(_photometric.BUILDS[1:], new[1:], strict=True):
            print(f"{'':27}{build + ' build':>15} {us:7.1f}{'':18}{old / us:.2f}x")


def compare(augment: Augment, crops: np.ndarray, passes: int) -> list[float]:
    """us per image of apply_image crop by crop, then of encode + apply_chunk over all in each of
    ``_photometric.BUILDS``, on the same draws."""
    n, size = len(crops), crops.shape[1:3]
    out = np.empty(crops.shape, np.float32)
    positions = np.arange(n, dtype=np.int64)
    draws = augment.draw((np.full(n, size[0]), np.full(n, size[1])), step=0)

    def today() -> None:
        for i in range(n):
            augment.apply_image(crops[i], i, draws, out[i])

    def native(build: str) -> None:
        codes, params = encode(augment, draws, n)
        _photometric.apply_chunk(crops, out, codes, params, positions, build=build)

    return [per_image_us(today, n, passes)] + [per_image_us(functools.partial(native, build), n, passes)
                                               for build in _photometric.BUILDS]

if __name__ == "__main__":
    main()
