"""Types of the photometric extension (_photometric.c, whose header says what it does)."""

from typing_extensions import Buffer

BRIGHTNESS: int
CONTRAST: int
SATURATION: int
HUE: int
GRAYSCALE: int
NORMALIZE: int
PARAMS: int
BUILDS: tuple[str, ...]

def apply_chunk(crops: Buffer, out: Buffer, ops: Buffer, params: Buffer, positions: Buffer, *,
                build: str | None = None) -> None: ...
