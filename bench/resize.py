"""The Loader's resizes, per photo on one core, each beside what it replaced (same run, interleaved).

exact: a translated Resize(256) + CenterCrop(224) (``CropSpec.exact``) on whole decoded photos:
  ``_resample_exact`` with the _resample extension, the same without it (Pillow's resize of the
  whole image, then the crop), and Pillow's resize of torchvision's fractional box, the path
  before the extension (within 1/255 of torchvision's pixels, not equal).
crop: RandomResizedCrop boxes at ``--size`` px, decoded at their DCT scale: ``_crop_resize`` (an
  axis that shrinks 2x or more halved first, then bilinear) against OpenCV's INTER_AREA for a
  crop that shrinks more than 2x and bilinear otherwise, the path before.

Thread CPU time per photo, medians of ``--repeat`` passes over ``--count`` photos.

    .venv/bin/python bench/resize.py --data bench-data/loader
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import simplejpeg
from PIL import Image

import stoker
from stoker.decode import per_image
from stoker.decode.crops import crop_box, draw_batch, exact_box

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, med, median_runs, prepared_photos  # noqa: E402


def per_photo(work: Callable[[int], None], count: int) -> Callable[[], float]:
    """A pass over ``count`` photos, timed in thread CPU time: microseconds per photo."""
    def run() -> float:
        start = time.thread_time()
        for i in range(count):
            work(i)
        return (time.thread_time() - start) / count * 1e6
    return run


def pillow_box(image: np.ndarray, spec: stoker.CropSpec, out: np.ndarray) -> None:
    """The exact path before the extension: Pillow resamples torchvision's fractional box."""
    top, left, ch, cw = exact_box(spec, image.shape[0], image.shape[1])
    pil = Image.frombuffer("RGB", (image.shape[1], image.shape[0]), image, "raw", "RGB", image.strides[0], 1)
    out[...] = np.asarray(pil.resize((out.shape[1], out.shape[0]), Image.Resampling.BILINEAR,
                                     box=(left, top, left + cw, top + ch)))


def area_resize(image: np.ndarray, scale: int, box: tuple[int, int, int, int], out: np.ndarray) -> None:
    """The crop resize before halving: INTER_AREA for a crop shrinking more than 2x, else bilinear."""
    top, left, ch, cw = (v / scale for v in box)
    y0, x0 = int(top), int(left)
    y1, x1 = max(y0 + 1, round(top + ch)), max(x0 + 1, round(left + cw))
    shrink = max((y1 - y0) / out.shape[0], (x1 - x0) / out.shape[1])
    cv2.resize(image[y0:y1, x0:x1], (out.shape[1], out.shape[0]), dst=out,
               interpolation=cv2.INTER_AREA if shrink > 2 else cv2.INTER_LINEAR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data/loader"))
    parser.add_argument("--count", type=int, default=200, help="photos per pass")
    parser.add_argument("--size", type=int, default=160, help="RandomResizedCrop output size for the crop rows")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    header("stoker's resizes per photo, each beside the one it replaced")
    cv2.setNumThreads(1)
    _, shards = prepared_photos(args.data, 4000)
    dataset = stoker.ShardDataset(shards)
    data = [bytes(dataset.read_image(i)[0]) for i in range(args.count)]

    exact = stoker.CropSpec("center", (224, 224), center_fraction=224 / 256, exact=True)
    whole = [simplejpeg.decode_jpeg(d, colorspace="RGB") for d in data]  # Pillow's IDCT and upsampling
    out = np.empty((224, 224, 3), np.uint8)
    extension = per_image.resize_crop

    def without_extension(i: int) -> None:
        per_image.resize_crop = None
        try:
            per_image._resample_exact(whole[i], exact, False, out)
        finally:
            per_image.resize_crop = extension

    crop = stoker.CropSpec(size=(args.size, args.size))
    draws = draw_batch(0, 0, 0, args.count, crop)
    boxes, scaled = [], []
    for i, d in enumerate(data):
        height, width, _, _ = simplejpeg.decode_jpeg_header(d)
        box = crop_box(crop, height, width, draws.tries[i])
        scale = per_image._dct_scale(crop, box)
        boxes.append((box, scale, (height, width)))
        scaled.append(simplejpeg.decode_jpeg(d, colorspace="RGB", fastdct=True, fastupsample=True,
                                             min_height=math.ceil(height / scale), min_width=math.ceil(width / scale)))
    small = np.empty((args.size, args.size, 3), np.uint8)

    def halving(i: int) -> None:
        box, _, size = boxes[i]
        per_image._crop_resize(scaled[i], (0, 0), scaled[i].shape[:2], size, box, False, small)

    runs = {
        "exact, _resample extension": per_photo(lambda i: per_image._resample_exact(whole[i], exact, False, out),
                                                args.count),
        "exact, Pillow resize + crop (no extension)": per_photo(without_extension, args.count),
        "exact before: Pillow resize of the box": per_photo(lambda i: pillow_box(whole[i], exact, out), args.count),
        f"crop {args.size} px, halving + bilinear": per_photo(halving, args.count),
        f"crop {args.size} px before: INTER_AREA beyond 2x": per_photo(
            lambda i: area_resize(scaled[i], boxes[i][1], boxes[i][0], small), args.count),
    }
    results = median_runs(runs, args.repeat)
    for name, values in results.items():
        print(f"{name:48} {med(values):8.0f} us per photo")
    names = list(results)
    print(f"exact: extension / before: {med(results[names[2]]) / med(results[names[0]]):.2f}x faster; "
          f"without it / before: {med(results[names[2]]) / med(results[names[1]]):.2f}x")
    print(f"crop {args.size} px: before / halving: {med(results[names[4]]) / med(results[names[3]]):.2f}x")


if __name__ == "__main__":
    main()
