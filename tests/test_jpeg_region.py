"""stoker.decode._jpeg_region: region-of-interest JPEG decode, checked against simplejpeg.

With the fast IDCT and fancy upsampling off (simplejpeg's fastdct/fastupsample), every output pixel
depends only on the blocks it lies in: the IDCT is per block and chroma is replicated, not
interpolated across block or iMCU boundaries. So skipping rows (jpeg_skip_scanlines) and cropping
iMCU columns (jpeg_crop_scanline) change no pixel, and the decoded block must equal the same place
of simplejpeg's full decode exactly, for baseline and progressive files alike.
"""

from __future__ import annotations

import io
import math
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import simplejpeg
from PIL import Image

_jpeg_region = pytest.importorskip("stoker.decode._jpeg_region", reason="C extension not built (no libjpeg headers?)")
decode_region = _jpeg_region.decode_region

SCALES = (1, 2, 4, 8)


def _encode(height: int, width: int, mode: str = "RGB", **save) -> bytes:
    """A JPEG of smooth gradients plus noise, so every block has AC coefficients."""
    rng = np.random.default_rng([height, width])
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx + yy) % 256], -1)
    pixels = (base // 2 + rng.integers(0, 128, (height, width, 3))).astype(np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **save)
    return buffer.getvalue()


# Sizes from 9 px up: on tinier images several DCT scales give the same output size and
# simplejpeg's min_height/min_width may pick another one than 1/s, so it is no reference there.
IMAGES = {
    "420_333x517": (333, 517, "RGB", {"subsampling": 2}),
    "444_333x517": (333, 517, "RGB", {"subsampling": 0}),
    "422_201x95": (201, 95, "RGB", {"subsampling": 1}),
    "gray_150x257": (150, 257, "L", {}),
    "progressive420_333x517": (333, 517, "RGB", {"subsampling": 2, "progressive": True}),
    "progressive444_64x80": (64, 80, "RGB", {"subsampling": 0, "progressive": True}),
    "420_17x9": (17, 9, "RGB", {"subsampling": 2}),
}


@pytest.fixture(scope="module")
def jpegs() -> dict[str, bytes]:
    return {name: _encode(h, w, mode, **save) for name, (h, w, mode, save) in IMAGES.items()}


def _reference(data: bytes, scale: int) -> np.ndarray:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    full = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                  min_height=math.ceil(height / scale), min_width=math.ceil(width / scale))
    assert full.shape[:2] == (math.ceil(height / scale), math.ceil(width / scale))
    return full


