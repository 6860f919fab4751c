"""Crop geometry as pure functions: which part of each image becomes each output pixel.

Random numbers come from one generator per batch, seeded by (seed, epoch, batch number), and are
drawn before any image is read, so the crops do not depend on how many threads decode them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from stoker.boxes import CROP_TRIES, random_resized_box
from stoker.errors import OptionError
from stoker.ranges import CENTER_FRACTION, CROP_RATIO, CROP_SCALE, CROP_SIDE, FLIP_P, Range

CropKind = Literal["random_resized", "center", "resize"]
Interpolation = Literal["bilinear", "bicubic", "lanczos", "hamming", "box"]
# Pillow's antialiased filters, in the order the C code numbers them (pillow_resample.h)
RESAMPLE_FILTERS: tuple[Interpolation, ...] = ("bilinear", "bicubic", "lanczos", "hamming", "box")


@dataclass(frozen=True)
class CropSpec:
    """What the loader makes of every image: output ``size`` (height, width) and how it is cut.

    ``random_resized``: torchvision's RandomResizedCrop (``scale``, ``ratio``);
    ``center``: the central ``center_fraction`` of the short side at the output's aspect, as
    Resize(size / 0.875) + CenterCrop(size) does; ``resize``: the whole image, stretched. These two
    are resampled bilinearly with OpenCV, each image decoded at the smallest DCT scale its crop
    allows; with ``exact`` (what a translated torchvision Resize gets) instead as torchvision's PIL
    path does: decoded whole with Pillow's IDCT and upsampling, resized with Pillow's antialiased
    ``interpolation`` filter and cropped, zeros where the crop is larger than the resized image
    (the pixels of ImageFolder + Resize + CenterCrop, which pads so; slower for large images).
    ``interpolation`` applies to the exact path only: the others resample bilinearly.
    ``flip`` mirrors half the images, chosen at random (or, a number: that fraction of them).
    Each field is checked when the spec is made (OptionError naming it and what it accepts).
    """

    kind: CropKind = "random_resized"
    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    center_fraction: float = 0.875
    flip: bool | float = True
    exact: bool = False
    interpolation: Interpolation = "bilinear"

    def __post_init__(self) -> None:
        if self.kind not in get_args(CropKind):
            raise OptionError(f"kind={self.kind!r}: must be one of {', '.join(map(repr, get_args(CropKind)))}")
        # kept as tuples of plain numbers (given as lists or numpy numbers): hashable, and what the native code takes
        object.__setattr__(self, "size", _pair(self.size, CROP_SIDE, int))
        object.__setattr__(self, "scale", _pair(self.scale, CROP_SCALE, float, ordered=True))
        object.__setattr__(self, "ratio", _pair(self.ratio, CROP_RATIO, float, ordered=True))
        CENTER_FRACTION.check(self.center_fraction)
        if not isinstance(self.flip, bool) and not FLIP_P.accepts(self.flip):
            raise OptionError(f"flip={self.flip!r}: must be True (half the images), False or {FLIP_P.describe()}")
        if not isinstance(self.exact, bool):
            raise OptionError(f"exact={self.exact!r}: must be True or False")
        if self.interpolation not in RESAMPLE_FILTERS:
            raise OptionError(f"interpolation={self.interpolation!r}: must be one of "
                              f"{', '.join(map(repr, RESAMPLE_FILTERS))} (Pillow's filters, for the exact path)")
        if self.exact and self.kind == "random_resized":
            raise OptionError("exact=True applies to 'center' and 'resize' crops (a translated Resize + CenterCrop); "
                              "'random_resized' crops are resampled with OpenCV")

    @property
    def flip_p(self) -> float:
        """The probability that an image is mirrored."""
        return 0.5 if self.flip is True else float(self.flip)


def _pair(value: Any, each: Range, kind: type, ordered: bool = False) -> tuple[Any, Any]:
    """``value`` (a tuple or list) as a tuple of two ``kind`` numbers, each in ``each``'s range and,
    when ``ordered``, the first no larger; else an OptionError naming the field and what it accepts."""
    fits = isinstance(value, (tuple, list)) and len(value) == 2 and all(each.accepts(v) for v in value)
    if not fits or (ordered and value[0] > value[1]):
        form = "(low, high) with low <= high" if ordered else "(height, width)"
        raise OptionError(f"{each.name}={value!r}: must be {form}, each {each.describe()}")
    return kind(value[0]), kind(value[1])


@dataclass(frozen=True)
class BatchDraws:
    """The random numbers of one batch: per sample, ``CROP_TRIES`` tries of 4 uniforms, and a flip."""

    tries: np.ndarray  # (n, CROP_TRIES, 4): area scale, log aspect, top, left
    flips: np.ndarray  # (n,) bool


def draw_batch(seed: int, epoch: int, batch: int, n: int, spec: CropSpec) -> BatchDraws:
    """Random numbers for batch ``batch`` of ``epoch``; the same whatever decodes it."""
    rng = np.random.default_rng([seed, epoch, batch])
    tries = rng.random((n, CROP_TRIES, 4))
    flips = rng.random(n) < spec.flip_p if spec.flip_p else np.zeros(n, dtype=bool)
    return BatchDraws(tries, flips)


def crop_box(spec: CropSpec, height: int, width: int, tries: np.ndarray) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) in the source image, for one sample's ``tries``
    (``random_resized``: :func:`stoker.boxes.random_resized_box`, the rule stoker.augment shares)."""
    out_h, out_w = spec.size
    if spec.kind != "random_resized":
        top, left, ch, cw = exact_box(spec, height, width)
        top, left = max(0.0, top), max(0.0, left)  # a crop CenterCrop pads: cut inside the image (see pads())
        bottom, right = min(height, math.ceil(top + ch)), min(width, math.ceil(left + cw))
        return int(top), int(left), max(1, bottom - int(top)), max(1, right - int(left))
    return random_resized_box(height, width, spec.scale, spec.ratio, tries)


