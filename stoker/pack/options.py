"""What a pack does to each input: how images are checked and re-encoded, how videos are stored.

Each option is checked against its range (stoker/ranges.py) when the options are made, and
:func:`pack_options` refuses options that only apply to another mode, so a pack stops before it
lists or reads anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stoker.errors import OptionError
from stoker.pixels import pixel_limit
from stoker.ranges import CRF, FPS, GOP, MAX_SIDE, QUALITY, SHORT_SIDE

DEFAULT_QUALITY = 90
DEFAULT_CRF = 23  # x264's own default


@dataclass(frozen=True)
class ImageOptions:
    """How each image is checked and whether it is re-encoded; ``restart_rows``: sequential JPEGs
    transcoded losslessly with restart markers (see stoker/pack/restarts.py). ``max_pixels``: the
    pixel budget (stoker/pixels.py) where the pack starts, which its workers apply and its manifest
    records (None: Pillow's limit was off)."""

    max_side: int | None = None
    quality: int = DEFAULT_QUALITY
    verify_decode: bool = False
    max_pixels: int | None = field(default_factory=pixel_limit)
    restart_rows: bool = False

    def __post_init__(self) -> None:
        if self.max_side is not None:
            MAX_SIDE.check(self.max_side)
        QUALITY.check(self.quality)


@dataclass(frozen=True)
class VideoOptions:
    """How each video is stored (see stoker/pack/videos.py): ``mode`` frames | video; in frames
    mode, resampled to ``fps`` (None: every frame), the short side resized to ``short_side``
    (None: as is), JPEG ``quality``; in video mode, re-encoded with a keyframe every ``gop``
    frames at x264 quality ``crf`` (None: the original bytes)."""

    mode: str = "frames"
    fps: float | None = None
    short_side: int | None = None
    quality: int = DEFAULT_QUALITY
    gop: int | None = None
    crf: int = DEFAULT_CRF

    def __post_init__(self) -> None:
        if self.mode not in ("frames", "video"):
            raise OptionError(f"video_mode={self.mode!r} (--video-mode): must be 'frames' or 'video'")
        for option, value in ((FPS, self.fps), (SHORT_SIDE, self.short_side), (GOP, self.gop)):
            if value is not None:
                option.check(value)
        QUALITY.check(self.quality)
        CRF.check(self.crf)


def pack_options(video_mode: str | None, max_side: int | None, quality: int | None, verify_decode: bool,
                 fps: float | None, short_side: int | None, gop: int | None,
                 crf: int | None, restart_rows: bool = False) -> tuple[ImageOptions, VideoOptions | None]:
    """The options of a pack, each in its range and none that only applies to another mode (None:
    not given). Images: ``max_side``, with ``quality`` for the images it re-encodes, and
    ``verify_decode`` and ``restart_rows``. Videos in frames mode: ``fps``, ``short_side``, ``quality``; in video mode:
    ``gop``, with ``crf`` for its re-encode. OptionError names the option and the mode it needs."""
    given = {"max_side": max_side, "quality": quality, "verify_decode": verify_decode or None, "fps": fps,
             "short_side": short_side, "gop": gop, "crf": crf, "restart_rows": restart_rows or None}
    allowed = {"max_side", "verify_decode", "restart_rows"} | ({"quality"} if max_side is not None else set())
    if video_mode == "frames":
        allowed = {"fps", "short_side", "quality"}
    elif video_mode == "video":
        allowed = {"gop"} | ({"crf"} if gop is not None else set())
    for name, value in given.items():
        if value is not None and name not in allowed:
            raise OptionError(f"{_named(name, value)} {_WHERE[name]}")
    image = ImageOptions(max_side, DEFAULT_QUALITY if quality is None else quality, verify_decode,
                         restart_rows=restart_rows)
    if video_mode is None:
        return image, None
    crf = DEFAULT_CRF if crf is None else crf
    return image, VideoOptions(video_mode, fps, short_side, DEFAULT_QUALITY if quality is None else quality, gop, crf)


# Where each pack option applies, said when it is given elsewhere.
_WHERE = {
    "max_side": "applies to images; videos are resized by short_side= (--short-side) in frames mode",
    "quality": "applies only where JPEGs are written: images re-encoded by max_side= (--max-side), or video "
               "frames (--video-mode frames); in video mode, crf= (--crf) sets the quality of a --gop re-encode",
    "verify_decode": "applies to images; every video is decoded whole when it is packed",
    "restart_rows": "applies to images (JPEGs); video frames are decoded whole",
    "fps": "applies only to videos stored as frames: video_mode='frames' (--video-mode frames)",
    "short_side": "applies only to videos stored as frames: video_mode='frames' (--video-mode frames)",
    "gop": "applies only to videos stored whole: video_mode='video' (--video-mode video)",
    "crf": "applies only to a re-encode in video mode: with gop= (--gop) and video_mode='video' (--video-mode video)",
}


def _named(name: str, value: Any) -> str:
    """``name=value (--flag)``, as the range messages name options."""
    return f"{name}={value!r} (--{name.replace('_', '-')})"
