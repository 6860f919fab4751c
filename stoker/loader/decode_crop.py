"""Decode fused with the crop: each image decoded at the smallest DCT scale its crop allows, cut,
resized and flipped straight into its slot of the batch.

simplejpeg (libjpeg-turbo) decodes JPEGs and OpenCV resizes; both release the GIL, so threads
decode in parallel. Other formats, and JPEGs simplejpeg cannot turn into RGB (CMYK), go through
Pillow. Measured here on the sample photos (500x375, q90, one core): simplejpeg with fastdct
0.74 ms per image, Pillow 0.98 ms.
"""

from __future__ import annotations

import io
import math

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from stoker.loader.buffers import thread_buffer
from stoker.loader.crops import CropSpec, crop_box

# The loader runs its own threads; OpenCV's would only compete with them.
cv2.setNumThreads(1)
_JPEG_MAGIC = b"\xff\xd8"
_RGB_COLORSPACES = ("Gray", "YCbCr", "RGB")


def decode_into(data: bytes | memoryview, spec: CropSpec, tries: np.ndarray, flip: bool, out: np.ndarray) -> None:
    """Decode ``data``, crop as ``spec`` and ``tries`` say, and write the result into ``out`` (H, W, 3 uint8)."""
    if data[:2] == _JPEG_MAGIC:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace in _RGB_COLORSPACES:
            top, left, ch, cw = crop_box(spec, height, width, tries)
            min_h, min_w = _min_decode_size(spec, height, width, ch, cw)
            image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                           min_height=min_h, min_width=min_w, buffer=thread_buffer("decode", height * width * 3))
            _crop_resize(image, height, width, (top, left, ch, cw), flip, out)
            return
    with Image.open(io.BytesIO(data)) as pil:
        width, height = pil.size
        top, left, ch, cw = crop_box(spec, height, width, tries)
        min_h, min_w = _min_decode_size(spec, height, width, ch, cw)
        pil.draft("RGB", (min_w, min_h))  # JPEG only: reduced DCT scale, never below this size
        image = np.asarray(pil.convert("RGB"))
    _crop_resize(image, height, width, (top, left, ch, cw), flip, out)


def _min_decode_size(spec: CropSpec, height: int, width: int, ch: int, cw: int) -> tuple[int, int]:
    """The full-image size to decode at: the smallest power-of-two reduction (1, 1/2, 1/4, 1/8) at
    which the crop still has at least the output's pixels. libjpeg-turbo also scales by other M/8,
    but measured here those are slower than a full decode (6/8: 1,110 us, 7/8: 1,027 us, full:
    690 us, 1/2: 739 us, 1/4: 673 us per photo), so only powers of two are asked for."""
    out_h, out_w = spec.size
    needed = max(out_h / ch, out_w / cw)  # fraction of the full resolution the crop needs
    factor = 1.0
    while factor / 2 >= needed and factor > 1 / 8:
        factor /= 2
    return math.ceil(height * factor), math.ceil(width * factor)


def _crop_resize(image: np.ndarray, height: int, width: int, box: tuple[int, int, int, int], flip: bool,
                 out: np.ndarray) -> None:
    top, left, ch, cw = box
    sy, sx = image.shape[0] / height, image.shape[1] / width
    y0, x0 = int(top * sy), int(left * sx)
    y1, x1 = max(y0 + 1, round((top + ch) * sy)), max(x0 + 1, round((left + cw) * sx))
    # After a power-of-two DCT reduction a crop shrinks by less than 2x, where bilinear is close to
    # an antialiased filter; beyond 2x (small images through Pillow), area averaging keeps it so
    # (it costs ~6x bilinear here: 450 vs 75 us for a 224x224 output).
    shrink = max((y1 - y0) / out.shape[0], (x1 - x0) / out.shape[1])
    cv2.resize(image[y0:y1, x0:x1], (out.shape[1], out.shape[0]), dst=out,
               interpolation=cv2.INTER_AREA if shrink > 2 else cv2.INTER_LINEAR)
    if flip:
        cv2.flip(out, 1, dst=out)
