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
import json
import os

import av
import numpy as np
from PIL import Image

from stoker.format.layout import FRAME_TABLE_FIELD, frame_field
from stoker.pack.images import BadInput
from stoker.pack.shard_job import VideoOptions
from stoker.video.table import FrameTable, VideoError, open_video, scan_video


def load_video(path: str, options: VideoOptions) -> tuple[list[tuple[str, bytes]], int, str | None]:
    """The members of one video, the source's size, and a note when its header count is wrong.
    BadInput (with the reason) for a file that is not a readable video."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadInput(f"cannot read: {e.strerror or e}") from None
    try:
        if options.mode == "video":
            table = scan_video(data, path)
            stored, extension = (data, os.path.splitext(path)[1].lower().lstrip(".") or "video")
            if options.gop is not None:
                stored, extension = _short_gop(data, path, table, options.gop), "mp4"
            stored_table = scan_video(stored, path) if options.gop is not None else table
            members = [(extension, stored), (FRAME_TABLE_FIELD, _table_json(stored_table, stored_table.pts,
                                                                             stored_table.keyframe))]
        else:
            table, members = _frames(data, path, options)
    except VideoError as e:
        raise BadInput(str(e).removeprefix(f"{path}: ")) from None
    note = None
    if table.header_frames and table.header_frames != len(table):
        note = f"header says {table.header_frames} frames, {len(table)} decode"
    return members, len(data), note


def _frames(data: bytes, path: str, options: VideoOptions) -> tuple[FrameTable, list[tuple[str, bytes]]]:
    """Decode every frame once: the frame table and the JPEG members of the frames kept."""
    table = scan_video(data, path)
    keep = _kept(table, options.fps)
    wanted = set(table.pts[keep].tolist())
    members: dict[int, bytes] = {}
    with open_video(data, path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                if frame.pts in wanted:
                    members[frame.pts] = _jpeg(frame.to_image(), options)
        except av.FFmpegError as e:
            raise VideoError(f"{path}: decoding failed ({type(e).__name__}: {e})") from None
    pts = table.pts[keep]
    if len(members) != len(pts):
        raise VideoError(f"{path}: {len(pts) - len(members)} frames did not decode the second time")
    frames = [(frame_field(i), members[int(p)]) for i, p in enumerate(pts)]
    return table, frames + [(FRAME_TABLE_FIELD, _table_json(table, pts, None))]


def _short_gop(data: bytes, path: str, table: FrameTable, gop: int) -> bytes:
    """The video re-encoded as H.264 in MP4 with a keyframe every ``gop`` frames and no B-frames,
    so that any frame is at most gop - 1 decodes from a keyframe. Timestamps are kept (variable
    frame rates stay variable); an odd width or height loses its last column or row (H.264 4:2:0
    needs even sizes). CRF 23, x264's default quality (bench/video.py reports the PSNR)."""
    width, height = table.width // 2 * 2, table.height // 2 * 2
    out = io.BytesIO()
    with open_video(data, path) as source, av.open(out, "w", format="mp4") as target:
        stream = source.streams.video[0]
        stream.thread_type = "AUTO"
        encoded = target.add_stream("libx264")
        encoded.width, encoded.height, encoded.pix_fmt = width, height, "yuv420p"
        encoded.time_base = stream.time_base
        encoded.codec_context.time_base = stream.time_base
        encoded.options = {"g": str(gop), "keyint_min": str(gop), "bf": "0", "sc_threshold": "0", "crf": "23"}
        try:
            for frame in source.decode(stream):
                picture = frame.reformat(width=width, height=height, format="yuv420p")
                picture.pts, picture.time_base = frame.pts, stream.time_base
                target.mux(encoded.encode(picture))
            target.mux(encoded.encode())
        except av.FFmpegError as e:
            raise VideoError(f"{path}: re-encoding failed ({type(e).__name__}: {e})") from None
    return out.getvalue()


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
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=options.quality)
    return out.getvalue()


def _table_json(table: FrameTable, pts: np.ndarray, keyframe: np.ndarray | None) -> bytes:
    data = {"pts": pts.tolist(), "time_base": [table.time_base.numerator, table.time_base.denominator],
            "fps": table.fps, "size": [table.width, table.height], "codec": table.codec,
            "header_frames": table.header_frames, "source_frames": len(table), "seekable": table.seekable}
    if keyframe is not None:
        data["keyframe"] = keyframe.astype(int).tolist()
    return json.dumps(data).encode("utf-8")
