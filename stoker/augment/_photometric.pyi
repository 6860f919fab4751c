"""Types of the photometric extension (_photometric.c and photometric_kernels.c, whose headers say what they do)."""

from typing_extensions import Buffer

BRIGHTNESS: int
CONTRAST: int
SATURATION: int
HUE: int
GRAYSCALE: int
NORMALIZE: int
PARAMS: int
GRAY: tuple[float, float, float]
BUILDS: tuple[str, ...]

def apply_chunk(crops: Buffer, out: Buffer, ops: Buffer, params: Buffer, positions: Buffer, *,
                build: str | None = None) -> None: ...
