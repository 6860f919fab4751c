"""Types of the photometric extension (_photometric.c, whose header says what it does)."""

from typing_extensions import Buffer

BRIGHTNESS: int
CONTRAST: int
SATURATION: int
HUE: int
GRAYSCALE: int
NORMALIZE: int
PARAMS: int

def apply_chunk(crops: Buffer, out: Buffer, ops: Buffer, params: Buffer, positions: Buffer) -> None: ...
