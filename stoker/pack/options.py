"""What a pack does to each input: how images are checked and re-encoded, how videos are stored."""

from __future__ import annotations

from dataclasses import dataclass

from stoker.pack.images import DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class ImageOptions:
    """How each image is checked and whether it is re-encoded; ``restart_rows``: sequential JPEGs
    transcoded losslessly with restart markers (see stoker/pack/restarts.py)."""

    max_side: int | None = None
    quality: int = 90
    verify_decode: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    restart_rows: bool = False


@dataclass(frozen=True)
class VideoOptions:
    """How each video is stored (see stoker/pack/videos.py): ``mode`` frames | video; in frames
    mode, resampled to ``fps`` (None: every frame), the short side resized to ``short_side``
    (None: as is), JPEG ``quality``; in video mode, re-encoded with a keyframe every ``gop``
    frames at x264 quality ``crf`` (None: the original bytes)."""

    mode: str = "frames"
    fps: float | None = None
    short_side: int | None = None
    quality: int = 90
    gop: int | None = None
    crf: int = 23
