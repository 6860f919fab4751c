"""Types of the exact-resize extension (_resample.c, whose docstring says what it does)."""

from typing_extensions import Buffer

def resize_crop(src: Buffer, height: int, width: int, resized_height: int, resized_width: int, top: int, left: int,
                out: Buffer, out_height: int, out_width: int, filter: int,
                passes: int) -> None: ...