def exact_resize(spec: CropSpec, height: int, width: int) -> tuple[int, int, int, int]:
    """(resized height, resized width, top, left) of a deterministic crop (``center``, ``resize``):
    the size torchvision's Resize(short side) (``center``) or Resize((h, w)) (``resize``) gives the
    image, and where CenterCrop's output starts in it (0, 0 for ``resize``; negative where the
    output is larger than the resized image and CenterCrop pads it)."""
    out_h, out_w = spec.size
    if spec.kind == "resize":
        return out_h, out_w, 0, 0
    short = round(min(out_h, out_w) / spec.center_fraction)  # Resize(short): the short side becomes this
    if width <= height:
        new_h, new_w = int(short * height / width), short  # torchvision truncates the long side
    else:
        new_h, new_w = short, int(short * width / height)
    return new_h, new_w, _center_offset(new_h, out_h), _center_offset(new_w, out_w)


def _center_offset(size: int, crop: int) -> int:
    """Where CenterCrop's ``crop`` pixels start in ``size``: its rounding, or, where it pads first
    (``crop`` > ``size``, the image centred with the odd pixel of padding after it), minus the padding before."""
    return int(round((size - crop) / 2.0)) if size >= crop else -((crop - size) // 2)


def pads(spec: CropSpec, height: int, width: int) -> bool:
    """Whether CenterCrop pads this image: a ``center`` crop larger than the resized image in a
    dimension. Such images take the exact path whatever ``spec.exact`` says (:func:`crop_box`'s
    boxes stay inside the image), so their crops are CenterCrop's, padding included."""
    if spec.kind != "center":
        return False
    new_h, new_w, _, _ = exact_resize(spec, height, width)
    return new_h < spec.size[0] or new_w < spec.size[1]


def exact_box(spec: CropSpec, height: int, width: int) -> tuple[float, float, float, float]:
    """(top, left, height, width) in source pixels, fractional, of a deterministic crop: the part of
    the image that :func:`exact_resize`'s resize and crop take."""
    if spec.kind == "resize":
        return 0.0, 0.0, float(height), float(width)
    new_h, new_w, top, left = exact_resize(spec, height, width)
    sy, sx = height / new_h, width / new_w
    return top * sy, left * sx, spec.size[0] * sy, spec.size[1] * sx
