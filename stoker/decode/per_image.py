"""Decode fused with the crop: each image decoded at the smallest DCT scale its crop allows, cut,
resized and flipped straight into its slot of the batch.

JPEGs are decoded by stoker's small libjpeg-turbo extension, which decodes only the rows and
columns the crop needs (``_jpeg_region.c``), or by simplejpeg where the extension is not built;
OpenCV resizes, except on the exact path (a translated Resize + CenterCrop), which ``_resample.c``
resizes as Pillow does. All release the GIL, so threads decode in parallel. Other formats, and JPEGs
that cannot be turned into RGB (CMYK), go through Pillow. Measured here on the sample photos
(500x375, q90, one core): simplejpeg with fastdct 0.74 ms per image, Pillow 0.98 ms.
"""

from __future__ import annotations

import io
import math
import mmap
from collections.abc import Callable

import cv2
import numpy as np
import PIL
import simplejpeg
from PIL import Image

from stoker.decode.crops import RESAMPLE_FILTERS, CropSpec, crop_box, exact_resize, pads
from stoker.decode.scratch import thread_buffer
from stoker.pixels import check_pixels, native_limit, pixel_limit

decode_region: Callable[..., tuple[int, int, int, int]] | None  # None: the extension is not built
try:  # built where libjpeg's headers were found (see setup.py); without it, whole images are decoded
    from stoker.decode._jpeg_region import RestartTableError, decode_region
except ImportError:
    decode_region = None

    class RestartTableError(ValueError):  # type: ignore[no-redef]  # the extension's, raised by it alone
        """A restart table that does not match its JPEG (read only by the missing extension)."""

resize_crop: Callable[..., None] | None  # None: not built (no C compiler); Pillow resizes instead
try:
    from stoker.decode._resample import resize_crop
except ImportError:
    resize_crop = None

_JPEG_MAGIC = b"\xff\xd8"
# A strip JPEG is the header and parts of the scan, each row ending in a 2-byte marker, as in the file.
_STRIP_SLACK = 64
_RGB_COLORSPACES = ("Gray", "YCbCr", "RGB")
# The order of the installed Pillow's two resize passes (pillow_resample.h): the exact path's pixels are its.
PILLOW_PASSES = 1 if int(PIL.__version__.split(".")[0]) >= 13 else 0


def decode_into(data: bytes | memoryview, spec: CropSpec, tries: np.ndarray, flip: bool, out: np.ndarray,
                restarts: bool = False) -> None:
    """Decode ``data``, crop as ``spec`` and ``tries`` say, and write the result into ``out`` (H, W, 3 uint8).
    ``restarts``: JPEGs may carry the restart table of ``stoker pack --restart-rows``; then only
    the MCU rows and restart intervals around the crop are decoded. A JPEG the fast decoders
    refuse (libjpeg's warnings, such as stray bytes before a marker, are errors to them) goes to
    Pillow, which decides as ShardDataset's decode does. An image above the pixel budget
    (stoker/pixels.py) raises DecompressionBombError, before its pixels are allocated."""
    if data[:2] == _JPEG_MAGIC:
        try:
            if _decode_jpeg_into(data, spec, tries, flip, out, restarts):
                return
        except RestartTableError:
            raise  # stoker's own table disagrees with the file: damage, whatever Pillow makes of it
        except (ValueError, RuntimeError):
            pass
    with Image.open(io.BytesIO(data)) as pil:
        width, height = pil.size
        if spec.exact or pads(spec, height, width):
            _resample_exact(np.asarray(pil.convert("RGB")), spec, flip, out)
            return
        box = crop_box(spec, height, width, tries)
        scale = _dct_scale(spec, box)
        pil.draft("RGB", (math.ceil(width / scale), math.ceil(height / scale)))  # JPEG only: reduced DCT scale
        image = np.asarray(pil.convert("RGB"))
    _crop_resize(image, (0, 0), image.shape[:2], (height, width), box, flip, out)


