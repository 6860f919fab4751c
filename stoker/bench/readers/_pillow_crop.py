"""torchvision's RandomResizedCrop (bilinear, default scale and ratio) + RandomHorizontalFlip, with
Pillow: what the Pillow-based readers (DataLoader baselines and peers) run per sample. Written here
because torchvision is not installed in the benchmark environments; standard library, numpy and
Pillow only, so every peer's environment can import it."""

from __future__ import annotations

import io
import math
import random

import numpy as np
from PIL import Image


def random_crop_box(width: int, height: int, rng: random.Random | None = None, scale: tuple[float, float] = (0.08, 1.0),
                    ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (left, top, width, height) in an image of that size.
    Draws from ``rng``, by default the ``random`` module, which torch's DataLoader seeds differently
    in every worker."""
    draw = rng or random  # the module's functions use its shared generator
    area, log_ratio = width * height, (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target, aspect = area * draw.uniform(*scale), math.exp(draw.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return draw.randint(0, width - w), draw.randint(0, height - h), w, h
    w, h = width, height  # a central crop at the nearest allowed aspect ratio
    if width / height < ratio[0]:
        h = round(width / ratio[0])
    elif width / height > ratio[1]:
        w = round(height * ratio[1])
    return (width - w) // 2, (height - h) // 2, w, h


def random_resized_crop(image: Image.Image, size: int) -> np.ndarray:
    """A random crop of ``image`` resized to ``size`` x ``size`` and flipped half the time, as uint8 HWC."""
    left, top, w, h = random_crop_box(*image.size)
    out = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if random.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)  # a writable copy, as torchvision's PILToTensor makes


def random_resized_crop_of(encoded: bytes, size: int) -> np.ndarray:
    """:func:`random_resized_crop` of an encoded image (JPEG bytes), decoded with Pillow to RGB."""
    return random_resized_crop(Image.open(io.BytesIO(encoded)).convert("RGB"), size)