def _regions(rng: np.random.Generator, height: int, width: int, n: int):
    yield 0, 0, height, width
    yield height - 1, width - 1, 1, 1
    for _ in range(n):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def _decode(data: bytes, region, scale: int, out: bytearray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    rows, cols, dy, dx = result = decode_region(data, *region, scale, out)
    return np.frombuffer(out, np.uint8, rows * cols * 3).reshape(rows, cols, 3), result


@pytest.mark.parametrize("name", IMAGES)
def test_region_equals_full_decode(jpegs, name):
    data = jpegs[name]
    height, width = IMAGES[name][:2]
    rng = np.random.default_rng(len(data))
    for scale in SCALES:
        full = _reference(data, scale)
        out = bytearray(full.size + 64)  # the full scaled image's size always suffices
        for top, left, h, w in _regions(rng, height, width, 40):
            block, (rows, cols, dy, dx) = _decode(data, (top, left, h, w), scale, out)
            y0, x0 = top // scale, left // scale
            # the block covers the region at this scale, rows floor(top/s)..ceil((top+h)/s)
            assert dy == 0 and rows == min(math.ceil((top + h) / scale), full.shape[0]) - y0
            assert 0 <= dx <= x0 and cols - dx >= min(math.ceil((left + w) / scale), full.shape[1]) - x0
            np.testing.assert_array_equal(block, full[y0 - dy:y0 - dy + rows, x0 - dx:x0 - dx + cols],
                                          err_msg=f"{name} scale 1/{scale} region {(top, left, h, w)}")


def test_buffers(jpegs):
    data = jpegs["420_333x517"]
    full = _reference(data, 2)
    # read-only memoryview slices in, numpy arrays and memoryviews out; nothing written past the block
    out = np.full(full.size + 100, 77, np.uint8)
    rows, cols, dy, dx = decode_region(memoryview(b"xyz" + data)[3:], 101, 203, 50, 60, 2, out)
    assert (out[rows * cols * 3:] == 77).all()
    block = out[:rows * cols * 3].reshape(rows, cols, 3)
    np.testing.assert_array_equal(block, full[50:50 + rows, 101 - dx:101 - dx + cols])
    out2 = bytearray(rows * cols * 3)  # exactly the size needed
    assert decode_region(data, 101, 203, 50, 60, 2, memoryview(out2)) == (rows, cols, dy, dx)
    assert out2 == out[:rows * cols * 3].tobytes()
    assert decode_region(data, top=101, left=203, height=50, width=60, scale_denom=2, out=out2) == (rows, cols, dy, dx)


def _cmyk_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("CMYK", (40, 30), (10, 20, 30, 40)).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "make, region, scale, out_size, message",
    [
        (lambda d: d[: len(d) // 2], (0, 0, 333, 517), 1, None, "Premature end of JPEG file"),
        (lambda d: d[:200], (0, 0, 1, 1), 1, None, "Premature end of JPEG file"),
        (lambda d: bytes(range(256)) * 4, (0, 0, 1, 1), 1, None, "Not a JPEG file"),
        (lambda d: b"", (0, 0, 1, 1), 1, None, "Empty input"),
        # a libjpeg warning, which libjpeg alone would only count: strict mode makes it an error
        (lambda d: d[: len(d) // 2] + b"\xff\xd0\xff\xd5\xff\x12" + d[len(d) // 2 + 6 :], (0, 0, 333, 517), 1, None,
         "Corrupt JPEG data"),
        (lambda d: _cmyk_jpeg(), (0, 0, 1, 1), 1, None, "CMYK"),
        (lambda d: d, (0, 0, 333, 517), 1, 100, "needs 516483"),
        (lambda d: d, (300, 0, 40, 10), 1, None, "not inside the 333x517 image"),
        (lambda d: d, (0, 510, 10, 8), 1, None, "not inside"),
        (lambda d: d, (-1, 0, 10, 8), 1, None, "not inside"),
        (lambda d: d, (0, 0, 0, 8), 1, None, "not inside"),
        (lambda d: d, (2**62, 0, 2**62, 8), 1, None, "not inside"),
        (lambda d: d, (0, 0, 8, 8), 3, None, "scale_denom must be 1, 2, 4 or 8"),
    ],
    ids=["truncated", "truncated-header", "garbage", "empty", "corrupt", "cmyk", "small-out", "below", "right",
         "negative", "empty-region", "overflow", "scale"],
)
def test_errors(jpegs, make, region, scale, out_size, message):
    out = bytearray(out_size or 333 * 517 * 3)
    with pytest.raises(ValueError, match=message):
        decode_region(make(jpegs["420_333x517"]), *region, scale, out)


def test_garbage_never_crashes(jpegs):
    rng = np.random.default_rng(5)
    out = bytearray(333 * 517 * 3)
    seeds = [jpegs["420_333x517"], jpegs["progressive444_64x80"], jpegs["gray_150x257"]]
    for i in range(300):
        data = bytearray(seeds[i % len(seeds)])
        for at in rng.integers(2, len(data), 3):
            data[at] = int(rng.integers(0, 256))
        try:
            decode_region(bytes(data), 0, 0, 9, 9, int(rng.choice(SCALES)), out)
        except ValueError:
            pass


def test_threads_agree(jpegs):
    rng = np.random.default_rng(9)
    jobs = [(name, region, int(rng.choice(SCALES)))
            for name in ("420_333x517", "progressive420_333x517", "gray_150x257")
            for region in _regions(rng, *IMAGES[name][:2], 15)]
    size = 333 * 517 * 3

    def run() -> list[bytes]:
        out = bytearray(size)
        results = []
        for name, region, scale in jobs:
            rows, cols, dy, dx = decode_region(jpegs[name], *region, scale, out)
            results.append(bytes(out[:rows * cols * 3]) + bytes([dy, dx]))
        return results

    expected = run()
    results: list[list[bytes] | None] = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run())) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == expected for result in results)


# Run in a child with libjpeg-turbo's SIMD off (JSIMD_FORCENONE=1: its plain-C code, as on machines
# and builds without SIMD), where a region 1-4 px wide of a 4:2:0 or 4:2:2 JPEG (the merged
# upsampler) once crashed: jpeg_crop_scanline() re-initialized that upsampler as another kind,
# writing over its colour tables. Every Cr value 0..255 occurs, so any overwritten entry is read.
_NARROW_REGIONS = """
import io, sys
import numpy as np
from PIL import Image
from stoker.decode._jpeg_region import decode_region
height, width = 512, 40
ycc = np.full((height, width, 3), 128, np.uint8)
ycc[..., 2] = (np.arange(height) // 2)[:, None]
for subsampling in (2, 1):
    buffer = io.BytesIO()
    Image.fromarray(ycc, mode="YCbCr").save(buffer, "JPEG", quality=100, subsampling=subsampling)
    data = buffer.getvalue()
    out = bytearray(height * width * 3)
    for scale in (1, 2, 4, 8):
        rows, cols, _, _ = decode_region(data, 0, 0, height, width, scale, out)
        full = np.frombuffer(out, np.uint8, rows * cols * 3).reshape(rows, cols, 3).copy()
        for left in range(width):
            for w in range(1, min(4, width - left) + 1):
                rows, cols, dy, dx = decode_region(data, 0, left, height, w, scale, out)
                block = np.frombuffer(out, np.uint8, rows * cols * 3).reshape(rows, cols, 3)
                x0 = left // scale - dx
                assert (block == full[:, x0:x0 + cols]).all(), (subsampling, scale, left, w)
print("ok")
"""


def test_narrow_regions_without_simd():
    env = {**os.environ, "JSIMD_FORCENONE": "1", "PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    child = subprocess.run([sys.executable, "-c", _NARROW_REGIONS], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and child.stdout.strip() == "ok", (child.returncode, child.stderr[-2000:])
