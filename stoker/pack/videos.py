"""One video as the members of one sample, in the mode asked for.

``frames``: every kept frame decoded and stored as a JPEG member ``000000.jpg``, ``000001.jpg``
... (adjacent in the shard, so a clip's frames are one read), plus ``frames.json``.
``video``: the file's own bytes (member named after its extension) plus ``frames.json``, the
frame table built by decoding it (so reading never trusts a header count and never scans).

``frames.json`` holds plain data only: per stored frame its pts (and keyframe flag in video
mode), the time base, frame rate, size and codec of the source, and the frame count the
container claimed (``header_frames``: 0 when it says nothing).
"""

from __future__ import annotations

import io
import os

import av
import numpy as np
from PIL import Image

from stoker.format.layout import FRAME_TABLE_FIELD, frame_field
from stoker.pack.options import VideoOptions
from stoker.sources.inputs import BadInput, read_regular_file
from stoker.video.table import FrameTable, VideoError, scan_video


def load_video(path: str, options: VideoOptions, span: tuple = ()) -> tuple[list[tuple[str, bytes]], int, str | None]:
    """The members of one video, the source's size, and a note when its header count is wrong.
    ``span``: (start, end) seconds from the first frame to keep (None: from the start, to the
    end); in video mode the whole file is stored and its frame table lists only those frames.
    BadInput (with the reason) for a file that is not a readable video."""
    data = read_regular_file(path)
    try:
        if options.mode == "video":
            if options.gop is None:
                table = stored_table = scan_video(data, path)
                stored, extension = data, os.path.splitext(path)[1].lower().lstrip(".") or "video"
            else:
                stored, table = _short_gop(data, path, options.gop, options.crf)
                extension, stored_table = "mp4", scan_video(stored, path)  # what is stored, counted
            inside = _in_span(stored_table, span)
            members = [(extension, stored), (FRAME_TABLE_FIELD, stored_table.to_json(inside))]
        else:
            table, members = _frames(data, path, options, span)
    except VideoError as e:
        raise BadInput(str(e).removeprefix(f"{path}: ")) from None
    note = None
    if table.header_frames and table.header_frames != len(table):
        note = f"header says {table.header_frames} frames, {len(table)} decode"
    return members, len(data), note


def _frames(data: bytes, path: str, options: VideoOptions, span: tuple) -> tuple[FrameTable, list[tuple[str, bytes]]]:
    """Decode every frame once: the frame table, and the JPEG members of the frames kept (every
    frame is encoded while it decodes; with ``fps`` the ones not kept are dropped afterwards:
    cheaper than decoding the video a second time)."""
    jpegs: dict[int, bytes] = {}

    def encode(frame: av.VideoFrame) -> None:
        if frame.pts is not None:  # always: scan_video refuses a frame without one before handing it on
            jpegs[frame.pts] = _jpeg(frame.to_image(), options)

    table = scan_video(data, path, each_frame=encode)
    kept = _kept(table, options.fps)
    kept = kept[_in_span(table, span)[kept]]
    frames = [(frame_field(i), jpegs[int(p)]) for i, p in enumerate(table.pts[kept])]
    return table, frames + [(FRAME_TABLE_FIELD, table.to_json(kept, keyframes=False))]


def _short_gop(data: bytes, path: str, gop: int, crf: int) -> tuple[bytes, FrameTable]:
    """The video re-encoded as H.264 in MP4 with a keyframe every ``gop`` frames (closed groups),
    so that any frame is at most gop - 1 decodes from a keyframe, encoded while the scan decodes.
    Up to 3 B-frames in a row that no other frame refers to (no B-pyramid): a clip skips those it
    does not want (measured on bench/video.py's pans at CRF 26: 2.50x the original bytes and
    4.3 ms per clip, against 2.59x and 4.6 ms without B-frames).
    Timestamps are kept (variable frame rates stay variable); an odd width or height loses its
    last column or row (H.264 4:2:0 needs even sizes). Quality ``crf`` (x264's scale; bench/video.py
    reports the PSNR). Returns the new file and the source's frame table."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as target:
        encoded = None

        def encode(frame: av.VideoFrame) -> None:
            nonlocal encoded
            if encoded is None:
                encoded = target.add_stream("libx264")
                encoded.width, encoded.height, encoded.pix_fmt = frame.width // 2 * 2, frame.height // 2 * 2, "yuv420p"
                encoded.time_base = encoded.codec_context.time_base = frame.time_base
                encoded.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "crf": str(crf),
                                   "bf": "3", "x264-params": "b-pyramid=none:open-gop=0"}
            picture = frame.reformat(width=encoded.width, height=encoded.height, format="yuv420p")
            picture.pts, picture.time_base = frame.pts, frame.time_base
            target.mux(encoded.encode(picture))

        table = scan_video(data, path, each_frame=encode)
        if encoded is None:  # never: scan_video refuses a video of no frames
            raise VideoError(f"{path}: no frame decodes")
        try:
            target.mux(encoded.encode())
        except av.FFmpegError as e:
            raise VideoError(f"{path}: re-encoding failed ({type(e).__name__}: {e})") from None
    return out.getvalue(), table


def _in_span(table: FrameTable, span: tuple) -> np.ndarray:
    """Which frames lie in ``span`` (start, end) seconds from the first frame; BadInput if none do."""
    start, end = (span + (None, None))[:2]
    seconds = table.seconds
    inside = (seconds >= (start or 0.0)) & (seconds < (end if end is not None else np.inf))
    if not inside.any():
        raise VideoError(f"no frame between {start or 0:g} s and {end if end is not None else 'the end'} "
                         f"(the video lasts {float(seconds[-1]):.2f} s)")
    return inside


def _kept(table: FrameTable, fps: float | None) -> np.ndarray:
    """Indices of the frames kept: all, or the frame on screen at each instant k / fps."""
    if fps is None:
        return np.arange(len(table))
    seconds = table.seconds
    instants = np.arange(0.0, float(seconds[-1]) + 1e-9, 1.0 / fps)
    return np.unique(np.searchsorted(seconds, instants + 1e-9, side="right") - 1)


def _jpeg(image: Image.Image, options: VideoOptions) -> bytes:
    if options.short_side is not None and min(image.size) != options.short_side:
        scale = options.short_side / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=options.quality)
    return out.getvalue()

