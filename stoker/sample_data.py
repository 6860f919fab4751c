"""A small sample set of real photos in ImageFolder layout, for ``make demo``, tests and benchmarks.

Synthetic images compress unlike photos, so each image here is a random crop of one of the
real photographs that ship inside scikit-image's wheel (nothing is downloaded), resized to
ImageNet-like ~500x375, flipped, colour-shifted and given mild sensor-like grain so its JPEG
size and decode cost resemble a real photo's. Class ``i`` comes from ``SOURCES[i % len(SOURCES)]``,
so classes look different from each other.
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Iterable
from typing import Any

import numpy as np
from PIL import Image

from stoker.errors import StokerError
from stoker.ranges import SAMPLE_CLASSES, SAMPLE_COUNT, SAMPLE_SEED

# skimage.data photos whose files are bundled in the wheel, most distinct first (the default
# 10 classes use the first 10). Grayscale ones become RGB.
SOURCES = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "retina",
    "stereo_motorcycle",  # the left view
    "immunohistochemistry",
    "camera",
    "coins",
    "grass",
    "gravel",
    "brick",
    "moon",
    "clock",
    "cell",
)

# Output (width, height) and how often each is drawn: mostly landscape, like ImageNet photos.
SIZES = ((500, 375), (375, 500), (500, 333))
SIZE_PROBS = (0.7, 0.15, 0.15)

# Std-dev of the grain, in 8-bit levels, added equally to R, G and B (luma noise). The grain is
# what sets the JPEG size: at 8.0 and quality 90, 200 images average 74.0 KB (min 58, max 91;
# 74.3 KB over 1000), within the 60-100 KB of real ~500x375 photos. Without grain: 42.5 KB.
NOISE_SIGMA = 8.0

# Sources are shrunk once to this longest side: enough for a 500 px output, and resizing a
# crop of the 1411 px retina photo would otherwise cost more than all the rest of an image.
MAX_SOURCE_SIDE = 640

# The grain is drawn once per call with this much margin, and each image adds a randomly
# offset window of it: drawing 190k normals per image would take about a third of its time.
_GRAIN_MARGIN = 64
_GRAIN_SIDE = max(max(size) for size in SIZES) + _GRAIN_MARGIN


def _import_skimage_data() -> Any:
    """skimage is an optional extra; fail with the install hint rather than a bare ImportError."""
    try:
        import skimage.data
    except ImportError as exc:
        raise ImportError("make_sample_photos needs scikit-image for its bundled photos: pip install 'stoker[sample]'") from exc
    return skimage.data


def _load_source(data: Any, name: str) -> Image.Image:
    """One bundled photo as RGB, at most MAX_SOURCE_SIDE on its longest side."""
    pixels = getattr(data, name)()
    if isinstance(pixels, tuple):  # stereo_motorcycle: (left, right, disparity)
        pixels = pixels[0]
    photo = Image.fromarray(pixels).convert("RGB")
    photo.thumbnail((MAX_SOURCE_SIDE, MAX_SOURCE_SIDE), Image.Resampling.LANCZOS)
    return photo


def _render(source: Image.Image, grain: np.ndarray, rng: np.random.Generator, quality: int) -> bytes:
    """One JPEG: random crop of `source`, resize, flip, colour shift, grain."""
    out_w, out_h = SIZES[rng.choice(len(SIZES), p=SIZE_PROBS)]
    src_w, src_h = source.size
    # Crop 30-100% of the source area at the output's aspect (+-10%: photos aren't stretched),
    # shrunk to fit when the source has the other orientation.
    area = src_w * src_h * rng.uniform(0.3, 1.0)
    aspect = out_w / out_h * np.exp(rng.uniform(-0.1, 0.1))
    crop_w, crop_h = np.sqrt(area * aspect), np.sqrt(area / aspect)
    fit = max(1.0, crop_w / src_w, crop_h / src_h)
    crop_w, crop_h = min(src_w, crop_w / fit), min(src_h, crop_h / fit)  # min: float rounding
    x0 = rng.uniform(0, src_w - crop_w)
    y0 = rng.uniform(0, src_h - crop_h)
    img = source.resize(
        (out_w, out_h),
        Image.Resampling.BILINEAR,
        box=(x0, y0, x0 + crop_w, y0 + crop_h),
        reducing_gap=2.0,
    )
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    # Colour shift as one per-channel lookup table: channel gain times overall brightness.
    gains = rng.uniform(0.85, 1.15, size=3) * rng.uniform(0.8, 1.2)
    lut = np.clip(np.arange(256)[None, :] * gains[:, None], 0, 255).astype(np.uint8)
    img = img.point(lut.ravel().tolist())

    gy, gx = rng.integers(0, _GRAIN_MARGIN + 1, size=2)
    pixels = np.asarray(img) + grain[gy : gy + out_h, gx : gx + out_w, None]  # float32
    np.clip(pixels, 0, 255, out=pixels)

    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write via a temporary name and rename, so a kill never leaves a truncated JPEG."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def make_sample_photos(
    dst: str | os.PathLike,
    count: int = 1000,
    num_classes: int = 10,
    quality: int = 90,
    seed: int = 0,
    progress: bool = False,
) -> pathlib.Path:
    """Write `count` JPEG photos as dst/<class>/<name>.jpg and return dst.

    Image ``i`` goes to ``class_{i % num_classes:02d}/img_{i:06d}.jpg`` and depends only on
    ``(seed, i)``, so the output is byte-identical for a seed, and a rerun on the same folder
    (an interrupted one, or a larger `count`) writes only the missing files. Raises
    StokerError rather than mix sample sets when dst holds other JPEGs, or files made with
    another seed or quality (one existing file is regenerated and compared).
    """
    SAMPLE_COUNT.check(count)
    SAMPLE_CLASSES.check(num_classes)
    SAMPLE_SEED.check(seed)
    data = _import_skimage_data()
    dst = pathlib.Path(dst)
    class_width = max(2, len(str(num_classes - 1)))
    index_width = max(6, len(str(count - 1)))
    paths = [dst / f"class_{i % num_classes:0{class_width}d}" / f"img_{i:0{index_width}d}.jpg" for i in range(count)]
    unexpected = set(dst.glob("*/*.jpg")) - set(paths)
    if unexpected:
        raise StokerError(
            f"{dst} holds {len(unexpected)} JPEGs that are not part of this sample (e.g. {min(unexpected)}); use an empty folder"
        )

    grain = np.random.default_rng((seed, 1)).standard_normal((_GRAIN_SIDE, _GRAIN_SIDE), dtype=np.float32)
    grain *= NOISE_SIGMA
    grain += 0.5  # so that the truncating cast to uint8 rounds
    sources: dict[int, Image.Image] = {}

    def render(i: int) -> bytes:
        k = i % num_classes % len(SOURCES)
        if k not in sources:
            sources[k] = _load_source(data, SOURCES[k])
        return _render(sources[k], grain, np.random.default_rng((seed, 0, i)), quality)

    exists = [path.exists() for path in paths]
    todo = [i for i, done in enumerate(exists) if not done]
    if len(todo) < count:  # another seed or quality would change any file's bytes: check one
        i = exists.index(True)
        if paths[i].read_bytes() != render(i):
            raise StokerError(f"{paths[i]} differs from what seed={seed}, quality={quality} makes; use an empty folder")

    dst.mkdir(parents=True, exist_ok=True)
    for i in range(min(count, num_classes)):
        paths[i].parent.mkdir(exist_ok=True)
    indices: Iterable[int] = todo
    if progress:
        from tqdm import tqdm

        indices = tqdm(todo, desc="sample photos", unit="img")
    for i in indices:
        _write_atomic(paths[i], render(i))
    return dst
