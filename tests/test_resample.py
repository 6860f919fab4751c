"""stoker.loader._resample: Pillow's antialiased bilinear resize, cut to a crop, checked byte for
byte against Pillow itself, and the Loader's exact path (a translated Resize + CenterCrop) built on it.

Pillow resizes in two passes with 8-bit rounding in between. Every Pillow before 13 runs the
horizontal pass first; Pillow 13 runs the vertical one first for some sizes. The reference here is
Pillow's horizontal-then-vertical order (two one-axis resizes), which the extension reproduces
exactly; against a single ``resize`` of whatever Pillow is installed, pixels differ by at most 1.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.loader import decode_crop
from stoker.loader.crops import exact_resize

_resample = pytest.importorskip("stoker.loader._resample", reason="C extension not built (no C compiler?)")
resize_crop = _resample.resize_crop
BILINEAR = Image.Resampling.BILINEAR


def _pillow(image: np.ndarray, resized: tuple[int, int], top: int, left: int, out: tuple[int, int],
            horizontal_first: bool = True) -> np.ndarray:
    """Pillow's resize to ``resized`` (height, width) then crop; as two one-axis passes, horizontal first."""
    pil = Image.fromarray(image)
    (height, width), (resized_h, resized_w) = image.shape[:2], resized
    if horizontal_first:
        pil = pil.resize((resized_w, height), BILINEAR) if resized_w != width else pil
        pil = pil.resize((resized_w, resized_h), BILINEAR) if resized_h != height else pil
    else:
        pil = pil.resize((resized_w, resized_h), BILINEAR)
    return np.asarray(pil.crop((left, top, left + out[1], top + out[0])))


def _ours(image: np.ndarray, resized: tuple[int, int], top: int, left: int, out: tuple[int, int]) -> np.ndarray:
    result = np.full((*out, 3), 7, np.uint8)
    resize_crop(image, image.shape[0], image.shape[1], *resized, top, left, result, *out)
    return result


def _image(height: int, width: int, seed: int) -> np.ndarray:
    """Noise on gradients: neighbouring pixels differ, so a wrong tap or weight shows."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx * 7 + yy * 3) % 256], -1)
    return (base // 2 + rng.integers(0, 128, (height, width, 3))).astype(np.uint8)


def test_random_sizes_and_crops_are_pillows_bytes():
    rng = np.random.default_rng(0)
    for trial in range(300):
        height, width = (int(v) for v in rng.integers(1, 700, 2))
        resized = tuple(int(v) for v in rng.integers(1, 500, 2))  # upscales, downscales up to ~700x, mixed
        out = int(rng.integers(1, resized[0] + 1)), int(rng.integers(1, resized[1] + 1))
        top, left = int(rng.integers(0, resized[0] - out[0] + 1)), int(rng.integers(0, resized[1] - out[1] + 1))
        image = _image(height, width, trial)
        ours = _ours(image, resized, top, left, out)
        assert np.array_equal(ours, _pillow(image, resized, top, left, out)), (height, width, resized, top, left, out)
        installed = _pillow(image, resized, top, left, out, horizontal_first=False)
        assert np.abs(ours.astype(int) - installed).max() <= 1


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
])
def test_edges_and_extremes_are_pillows_bytes(height, width, resized, top, left, out):
    image = _image(height, width, height * width)
    assert np.array_equal(_ours(image, resized, top, left, out), _pillow(image, resized, top, left, out))


def test_threads_give_the_same_bytes():
    """The GIL is released during the resize: threads run it at once, each with its own output."""
    image = _image(375, 500, 1)
    expected = _pillow(image, (256, 341), 16, 58, (224, 224))
    results: list[bool] = []

    def work() -> None:
        results.extend(np.array_equal(_ours(image, (256, 341), 16, 58, (224, 224)), expected) for _ in range(30))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 120


@pytest.mark.parametrize("args, message", [
    ((375, 500, 256, 341, 40, 58, 224, 224), "crop at \\(40, 58\\) of a 256x341 resize"),  # past the bottom
    ((375, 500, 256, 341, -1, 0, 224, 224), "crop at \\(-1, 0\\)"),
    ((375, 500, 0, 341, 0, 0, 1, 1), "resize of a 375x500 image"),
    ((376, 500, 256, 341, 16, 58, 224, 224), "buffers of 562500 and 150528 bytes"),  # the image is too short
    ((2_000_000, 1, 256, 341, 16, 58, 224, 224), "resize of a 2000000x1 image"),  # sides over 2^20: sizes could overflow
])
def test_a_crop_outside_the_resize_or_a_short_buffer_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        resize_crop(np.zeros((375, 500, 3), np.uint8), args[0], args[1], *args[2:6], np.zeros((224, 224, 3), np.uint8),
                    *args[6:])


def test_the_exact_crop_is_pillows_with_and_without_the_extension():
    """decode_into with an exact CropSpec (what a translated Resize + CenterCrop gets) gives Pillow's
    decode, resize and crop; Pillow's own resize, the path without the extension, gives the same bytes."""
    buffer = io.BytesIO()
    Image.fromarray(_image(375, 500, 3)).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    spec = stoker.CropSpec("center", (224, 224), center_fraction=224 / 256, exact=True)
    resized_h, resized_w, top, left = exact_resize(spec, 375, 500)
    assert (resized_h, resized_w, top, left) == (256, 341, 16, 58)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    expected = _pillow(decoded, (256, 341), 16, 58, (224, 224))
    calls = []

    def counted(*args):  # the extension itself, counting calls: proof that this path ran it
        calls.append(args[:7])
        resize_crop(*args)

    outputs = []
    for extension in (counted, None):
        decode_crop.resize_crop = extension
        try:
            out = np.zeros((224, 224, 3), np.uint8)
            decode_crop.decode_into(data, spec, np.zeros((10, 4)), False, out)
            outputs.append(out)
        finally:
            decode_crop.resize_crop = resize_crop
    assert [args[1:] for args in calls] == [(375, 500, 256, 341, 16, 58)]  # the extension ran once, the fallback not
    assert np.array_equal(outputs[0], expected) and np.array_equal(outputs[1], expected)
