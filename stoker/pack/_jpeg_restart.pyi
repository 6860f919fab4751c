"""Types of the restart-marker transcode extension (_jpeg_restart.c, whose docstrings say what each does)."""

from typing_extensions import Buffer

class NotTranscodable(ValueError): ...

def transcode(data: Buffer, max_growth: float = 0.02) -> bytes: ...
