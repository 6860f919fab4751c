"""torchvision's RandomResizedCrop (bilinear, default scale and ratio) + RandomHorizontalFlip, with
Pillow: what the Pillow-based readers (DataLoader baselines and peers) run per sample. Written here
because torchvision is not installed in the benchmark environments; standard library, numpy and
Pillow only, so every peer's environment can import it."""

from __future__ import annotations

import math
import random

import numpy as np
from PIL import Image


def random_resized_crop(image: Image.Image, size: int, scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    """A random crop of ``image`` resized to ``size`` x ``size`` and flipped half the time, as uint8
    HWC. Draws from the ``random`` module, which torch's DataLoader seeds differently in every worker."""
    width, height = image.size
    area, log_ratio = width * height, (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target, aspect = area * random.uniform(*scale), math.exp(random.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = random.randint(0, height - h), random.randint(0, width - w)
            break
    else:  # a central crop at the nearest allowed aspect ratio
        w, h = width, height
        if width / height < ratio[0]:
            h = round(width / ratio[0])
        elif width / height > ratio[1]:
            w = round(height * ratio[1])
        top, left = (height - h) // 2, (width - w) // 2
    out = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if random.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(out)  # a writable copy, as torchvision's PILToTensor makes
