"""A small, realistic sample photo set in ImageFolder layout, for ``make demo``, tests and benchmarks.

Synthetic noise images compress unlike photos, so every image here is a randomly cropped,
flipped, colour-shifted and slightly noisy view of one of the real photographs bundled in
scikit-image's wheel (nothing is downloaded). Class ``i`` is drawn from source photo
``i % len(SOURCES)``, so classes look different from each other.
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from PIL import Image

# Bundled skimage.data photos, most distinct first (a default 10-class set uses the first 10).
# Each picks the photo out of what the skimage.data function returns.
SOURCES: dict[str, Callable[[Any], np.ndarray]] = {
    "astronaut": lambda d: d.astronaut(),
    "coffee": lambda d: d.coffee(),
    "chelsea": lambda d: d.chelsea(),
    "rocket": lambda d: d.rocket(),
    "hubble_deep_field": lambda d: d.hubble_deep_field(),
    "retina": lambda d: d.retina(),
    "motorcycle": lambda d: d.stereo_motorcycle()[0],
    "immunohistochemistry": lambda d: d.immunohistochemistry(),
    "camera": lambda d: d.camera(),
    "coins": lambda d: d.coins(),
    "grass": lambda d: d.grass(),
    "gravel": lambda d: d.gravel(),
    "brick": lambda d: d.brick(),
    "moon": lambda d: d.moon(),
    "clock": lambda d: d.clock(),
    "cell": lambda d: d.cell(),
}

# Output (width, height) and how often each is drawn: mostly landscape, like ImageNet photos.
SIZES = ((500, 375), (375, 500), (500, 333))
SIZE_PROBS = (0.7, 0.15, 0.15)

# Std-dev of the luma noise, in 8-bit levels. Noise is what sets the JPEG size: at 3.0 and
# quality 90, 200 images average ~XX KB (measured), in the range of real 500x375 photos.
NOISE_SIGMA = 8.0

# Sources are shrunk once to this longest side: enough for a 500 px output, and resizing a
# crop of the 1411 px retina photo would otherwise cost more than the whole rest of an image.
MAX_SOURCE_SIDE = 640


def _import_skimage_data() -> Any:
    """skimage is an optional extra; fail with the install hint rather than a bare ImportError."""
    try:
        import skimage.data
    except ImportError as exc:
        raise ImportError(
            "make_sample_photos needs scikit-image for its bundled photos: "
            "pip install 'stoker[sample]'"
        ) from exc
    return skimage.data


def _render(source: Image.Image, rng: np.random.Generator, quality: int) -> bytes:
    """One JPEG: random crop/scale/aspect of `source`, resize, flip, colour shift, noise."""
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
    pixels = np.asarray(img.point(lut.ravel().tolist()), dtype=np.int16)

    # Sensor-like noise on luma only (chroma is subsampled by JPEG anyway); cheaper than RGB.
    noise = rng.standard_normal((out_h, out_w, 1), dtype=np.float32) * NOISE_SIGMA
    pixels += noise.round().astype(np.int16)
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

    Images go round-robin to ``class_00``.. and are named ``img_000000.jpg``.. by global
    index. Image ``i`` depends only on ``(seed, i)``, so output is byte-identical for a seed,
    and a rerun on the same folder (including an interrupted one, or a larger `count`) only
    writes the missing files. Raises FileExistsError if dst holds JPEGs of another layout or
    settings, rather than mixing two sample sets.
    """
    if count < 0 or num_classes < 1 or seed < 0:
        raise ValueError("need count >= 0, num_classes >= 1 and seed >= 0")
    data = _import_skimage_data()
    dst = pathlib.Path(dst)
    class_width = max(2, len(str(num_classes - 1)))
    index_width = max(6, len(str(count - 1)))
    paths = [
        dst / f"class_{i % num_classes:0{class_width}d}" / f"img_{i:0{index_width}d}.jpg"
        for i in range(count)
    ]

    unexpected = set(dst.glob("*/*.jpg")) - set(paths)
    if unexpected:
        raise FileExistsError(
            f"{dst} holds {len(unexpected)} JPEGs that are not part of this sample "
            f"(e.g. {min(unexpected)}); use an empty folder"
        )

    sources: dict[int, Image.Image] = {}
    names = list(SOURCES)

    def render(i: int) -> bytes:
        k = (i % num_classes) % len(names)
        if k not in sources:
            photo = Image.fromarray(SOURCES[names[k]](data)).convert("RGB")
            photo.thumbnail((MAX_SOURCE_SIDE, MAX_SOURCE_SIDE), Image.Resampling.LANCZOS)
            sources[k] = photo
        return _render(sources[k], np.random.default_rng((seed, i)), quality)

    exists = [path.exists() for path in paths]
    todo = [i for i, done in enumerate(exists) if not done]
    if len(todo) < count:
        # Spot-check one existing file: other seed/quality settings would differ in its bytes.
        i = exists.index(True)
        if paths[i].read_bytes() != render(i):
            raise FileExistsError(
                f"{paths[i]} differs from what seed={seed}, quality={quality} makes; "
                "use an empty folder"
            )

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
