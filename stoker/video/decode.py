"""Exact frames from a video: seek to the keyframe before the first frame wanted, decode forward
once, keep the frames wanted, matched by their presentation timestamp in the frame table."""

from __future__ import annotations

import os

import av
import numpy as np

from stoker.video.table import FrameTable, VideoError, open_video


def decode_frames(source: str | os.PathLike | bytes, table: FrameTable, indices: np.ndarray,
                  name: str = "video") -> np.ndarray:
    """Frames ``indices`` (positions in ``table``; repeats allowed) as a (T, H, W, 3) uint8 array.

    Frames are found by timestamp, so frame i is frame i of the decoded stream in presentation
    order whatever the GOP structure, B-frames or frame rate. Each run of wanted frames starts
    with one seek to the keyframe before it (from the first frame for a file whose table says it
    is not ``seekable``); no frame is decoded twice for one call, and a seek
    is made again only when a keyframe lies between two wanted frames (so far-apart frames do not
    decode everything between them).
    """
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        return np.zeros((0, table.height, table.width, 3), np.uint8)
    if indices.min() < 0 or indices.max() >= len(table):
        raise IndexError(f"{name}: frames {indices.min()}..{indices.max()} out of range for {len(table)} frames")
    wanted = np.unique(indices)
    found: dict[int, np.ndarray] = {}
    with open_video(source, name) as container:
        stream = container.streams.video[0]
        # No frame threads: a clip decodes a few dozen frames, and starting FFmpeg's thread pool
        # per call cost more than it saved (one process, 320x240: 44 clips/s with AUTO, 72 without).
        runs = _runs(table, wanted) if table.seekable else [wanted]
        for number, run in enumerate(runs):
            _decode_run(container, stream, table, run, found, name, seek=table.seekable or number > 0)
    missing = [int(i) for i in wanted if int(table.pts[i]) not in found]
    if missing and table.seekable:
        # A seek that resumed on other timestamps than the scan's (a file the scan's checks did
        # not catch): those frames again, decoding from the first frame, where timestamps match.
        with open_video(source, name) as container:
            stream = container.streams.video[0]
            _decode_run(container, stream, table, np.asarray(missing), found, name, seek=False)
        missing = [i for i in missing if int(table.pts[i]) not in found]
    if missing:
        raise VideoError(f"{name}: {len(missing)} frames of the table did not decode (first: frame {missing[0]}); "
                         "the file differs from the one the table was made from")
    clip = np.empty((len(indices), *found[int(table.pts[indices[0]])].shape), np.uint8)
    for k, i in enumerate(indices):
        clip[k] = found[int(table.pts[i])]
    return clip


def _runs(table: FrameTable, wanted: np.ndarray) -> list[np.ndarray]:
    """Split sorted ``wanted`` frames where a keyframe lies between two of them: each run is
    decoded from its own keyframe."""
    keys = np.array([table.keyframe_before(int(i)) for i in wanted])
    breaks = np.flatnonzero(keys[1:] > wanted[:-1]) + 1
    return np.split(wanted, breaks)


def _decode_run(container: av.container.InputContainer, stream: av.video.stream.VideoStream, table: FrameTable,
                run: np.ndarray, found: dict[int, np.ndarray], name: str, seek: bool) -> None:
    """Decode from the keyframe before ``run``'s first frame (from the start without ``seek``) to its last."""
    targets = {int(table.pts[i]) for i in run}
    last = int(table.pts[run[-1]])
    start = int(table.pts[table.keyframe_before(int(run[0]))])
    try:
        if seek:
            container.seek(start, stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            if frame.pts in targets:
                found[frame.pts] = frame.to_ndarray(format="rgb24")
            if frame.pts >= last:
                break
    except av.FFmpegError as e:
        raise VideoError(f"{name}: decoding failed near frame {int(run[0])} ({type(e).__name__}: {e})") from None
