"""Checks an image before it goes into a shard, and shrinks it when the pack caps the resolution."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

from stoker.pixels import check_pixels, pixel_limit
from stoker.sources.inputs import BadInput


@dataclass(frozen=True)
class ImageInfo:
    """What the header check found."""

    format: str
    width: int
    height: int
    mode: str


def inspect_image(data: bytes, *, full_decode: bool = False, max_pixels: int | None = None) -> ImageInfo:
    """Check that ``data`` is a whole, sane image; raise BadInput with the reason otherwise.

    The cheap check parses the header, bounds the pixel count (decompression bombs: more than
    ``max_pixels``, by default the pixel budget of stoker/pixels.py) and, for
    JPEG and PNG, checks that the end-of-image marker is present (truncation). Other formats
    (BMP, TIFF, WebP, PPM, ...) have no such marker and are rare in training sets, so they are
    always decoded. ``full_decode`` decodes every image, which also catches damage inside the
    compressed data that makes the decoder fail.
    """
    if not data:
        raise BadInput("empty file")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:  # above Pillow's limit, which may be lower than max_pixels
            raise BadInput(f"decompression bomb: {e}") from None
        except Image.UnidentifiedImageError:
            raise BadInput("not an image (no known image format)") from None
        except Exception as e:  # Pillow raises many types for garbage; all mean "not an image"
            raise BadInput(f"not a readable image ({type(e).__name__}: {e})") from None
        width, height = image.size
        if width <= 0 or height <= 0:
            raise BadInput(f"image has no pixels ({width}x{height})")
        try:
            check_pixels(width, height, pixel_limit() if max_pixels is None else max_pixels)
        except Image.DecompressionBombError as e:
            raise BadInput(str(e)) from None
        info = ImageInfo(image.format or "unknown", width, height, image.mode)
        if info.format == "JPEG":
            scan_start = image.tile[0][2] if image.tile else 0
            if data.rfind(b"\xff\xd9") < scan_start:
                raise BadInput("truncated JPEG (no end-of-image marker after the scan data)")
        elif info.format == "PNG" and data.rfind(b"IEND") < 0:
            raise BadInput("truncated PNG (no IEND chunk)")
        if full_decode or info.format not in ("JPEG", "PNG"):
            try:
                image.load()
            except Exception as e:
                raise BadInput(f"decode failed ({type(e).__name__}: {e})") from None
    return info


def shrink_image(data: bytes, info: ImageInfo, max_side: int, quality: int) -> bytes | None:
    """Re-encode as JPEG with the longer side at most ``max_side``; None when it already fits."""
    if max(info.width, info.height) <= max_side:
        return None
    scale = max_side / max(info.width, info.height)
    size = (max(1, round(info.width * scale)), max(1, round(info.height * scale)))
    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", size)  # JPEG: decode at a reduced DCT scale when that is enough
        image = image.convert("L" if image.mode in ("L", "I;16", "I") else "RGB")
        image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=quality)
    return out.getvalue()
