"""stoker.decode._resample: Pillow's antialiased resize (each of its filters), cut to a crop and
padded with zeros outside the resize, checked byte for byte against Pillow itself, and the Loader's
exact path (a translated Resize + CenterCrop) built on it.

Pillow resizes in two passes with 8-bit rounding in between. Every Pillow before 13 runs the
horizontal pass first; Pillow 13 runs the vertical one first where the height shrinks by more than
twice as many pixels as the width. The extension takes the order as an argument (``passes``); the
references here are two one-axis resizes in either order, and a single ``resize`` of the installed
Pillow, whose order per_image.PILLOW_PASSES names.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.decode import per_image
from stoker.decode.crops import RESAMPLE_FILTERS, exact_resize
from stoker.decode.per_image import PILLOW_PASSES

_resample = pytest.importorskip("stoker.decode._resample", reason="C extension not built (no C compiler?)")
resize_crop = _resample.resize_crop
BILINEAR = Image.Resampling.BILINEAR


def _pillow(image: np.ndarray, resized: tuple[int, int], top: int, left: int, out: tuple[int, int],
            passes: str = "horizontal first", interpolation: str = "bilinear") -> np.ndarray:
    """Pillow's resize to ``resized`` (height, width) then crop (zeros outside the resize); as two
    one-axis resizes in the order ``passes`` says, or (``installed``) as the installed Pillow's ``resize``."""
    pil, mode = Image.fromarray(image), Image.Resampling[interpolation.upper()]
    (height, width), (resized_h, resized_w) = image.shape[:2], resized
    if passes == "horizontal first":
        pil = pil.resize((resized_w, height), mode) if resized_w != width else pil
        pil = pil.resize((resized_w, resized_h), mode) if resized_h != height else pil
    elif passes == "vertical first":
        pil = pil.resize((width, resized_h), mode) if resized_h != height else pil
        pil = pil.resize((resized_w, resized_h), mode) if resized_w != width else pil
    else:
        pil = pil.resize((resized_w, resized_h), mode)
    return np.asarray(pil.crop((left, top, left + out[1], top + out[0])))


def _ours(image: np.ndarray, resized: tuple[int, int], top: int, left: int, out: tuple[int, int],
          interpolation: str = "bilinear", passes: int = 0) -> np.ndarray:
    result = np.full((*out, 3), 7, np.uint8)
    resize_crop(image, image.shape[0], image.shape[1], *resized, top, left, result, *out,
                RESAMPLE_FILTERS.index(interpolation), passes)
    return result


def _image(height: int, width: int, seed: int) -> np.ndarray:
    """Noise on gradients: neighbouring pixels differ, so a wrong tap or weight shows."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx * 7 + yy * 3) % 256], -1)
    return (base // 2 + rng.integers(0, 128, (height, width, 3))).astype(np.uint8)


@pytest.mark.parametrize("interpolation", RESAMPLE_FILTERS)
def test_random_sizes_and_crops_are_pillows_bytes(interpolation):
    """Every filter, both orders of passes, crops inside the resize and (a quarter) partly or wholly
    outside it, where Pillow's crop pads with zeros as CenterCrop does."""
    rng = np.random.default_rng(RESAMPLE_FILTERS.index(interpolation))
    for trial in range(100 if interpolation == "bilinear" else 40):
        height, width = (int(v) for v in rng.integers(1, 700, 2))
        resized = tuple(int(v) for v in rng.integers(1, 500, 2))  # upscales, downscales up to ~700x, mixed
        out = int(rng.integers(1, resized[0] + 1)), int(rng.integers(1, resized[1] + 1))
        top, left = int(rng.integers(0, resized[0] - out[0] + 1)), int(rng.integers(0, resized[1] - out[1] + 1))
        if trial % 4 == 3:
            out = out[0] + int(rng.integers(0, 40)), out[1] + int(rng.integers(0, 40))
            top, left = top - int(rng.integers(0, out[0] + 10)), left - int(rng.integers(0, out[1] + 10))
        image = _image(height, width, trial)
        case = (height, width, resized, top, left, out)
        horizontal_first = _ours(image, resized, top, left, out, interpolation, passes=0)
        assert np.array_equal(horizontal_first, _pillow(image, resized, top, left, out, "horizontal first",
                                                        interpolation)), case
        pillow_13 = _ours(image, resized, top, left, out, interpolation, passes=1)
        vertical_first = height - resized[0] > max(0, 2 * (width - resized[1]))  # Pillow 13's rule
        assert np.array_equal(pillow_13, _pillow(image, resized, top, left, out, "vertical first" if vertical_first
                                                 else "horizontal first", interpolation)), case
        installed = pillow_13 if PILLOW_PASSES else horizontal_first
        assert np.array_equal(installed, _pillow(image, resized, top, left, out, "installed", interpolation)), case


