"""RandomResizedCrop's box rule, a pure function of an image's size and one sample's uniforms.

stoker.Loader's fused crop (stoker/decode/crops.py) and stoker.augment's RandomResizedCrop both
cut their boxes with it, so the same numbers give the same box on either side. It imports nothing
of stoker, so the loader and augment may both use it without either importing the other.
"""

from __future__ import annotations

import math

import numpy as np

# Boxes tried per sample before the central fallback, as torchvision tries them.
CROP_TRIES = 10


def random_resized_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                       tries: np.ndarray) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) of torchvision's RandomResizedCrop in a ``height`` x
    ``width`` image: the first of ``tries`` (rows of 4 uniforms in [0, 1): area scale, log aspect,
    top, left) whose box fits, else the whole image with its aspect clamped into ``ratio``, centred."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for u_area, u_ratio, u_top, u_left in tries:
        target = area * (scale[0] + u_area * (scale[1] - scale[0]))
        aspect = math.exp(log_lo + u_ratio * (log_hi - log_lo))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= width and 0 < ch <= height:
            return int(u_top * (height - ch + 1)), int(u_left * (width - cw + 1)), ch, cw
    in_ratio = width / height  # fallback: a central crop with the aspect clamped, as torchvision does
    if in_ratio < ratio[0]:
        cw, ch = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        ch, cw = height, round(height * ratio[1])
    else:
        ch, cw = height, width
    return (height - ch) // 2, (width - cw) // 2, ch, cw
