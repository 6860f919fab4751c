"""Photometric augmentations, one parameter per sample, each op in one place: its parameters and
their draw, its torch form over a batch, its OpenCV form over one image and its encoding for the
native kernels, side by side.

Each op follows torchvision's functional definition (adjust_brightness, adjust_contrast,
adjust_saturation, adjust_hue, rgb_to_grayscale, gaussian_blur, normalize). ``apply`` works on a
float batch (n, 3, H, W) in [0, 1] with torch, the factor a tensor of one value per sample, so a
whole batch on the GPU is a handful of vectorized passes. ``apply_image(x, p, spare)`` does the
same to one (H, W, 3) float32 image with OpenCV and numpy, the CPU backend, writing into ``x``
or the scratch array ``spare`` (of x's shape) and returning the one holding the result: per image, each pass stays in
the cache and OpenCV's colour conversions are vectorized (measured here on 224x224: the HSV hue
round trip 58 us per image, against ~600 us per image for the torch version on CPU).
``encode(values, n)`` gives a batch's draws as the op codes and parameter slots the C kernels
(photometric_kernels.c, run through native.py) take, in opcodes.py's numbers; GaussianBlur has none.
A sample the op's ``p`` leaves out gets the identity parameter (factor 1, shift 0).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from stoker.augment import opcodes
from stoker.augment.opcodes import GRAY, PARAMS, slots

_GRAY_ROW = np.array([GRAY], np.float32)
_GRAY_ROWS = np.repeat(_GRAY_ROW, 3, axis=0)  # luma into each of the three channels
Encoded = tuple[np.ndarray, np.ndarray]  # (n, k) int32 op codes, (n, k, PARAMS) float64 parameters


def gray(x: torch.Tensor) -> torch.Tensor:
    """Luma (n, 1, H, W) of an RGB batch."""
    r, g, b = x.unbind(1)
    return (GRAY[0] * r + GRAY[1] * g + GRAY[2] * b).unsqueeze(1)


# The OpenCV forms clamp to [0, 1] only where a result can leave it: x is in [0, 1], so scaling
# by a factor <= 1, or blending with a value in [0, 1] (the mean luma, the pixel's luma) by one,
# stays inside. OpenCV's threshold clamps in place at half np.clip's cost (measured here on
# 224x224x3 float32: 27 against 34 us for both sides, 14 us for the top alone).


def _clamp(x: np.ndarray, below: bool = True) -> None:
    cv2.threshold(x, 1.0, 1.0, cv2.THRESH_TRUNC, dst=x)
    if below:
        cv2.threshold(x, 0.0, 0.0, cv2.THRESH_TOZERO, dst=x)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * factor.view(-1, 1, 1, 1)).clamp_(0, 1)


def _brightness_image(x: np.ndarray, factor: float, spare: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    np.multiply(x, np.float32(factor), out=x)
    if factor > 1:
        _clamp(x, below=False)  # a factor >= 0 keeps x >= 0
    return x, spare


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the mean luma of each image."""
    mean = gray(x).mean(dim=(1, 2, 3), keepdim=True)
    f = factor.view(-1, 1, 1, 1)
    return (x * f + mean * (1 - f)).clamp_(0, 1)