def _decode_jpeg_into(data: bytes | memoryview, spec: CropSpec, tries: np.ndarray, flip: bool, out: np.ndarray,
                      restarts: bool) -> bool:
    """:func:`decode_into` with libjpeg-turbo (the region decode, or simplejpeg); False for a JPEG
    that is not RGB, YCbCr or gray (CMYK), which Pillow converts."""
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    limit = pixel_limit()
    check_pixels(width, height, limit)  # the buffer below is the header's size
    if colorspace not in _RGB_COLORSPACES:
        return False
    buffer = thread_buffer("decode", height * width * 3)
    if spec.exact or pads(spec, height, width):  # Pillow's IDCT and upsampling (no fast modes), the whole image
        _resample_exact(simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buffer), spec, flip, out)
        return True
    box = crop_box(spec, height, width, tries)
    if box == (0, 0, height, width) and out.shape[:2] == (height, width) and out.flags.c_contiguous:
        # the whole image at its own size (video frames passed through): decode into place;
        # measured here, 240 instead of 370 us per 320x240 frame (no resize that only copies)
        simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True, buffer=out)
        if flip:
            cv2.flip(out, 1, dst=out)
        return True
    scale = _dct_scale(spec, box)
    scaled = math.ceil(height / scale), math.ceil(width / scale)  # libjpeg's size at 1/scale
    if decode_region is not None:
        strip = thread_buffer("strip", len(data) + _STRIP_SLACK) if restarts else None
        image, origin = _decode_region(decode_region, data, height, width, box, scale, buffer, strip, limit)
    else:
        image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                       min_height=scaled[0], min_width=scaled[1], buffer=buffer)
        origin = (0, 0)
    _crop_resize(image, origin, scaled, (height, width), box, flip, out)
    return True


def crop_into(image: np.ndarray, spec: CropSpec, tries: np.ndarray, flip: bool, out: np.ndarray) -> None:
    """Crop an already decoded (H, W, 3) ``image`` as ``spec`` and ``tries`` say into ``out``, as :func:`decode_into`."""
    box = crop_box(spec, image.shape[0], image.shape[1], tries)
    _crop_resize(image, (0, 0), image.shape[:2], image.shape[:2], box, flip, out)


def _resample_exact(image: np.ndarray, spec: CropSpec, flip: bool, out: np.ndarray) -> None:
    """Resize the whole decoded ``image`` as torchvision's Resize does on a PIL image (Pillow's
    antialiased filter, ``spec.interpolation``) and cut ``spec``'s crop into ``out``
    (``CropSpec.exact``), zeros where CenterCrop pads: the bytes of the installed Pillow's resize +
    crop (its order of passes: ``PILLOW_PASSES``), computed by ``_resample.c`` for the crop's pixels
    only (measured on the sample photos, bilinear: 445 instead of Pillow's ~780 us), or by Pillow
    where that extension is not built. The Loader's native path makes the same bytes (``exact_crop``
    in decode_chunk.c: the same decode, the same C source for the resize)."""
    resized_h, resized_w, top, left = exact_resize(spec, image.shape[0], image.shape[1])
    out_h, out_w = out.shape[:2]
    if resize_crop is not None and image.flags.c_contiguous and out.flags.c_contiguous:
        resize_crop(image, image.shape[0], image.shape[1], resized_h, resized_w, top, left, out, out_h, out_w,
                    RESAMPLE_FILTERS.index(spec.interpolation), PILLOW_PASSES)
    else:  # Pillow's crop fills what lies outside the image with zeros, as CenterCrop's padding
        resized = Image.fromarray(image).resize((resized_w, resized_h), Image.Resampling[spec.interpolation.upper()])
        out[...] = np.asarray(resized.crop((left, top, left + out_w, top + out_h)))
    if flip:
        cv2.flip(out, 1, dst=out)


def _dct_scale(spec: CropSpec, box: tuple[int, int, int, int]) -> int:
    """The largest power-of-two reduction (1, 2, 4, 8) at which the crop ``box`` still has at least
    the output's pixels. libjpeg-turbo also scales by other M/8, but measured here those are slower
    than a full decode (6/8: 1,110 us, 7/8: 1,027 us, full: 690 us, 1/2: 739 us, 1/4: 673 us per
    photo), so only powers of two are asked for."""
    out_h, out_w = spec.size
    _, _, ch, cw = box
    scale = 1
    while scale < 8 and ch >= 2 * scale * out_h and cw >= 2 * scale * out_w:
        scale *= 2
    return scale