@pytest.mark.parametrize("height, width, resized, top, left, out", [
    (375, 500, (256, 341), 16, 58, (224, 224)),     # Resize(256) + CenterCrop(224) of a sample photo
    (500, 375, (341, 256), 58, 16, (224, 224)),     # portrait
    (375, 500, (256, 341), 0, 0, (256, 341)),       # the whole resize (Resize((h, w)))
    (375, 500, (375, 500), 10, 20, (100, 100)),     # no resize: a plain crop
    (375, 500, (375, 250), 0, 0, (375, 250)),       # one axis only
    (375, 500, (256, 341), 255, 340, (1, 1)),       # the last pixel
    (375, 500, (256, 341), 0, 0, (1, 341)),         # the first row
    (40, 30, (300, 200), 100, 50, (150, 120)),      # upscaling 7x
    (3000, 2000, (256, 170), 16, 0, (224, 170)),    # shrinking ~12x: long filters
    (1, 1, (5, 7), 0, 0, (5, 7)),
    (500, 375, (341, 256), 58, -32, (224, 320)),    # CenterCrop((224, 320)) of a portrait: padded left and right
    (40, 30, (20, 15), -102, -105, (224, 224)),     # a small image padded on every side
    (40, 30, (20, 15), 30, 0, (10, 10)),            # a crop below the image: all padding
])
def test_edges_and_extremes_are_pillows_bytes(height, width, resized, top, left, out):
    image = _image(height, width, height * width)
    for interpolation in ("bilinear", "bicubic"):
        assert np.array_equal(_ours(image, resized, top, left, out, interpolation, PILLOW_PASSES),
                              _pillow(image, resized, top, left, out, "installed", interpolation))


def test_threads_give_the_same_bytes():
    """The GIL is released during the resize: threads run it at once, each with its own output."""
    image = _image(375, 500, 1)
    expected = _pillow(image, (256, 341), 16, 58, (224, 224), "installed")
    results: list[bool] = []

    def work() -> None:
        results.extend(np.array_equal(_ours(image, (256, 341), 16, 58, (224, 224), passes=PILLOW_PASSES), expected)
                       for _ in range(30))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 120


@pytest.mark.parametrize("args, message", [
    ((375, 500, 0, 341, 0, 0, 1, 1, 0, 0), "resize of a 375x500 image"),
    ((376, 500, 256, 341, 16, 58, 224, 224, 0, 0), "buffers of 562500 and 150528 bytes"),  # the image is too short
    ((2_000_000, 1, 256, 341, 16, 58, 224, 224, 0, 0), "resize of a 2000000x1 image"),  # sides over 2^20: could overflow
    ((375, 500, 256, 341, -2_000_000, 0, 224, 224, 0, 0), "crop at \\(-2000000, 0\\)"),  # offsets too
    ((375, 500, 256, 341, 16, 58, 224, 224, 5, 0), "with filter 5"),  # no such filter
    ((375, 500, 256, 341, 16, 58, 224, 224, 0, 2), "passes 2"),
])
def test_sizes_past_the_limits_a_short_buffer_or_an_unknown_filter_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        resize_crop(np.zeros((375, 500, 3), np.uint8), args[0], args[1], *args[2:6], np.zeros((224, 224, 3), np.uint8),
                    *args[6:])


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape, size, geometry", [
    ((375, 500), (224, 224), (256, 341, 16, 58)),
    ((500, 375), (224, 320), (341, 256, 58, -32)),  # CenterCrop pads the portrait's sides with 32 zero columns
], ids=["inside", "padded"])
def test_the_exact_crop_is_pillows_with_and_without_the_extension(interpolation, shape, size, geometry):
    """decode_into with an exact CropSpec (what a translated Resize + CenterCrop gets) gives Pillow's
    decode, resize and crop; Pillow's own resize, the path without the extension, gives the same bytes."""
    buffer = io.BytesIO()
    Image.fromarray(_image(*shape, 3)).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    spec = stoker.CropSpec("center", size, center_fraction=min(size) / 256, exact=True, interpolation=interpolation)
    resized_h, resized_w, top, left = exact_resize(spec, *shape)
    assert (resized_h, resized_w, top, left) == geometry
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    expected = _pillow(decoded, (resized_h, resized_w), top, left, size, "installed", interpolation)
    calls = []

    def counted(*args):  # the extension itself, counting calls: proof that this path ran it
        calls.append(args[:7])
        resize_crop(*args)

    outputs = []
    for extension in (counted, None):
        per_image.resize_crop = extension
        try:
            out = np.full((*size, 3), 7, np.uint8)
            per_image.decode_into(data, spec, np.zeros((10, 4)), False, out)
            outputs.append(out)
        finally:
            per_image.resize_crop = resize_crop
    assert [args[1:] for args in calls] == [(*shape, *geometry)]  # the extension ran once, the fallback not
    assert np.array_equal(outputs[0], expected) and np.array_equal(outputs[1], expected)
