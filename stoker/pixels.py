"""The pixel budget: the largest image, by pixel count, that any stoker decoder accepts.

A few KB of JPEG can claim 65,535 x 65,535 pixels (12.9 GB of RGB), so every decoder reads the
size from the header and refuses a larger image before it allocates anything for it: ``stoker
pack`` (the image is rejected), ShardDataset, the Loader's native and per-image decoders,
simplejpeg and Pillow, and the GPU decoder (CorruptDataError, which ``on_error="skip"`` skips).

The rule is Pillow's own, so that ShardDataset decodes exactly what ImageFolder decodes: above
``2 * PIL.Image.MAX_IMAGE_PIXELS`` pixels (178,956,970 by default) an image is a decompression
bomb. Setting ``PIL.Image.MAX_IMAGE_PIXELS`` is the one way to change it (``None``: no limit),
read by each decode in the process where it runs: set it where the script's module-level code
does, so that spawned worker processes set it too. A pack records the limit it used.
"""

from __future__ import annotations

from PIL import Image

# What the native decoders are told when there is no limit (their argument is a uint64).
NO_LIMIT = 2**64 - 1


def pixel_limit() -> int | None:
    """The most pixels an image may have in this process now: twice ``PIL.Image.MAX_IMAGE_PIXELS``
    (what ``Image.open`` refuses above), None where Pillow's limit is off."""
    limit = Image.MAX_IMAGE_PIXELS
    return None if limit is None else int(2 * limit)


def native_limit(limit: int | None) -> int:
    """``limit`` as the native decoders take it: a uint64, :data:`NO_LIMIT` for None."""
    return NO_LIMIT if limit is None else min(max(limit, 0), NO_LIMIT)


def too_many_pixels(width: int, height: int, limit: int | None) -> bool:
    """Whether an image of ``width`` x ``height`` is above ``limit`` pixels (None: no limit)."""
    return limit is not None and width * height > limit


def check_pixels(width: int, height: int, limit: int | None) -> None:
    """Raise Pillow's ``DecompressionBombError`` for an image of ``width`` x ``height`` above
    ``limit`` pixels (None: no limit), saying the size and the limit."""
    if too_many_pixels(width, height, limit):
        raise Image.DecompressionBombError(
            f"decompression bomb: {width}x{height} = {width * height} pixels, above the limit of {limit} "
            "(2 x PIL.Image.MAX_IMAGE_PIXELS)")