def _decode_region(decode: Callable[..., tuple[int, int, int, int]], data: bytes | memoryview, height: int, width: int,
                   box: tuple[int, int, int, int], scale: int, buffer: mmap.mmap,
                   strip: mmap.mmap | None, limit: int | None) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode only the rows and iMCU columns around ``box`` at 1/``scale`` with ``decode`` (the
    extension's ``decode_region``): the block, and where its top-left pixel lies in the whole image
    at that scale. Bit-exact with simplejpeg's full decode (fastdct, fastupsample); measured here
    ~600 instead of ~750 us per photo for RandomResizedCrop boxes: rows above the box are still
    entropy-decoded, which is most of the cost. ``limit``: the pixel budget, which the extension
    checks again on the header libjpeg reads.

    With ``strip`` (a buffer to build a strip JPEG in), a JPEG with a restart table is entropy-decoded
    only from the restart marker above the box and in the restart intervals across it: ~0.75x the
    time of the above on the sample photos (rough: 570 against 760 us, one core, a busy machine).
    The pixels stay the same: with the fast IDCT and no fancy upsampling every output pixel depends
    on its own MCU's blocks only (per-block IDCT; chroma replicated, never interpolated, for every
    sampling factor: libjpeg-turbo's plain and merged upsamplers), so a strip that starts and ends
    at MCU boundaries decodes each MCU it holds as the whole file does."""
    top, left, ch, cw = box
    # One source row and column past the box: the resize below may round up to them.
    region = (top, left, min(height - top, ch + scale), min(width - left, cw + scale))
    rows, cols, dy, dx = decode(data, *region, scale, buffer, *(() if strip is None else (strip,)),
                                max_pixels=native_limit(limit))
    block = np.frombuffer(buffer, np.uint8, rows * cols * 3).reshape(rows, cols, 3)
    return block, (top // scale - dy, left // scale - dx)


def _crop_resize(image: np.ndarray, origin: tuple[int, int], scaled: tuple[int, int], size: tuple[int, int],
                 box: tuple[int, int, int, int], flip: bool, out: np.ndarray) -> None:
    """Cut ``box`` (full-resolution pixels of an image of ``size``) out of ``image``, a part of that
    image decoded at ``scaled`` size whose top-left pixel is at ``origin``; resize into ``out``, flip."""
    top, left, ch, cw = box
    sy, sx = scaled[0] / size[0], scaled[1] / size[1]
    y0, x0 = int(top * sy), int(left * sx)
    y1, x1 = max(y0 + 1, round((top + ch) * sy)), max(x0 + 1, round((left + cw) * sx))
    oy, ox = origin
    block = image[y0 - oy : y1 - oy, x0 - ox : x1 - ox]
    # Bilinear is close to an antialiased filter while a crop shrinks by less than 2x. An axis that
    # shrinks more is first halved (a bilinear resize to exactly half averages pixel pairs: a 2:1
    # box filter; an odd last row or column is dropped), as the power-of-two DCT scale halves both
    # axes at once; a crop can still shrink 2x or more on one axis after it (wide or tall crops,
    # and small outputs: 22% of RandomResizedCrop's crops at 160 px). Measured here, 160 px from a
    # 250x400 crop: ~90 us, where OpenCV's INTER_AREA, used before, took ~430.
    out_h, out_w = out.shape[:2]
    while block.shape[0] >= 2 * out_h or block.shape[1] >= 2 * out_w:
        fy, fx = (2 if block.shape[0] >= 2 * out_h else 1), (2 if block.shape[1] >= 2 * out_w else 1)
        h, w = block.shape[0] // fy, block.shape[1] // fx
        block = cv2.resize(block[: h * fy, : w * fx], (w, h), interpolation=cv2.INTER_LINEAR)
    cv2.resize(block, (out_w, out_h), dst=out, interpolation=cv2.INTER_LINEAR)
    if flip:
        cv2.flip(out, 1, dst=out)
