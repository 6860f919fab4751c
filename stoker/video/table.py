"""The frame table of a video: every frame that actually decodes, in presentation order, with its
timestamp and keyframe flag, counted by decoding (never read from container headers, which often
disagree: an MKV header holds no count at all, some AVI and MP4 headers count wrong).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import av
import numpy as np

from stoker.errors import StokerError


class VideoError(StokerError):
    """A video cannot be read: the message names the file and the reason (truncated, not a video,
    no video stream, an unsupported codec)."""


@dataclass(frozen=True)
class FrameTable:
    """Frame ``i`` of a video is the i-th frame of its decoded stream in presentation order:
    ``pts[i]`` (in ``time_base`` units, strictly increasing) and ``keyframe[i]``.

    ``header_frames`` is what the container claims (0 when it does not say), kept only to report
    files whose header is wrong. ``seekable`` is False when a seek lands on timestamps other
    than those of a decode from the start (an AVI with MPEG-4 B-frames, whose timestamps are
    derived while decoding): frames of such a file are then decoded from its first frame.
    """

    pts: np.ndarray
    keyframe: np.ndarray
    time_base: Fraction
    width: int
    height: int
    codec: str
    header_frames: int
    seekable: bool = True

    def __len__(self) -> int:
        return len(self.pts)

    @property
    def seconds(self) -> np.ndarray:
        """Presentation time of each frame, in seconds from the first."""
        return (self.pts - self.pts[0]).astype(np.float64) * float(self.time_base)

    @property
    def fps(self) -> float:
        """Mean frame rate over the video (frames per second); 0 for a single frame."""
        span = float(self.seconds[-1]) if len(self) > 1 else 0.0
        return (len(self) - 1) / span if span > 0 else 0.0

    def to_json(self, keep: np.ndarray, keyframes: bool = True) -> bytes:
        """The ``frames.json`` member of a packed video (plain data, no pickle): the frames
        ``keep`` (indices or a mask) with their pts, and their keyframe flags when ``keyframes``
        (frames mode leaves them out: every stored JPEG decodes alone), plus the source's time
        base, frame rate, size, codec, claimed and counted frame counts, and seekability."""
        data = {"pts": self.pts[keep].tolist(), "time_base": [self.time_base.numerator, self.time_base.denominator],
                "fps": self.fps, "size": [self.width, self.height], "codec": self.codec,
                "header_frames": self.header_frames, "source_frames": len(self), "seekable": self.seekable}
        if keyframes:
            data["keyframe"] = self.keyframe[keep].astype(int).tolist()
        return json.dumps(data).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | memoryview) -> FrameTable:
        """The table a ``frames.json`` member describes (see :meth:`to_json`)."""
        table = json.loads(bytes(data))
        pts = np.asarray(table["pts"], np.int64)
        keyframe = np.asarray(table["keyframe"], bool) if "keyframe" in table else np.ones(len(pts), bool)
        return cls(pts, keyframe, Fraction(*table["time_base"]), table["size"][0], table["size"][1], table["codec"],
                   table["header_frames"], table.get("seekable", True))

    def keyframe_before(self, i: int) -> int:
        """The last keyframe at or before frame ``i`` (decoding frame ``i`` starts there)."""
        keys = np.flatnonzero(self.keyframe[: i + 1])
        return int(keys[-1]) if len(keys) else 0


def open_video(source: str | os.PathLike | bytes, name: str) -> av.container.InputContainer:
    """Open a video file or its bytes with PyAV; VideoError names ``name`` and the reason."""
    try:
        return av.open(io.BytesIO(source) if isinstance(source, bytes | bytearray) else os.fspath(source))
    except (av.FFmpegError, OSError, ValueError) as e:
        raise VideoError(f"{name}: not a readable video ({_reason(e)})") from None


def scan_video(source: str | os.PathLike | bytes, name: str | None = None,
               each_frame: Callable[[av.VideoFrame], None] | None = None) -> FrameTable:
    """Decode every frame of the first video stream of ``source`` (a path or the file's bytes)
    and return its frame table; VideoError for a file that is not a video, has no video stream,
    or stops decoding part-way (a truncated file). ``each_frame`` gets every decoded frame, in
    the decoder's (presentation) order, so a caller that needs the pixels decodes only once."""
    name = name or (os.fspath(source) if not isinstance(source, bytes | bytearray) else "video")
    with open_video(source, name) as container:
        if not container.streams.video:
            raise VideoError(f"{name}: no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        pts, keys = [], []
        try:
            for frame in container.decode(stream):
                if frame.pts is None:
                    raise VideoError(f"{name}: frame {len(pts)} has no timestamp; frames cannot be located exactly")
                pts.append(frame.pts)
                keys.append(frame.key_frame)
                if each_frame is not None:
                    each_frame(frame)
        except av.FFmpegError as e:
            raise VideoError(f"{name}: decoding stopped after {len(pts)} frames ({_reason(e)})") from None
        if not pts:
            raise VideoError(f"{name}: no frame decodes")
        order = np.argsort(pts, kind="stable")
        table = FrameTable(np.asarray(pts, np.int64)[order], np.asarray(keys, bool)[order],
                           Fraction(stream.time_base), stream.codec_context.width, stream.codec_context.height,
                           stream.codec_context.name, int(stream.frames or 0))
        if np.any(np.diff(table.pts) <= 0):
            raise VideoError(f"{name}: two frames share a timestamp; frames cannot be located exactly")
        # AVI stores no presentation timestamps: FFmpeg derives them while decoding, and after a
        # seek they can shift (seen here on MPEG-4 with B-frames, even where the keyframe itself
        # lands right). Elsewhere, a few seeks check that decoding resumes on the table's times.
        if container.format.name == "avi" or not _seeks_land_exactly(container, stream, table):
            table = replace(table, seekable=False)
        return table


def _seeks_land_exactly(container: av.container.InputContainer, stream: av.video.stream.VideoStream,
                        table: FrameTable, checks: int = 3) -> bool:
    """Seek to a few keyframes and check that decoding resumes on the timestamps of the table."""
    keys = np.flatnonzero(table.keyframe)[1:]
    for k in keys[np.linspace(0, len(keys) - 1, min(checks, len(keys))).astype(int)] if len(keys) else []:
        try:
            container.seek(int(table.pts[k]), stream=stream, backward=True, any_frame=False)
            frame = next(container.decode(stream), None)
        except av.FFmpegError:
            return False
        if frame is None or frame.pts != int(table.pts[k]):
            return False
    return True


def _reason(error: Exception) -> str:
    if isinstance(error, EOFError):
        return "the file ends early: truncated or cut off"
    return f"{type(error).__name__}: {error}"
