"""Types of the region-decode extension (_jpeg_region.c, whose docstrings say what each does)."""

from typing_extensions import Buffer

LIBJPEG_TURBO_VERSION: str
JPEG_LIB_VERSION: int

class RestartTableError(ValueError): ...

# `strip` may be left out, not passed as None: the extension takes only a writable buffer there.
def decode_region(data: Buffer, top: int, left: int, height: int, width: int, scale_denom: int,
                  out: Buffer, strip: Buffer = ..., *, max_pixels: int = ...) -> tuple[int, int, int, int]: ...
def decode_chunk(fds: Buffer, offsets: Buffer, sizes: Buffer, checksums: Buffer | None, tries: Buffer, flips: Buffer,
                 positions: Buffer, spec: tuple[int, int, int, float, float, float, float, float, bool, bool, int, int],
                 out: Buffer, status: Buffer, max_pixels: int) -> int: ...