def _contrast_image(x: np.ndarray, factor: float, spare: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = float(np.dot(_GRAY_ROW[0], cv2.mean(x)[:3]))  # the mean of the luma
    cv2.addWeighted(x, factor, x, 0.0, mean * (1 - factor), dst=x)  # one pass: x * factor + mean * (1 - factor)
    if factor > 1:
        _clamp(x)
    return x, spare


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the image's own luma."""
    f = factor.view(-1, 1, 1, 1)
    return (x * f + gray(x) * (1 - f)).clamp_(0, 1)


def _saturation_image(x: np.ndarray, factor: float, spare: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cv2.transform(x, (factor * np.eye(3) + (1 - factor) * _GRAY_ROWS).astype(np.float32), dst=x)  # in place
    if factor > 1:
        _clamp(x)
    return x, spare


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue of each image by ``shift`` (in turns, -0.5..0.5).

    Value (the largest channel) and chroma (largest minus smallest) are kept, so the result is
    written straight from the shifted hue: channel = max - chroma * clamp(min(k, 4 - k), 0, 1)
    with k = (n + 6 * hue) mod 6 and n = 5, 3, 1 for red, green, blue. That is HSV-to-RGB
    without building S and V (the same values as torchvision's conversion up to float rounding)
    and in fewer passes over the pixels.
    """
    r, g, b = x.unbind(1)
    high, low = x.amax(dim=1), x.amin(dim=1)
    chroma = high - low
    safe = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    # hue in sixths of a turn, by which channel is the largest (red first on ties, as torchvision)
    hue = torch.where(high == r, (g - b) / safe,
                      torch.where(high == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = torch.remainder(hue + 6 * shift.view(-1, 1, 1), 6)
    out = torch.empty_like(x)
    for channel, n in enumerate((5, 3, 1)):
        k = torch.remainder(hue + n, 6)
        out[:, channel] = high - chroma * torch.minimum(k, 4 - k).clamp_(0, 1)
    return out


def _hue_image(x: np.ndarray, shift: float, spare: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV, dst=spare)  # float: hue in degrees
    # OpenCV's vectorized HSV-to-RGB wraps hues at 360 but not below 0: shift forward only
    cv2.add(hsv, ((360 * shift) % 360, 0.0, 0.0, 0.0), dst=hsv)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=x), spare


@dataclass(frozen=True)
class Adjustment:
    """One of ColorJitter's four adjustments: its name (ColorJitter's field), the value that leaves an
    image as it is, the lowest factor a strength gives (None: a shift, unbounded), its op code in the
    native kernels, its torch form over a batch (a value per sample) and its OpenCV form over one image."""

    name: str
    identity: float
    floor: float | None
    code: int
    batch: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    image: Callable[[np.ndarray, float, np.ndarray], tuple[np.ndarray, np.ndarray]]

    def range_of(self, strength: float) -> tuple[float, float]:
        """torchvision's range for a strength v: [max(0, 1 - v), 1 + v] for a factor, [-v, v] for a shift."""
        low = self.identity - strength
        return (low if self.floor is None else max(self.floor, low), self.identity + strength)


# ColorJitter's four adjustments in torchvision's order; a sample's order is one row of _ORDERS, drawn per sample
_JITTERS = (Adjustment("brightness", 1.0, 0.0, opcodes.BRIGHTNESS, adjust_brightness, _brightness_image),
            Adjustment("contrast", 1.0, 0.0, opcodes.CONTRAST, adjust_contrast, _contrast_image),
            Adjustment("saturation", 1.0, 0.0, opcodes.SATURATION, adjust_saturation, _saturation_image),
            Adjustment("hue", 0.0, None, opcodes.HUE, adjust_hue, _hue_image))
_ORDERS = np.array(list(itertools.permutations(range(len(_JITTERS)))))
_JITTER_CODES = np.array([adjustment.code for adjustment in _JITTERS], np.int32)
Range = float | tuple[float, float]


@dataclass(frozen=True)
class ColorJitter:
    """Brightness, contrast and saturation factors drawn in [max(0, 1 - v), 1 + v] (or in the
    range (low, high) given) and a hue shift in [-hue, hue] turns (or the range), per sample,
    applied with probability ``p``, in an order drawn per sample among the 24, as torchvision's
    ColorJitter draws one per call (that is, per sample in a DataLoader)."""

    brightness: Range = 0.0
    contrast: Range = 0.0
    saturation: Range = 0.0
    hue: Range = 0.0
    p: float = 1.0

    def __post_init__(self) -> None:
        hue = self.ranges["hue"]
        if hue is not None and not -0.5 <= hue[0] <= hue[1] <= 0.5:
            raise ValueError(f"hue must lie in [-0.5, 0.5], got {self.hue}")

    @functools.cached_property
    def ranges(self) -> dict[str, tuple[float, float] | None]:
        """Each adjustment's range of factors (of shifts, for hue), or None where it is off."""
        ranges: dict[str, tuple[float, float] | None] = {}
        for adjustment in _JITTERS:
            value = getattr(self, adjustment.name)
            if isinstance(value, tuple | list):
                ranges[adjustment.name] = (float(value[0]), float(value[1]))
            else:
                ranges[adjustment.name] = adjustment.range_of(value) if value else None
        return ranges

    def draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        on = rng.random(n) < self.p
        params = {}
        for adjustment in _JITTERS:
            bounds, identity = self.ranges[adjustment.name], adjustment.identity
            params[adjustment.name] = np.where(on, rng.uniform(*bounds, n), identity) if bounds else np.full(n, identity)
        return params | {"order": rng.integers(0, len(_ORDERS), n).astype(np.float64)}

    def apply(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each round applies, to each sample, the adjustment its order puts there."""
        orders = _ORDERS[params["order"].round().long().cpu().numpy()]
        active = [i for i, adjustment in enumerate(_JITTERS) if self.ranges[adjustment.name] is not None]
        for position in range(len(_JITTERS)):
            for op in active:
                adjust, values = _JITTERS[op].batch, params[_JITTERS[op].name]
                rows = np.flatnonzero(orders[:, position] == op)
                if len(rows) == len(x):
                    x = adjust(x, values)
                elif len(rows):
                    index = torch.from_numpy(rows).to(x.device)
                    x = x.index_copy(0, index, adjust(x[index], values[index]))
        return x

    def apply_image(self, x: np.ndarray, p: dict[str, float], spare: np.ndarray) -> np.ndarray:
        for op in _ORDERS[int(p["order"])]:
            adjustment = _JITTERS[op]
            if self.ranges[adjustment.name] is not None:
                x, spare = adjustment.image(x, p[adjustment.name], spare)
        return x

    def encode(self, values: dict[str, np.ndarray], n: int) -> Encoded:
        """The adjustments that are on, each sample's in its drawn order, and their values."""
        orders = _ORDERS[values["order"].round().astype(np.int64)]  # (n, 4) indices into _JITTERS
        on = np.array([self.ranges[adjustment.name] is not None for adjustment in _JITTERS])[orders]
        drawn = np.stack([values[adjustment.name] for adjustment in _JITTERS], axis=1)
        k = int(on[0].sum()) if n else 0
        return (_JITTER_CODES[orders][on].reshape(n, k),
                slots(np.take_along_axis(drawn, orders, axis=1)[on].reshape(n, k)))


def to_grayscale(x: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """Samples where ``on`` is 1 become gray (luma in all three channels)."""
    w = on.view(-1, 1, 1, 1)
    return x * (1 - w) + gray(x) * w


@dataclass(frozen=True)
class Grayscale:
    """Gray (luma in all three channels) with probability ``p`` per sample."""

    p: float = 0.1

    def draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"on": (rng.random(n) < self.p).astype(np.float64)}

    def apply(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return to_grayscale(x, params["on"])

    def apply_image(self, x: np.ndarray, p: dict[str, float], spare: np.ndarray) -> np.ndarray:
        return cv2.transform(x, _GRAY_ROWS, dst=spare) if p["on"] else x

    def encode(self, values: dict[str, np.ndarray], n: int) -> Encoded:
        return np.full((n, 1), opcodes.GRAYSCALE, np.int32), slots(values["on"][:, None])


def gaussian_blur(x: torch.Tensor, kernel_size: int, sigma: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian blur, ``sigma`` per sample (0: untouched), reflected borders."""
    n, c, h, w = x.shape
    radius = kernel_size // 2
    offsets = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    s = sigma.to(x.dtype).view(-1, 1)
    kernel = torch.where(s > 0, torch.exp(-0.5 * (offsets / s.clamp(min=1e-6)) ** 2), (offsets == 0).to(x.dtype))
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # (n * c, k)
    flat = F.pad(x.reshape(1, n * c, h, w), (radius, radius, radius, radius), mode="reflect")
    flat = F.conv2d(flat, kernel.view(n * c, 1, 1, -1), groups=n * c)
    flat = F.conv2d(flat, kernel.view(n * c, 1, -1, 1), groups=n * c)
    return flat.view(n, c, h, w)


@dataclass(frozen=True)
class GaussianBlur:
    """Gaussian blur with ``sigma`` drawn in the range per sample, with probability ``p`` (no native form:
    a Loader with a blur augments with apply_image)."""

    kernel_size: int = 9
    sigma: tuple[float, float] = (0.1, 2.0)
    p: float = 0.5

    def __post_init__(self) -> None:
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, got {self.kernel_size}")

    def draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"sigma": np.where(rng.random(n) < self.p, rng.uniform(*self.sigma, n), 0.0)}

    def apply(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return gaussian_blur(x, self.kernel_size, params["sigma"])

    def apply_image(self, x: np.ndarray, p: dict[str, float], spare: np.ndarray) -> np.ndarray:
        if p["sigma"] <= 0:
            return x
        size = (self.kernel_size, self.kernel_size)  # torch's "reflect" padding is OpenCV's REFLECT_101
        return cv2.GaussianBlur(x, size, dst=spare, sigmaX=p["sigma"], sigmaY=p["sigma"],
                                borderType=cv2.BORDER_REFLECT_101)


@dataclass(frozen=True)
class Normalize:
    """(x - mean) / std per channel; no randomness. Defaults: ImageNet's."""

    mean: Sequence[float] = (0.485, 0.456, 0.406)
    std: Sequence[float] = (0.229, 0.224, 0.225)

    def draw(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {}

    def apply(self, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        mean = x.new_tensor(self.mean).view(1, -1, 1, 1)
        scale = 1 / x.new_tensor(self.std).view(1, -1, 1, 1)
        return (x - mean) * scale

    def apply_image(self, x: np.ndarray, p: dict[str, float], spare: np.ndarray) -> np.ndarray:
        # one 3x4 colour transform: numpy broadcasting over a last axis of 3 took ~300 us here
        scale, offset = self._scale_offset()
        matrix = np.concatenate([np.diag(scale), offset[:, None]], axis=1)
        return cv2.transform(x, matrix.astype(np.float32), dst=x)  # in place: each pixel from itself alone

    def encode(self, values: dict[str, np.ndarray], n: int) -> Encoded:
        row = np.concatenate(self._scale_offset())
        return np.full((n, 1), opcodes.NORMALIZE, np.int32), np.broadcast_to(row, (n, 1, PARAMS))

    def _scale_offset(self) -> tuple[np.ndarray, np.ndarray]:
        """x * scale + offset per channel, in float64: 1 / std and -mean / std."""
        scale = 1 / np.asarray(self.std, np.float64)
        return scale, -np.asarray(self.mean, np.float64) * scale


PHOTOMETRIC = (ColorJitter, Grayscale, GaussianBlur, Normalize)
NATIVE = (ColorJitter, Grayscale, Normalize)  # the ops with an encoding for the native kernels
