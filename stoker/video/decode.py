"""Exact frames from a video: start at the keyframe before the first frame wanted, decode forward
once, keep the frames wanted, matched by their presentation timestamp in the frame table.

Where the table indexes the file's packets (stored videos from ``stoker pack``), the decoder gets
the packets' byte ranges straight from the file's bytes; otherwise the container is opened and
seeked with PyAV."""

from __future__ import annotations

import os
import threading

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from stoker.video.table import FrameTable, PacketIndex, VideoError, open_video

_thread = threading.local()


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
    decoded = False
    if table.packets is not None and isinstance(source, bytes | bytearray):
        try:
            _decode_packets(source, table, table.packets, wanted, found, name)
            decoded = True
        except VideoError:  # a decoder that needs more than the packets: the container knows
            found.clear()
    if not decoded:
        _decode_container(source, table, wanted, found, name)
    missing = [int(i) for i in wanted if int(table.pts[i]) not in found]
    if missing and table.seekable:
        # Decoding from a keyframe gave other timestamps than the scan's (a file the scan's checks
        # did not catch): those frames again, decoding from the first frame, where they match.
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


def _decode_container(source: str | os.PathLike | bytes, table: FrameTable, wanted: np.ndarray,
                      found: dict[int, np.ndarray], name: str) -> None:
    """Frames ``wanted`` into ``found`` (by pts), opening the container and seeking per run."""
    with open_video(source, name) as container:
        stream = container.streams.video[0]
        # No frame threads: a clip decodes a few dozen frames, and starting FFmpeg's thread pool
        # per call cost more than it saved (one process, 320x240: 44 clips/s with AUTO, 72 without).
        runs = _runs(table, wanted) if table.seekable else [wanted]
        for number, run in enumerate(runs):
            _decode_run(container, stream, table, run, found, name, seek=table.seekable or number > 0)


def _decode_packets(data: bytes, table: FrameTable, packets: PacketIndex, wanted: np.ndarray,
                    found: dict[int, np.ndarray], name: str) -> None:
    """Frames ``wanted`` into ``found`` (by pts), handing the decoder each run's packets, from its
    keyframe's to the last one a wanted frame needs (in decode order), then draining it. Frames
    not wanted that no other frame refers to (B-frames, mostly) are skipped, not decoded."""
    try:
        decoder = av.CodecContext.create(table.codec, "r")
        if not isinstance(decoder, av.VideoCodecContext):  # a frames.json edited or damaged to name another codec
            raise VideoError(f"{name}: {table.codec} is not a video codec")
        decoder.extradata = packets.extradata or None
        decoder.thread_count = 1  # see _decode_container: a clip is too short for a thread pool
        targets = {int(table.pts[i]) for i in wanted}
        fed = -1
        for run in _runs(table, wanted):
            # the keyframe packet at or before the run's keyframe: a table cut to a span can
            # start between keyframes of the file
            start = int(packets.position(table.pts[[table.keyframe_before(int(run[0]))]])[0])
            first = int(np.flatnonzero(packets.key[: start + 1])[-1]) if packets.key[: start + 1].any() else 0
            last = int(packets.position(table.pts[run]).max())
            if first > fed + 1:  # a jump to a later keyframe: finish the frames so far, start again
                _keep(decoder.decode(None), targets, found)
                decoder.flush_buffers()
                fed = first - 1
            for k in range(fed + 1, last + 1):
                # a packet of its own, not a view of ``data``: FFmpeg reads up to 64 zeroed bytes
                # past the end, and MPEG-4 decoded from views lost rows of macroblocks
                packet = av.Packet(int(packets.size[k]))
                packet.update(data[packets.offset[k] : packets.offset[k] + packets.size[k]])
                packet.pts = int(packets.pts[k])
                decoder.skip_frame = "DEFAULT" if packet.pts in targets else "NONREF"
                _keep(decoder.decode(packet), targets, found)
            fed = last
        _keep(decoder.decode(None), targets, found)
    except av.FFmpegError as e:
        raise VideoError(f"{name}: decoding failed ({type(e).__name__}: {e})") from None


def _keep(frames: list[av.VideoFrame], targets: set[int], found: dict[int, np.ndarray]) -> None:
    """The frames among ``frames`` whose pts is in ``targets``, as RGB arrays into ``found``."""
    for frame in frames:
        if frame.pts in targets and frame.pts not in found:
            found[frame.pts] = rgb(frame)


def rgb(frame: av.VideoFrame) -> np.ndarray:
    """``frame`` as an (H, W, 3) uint8 RGB array, as ``frame.to_ndarray(format="rgb24")`` gives it,
    through one converter per thread: to_ndarray makes a new one for every frame, and setting it
    up cost ~150 of its ~225 us per 320x240 frame here."""
    if not hasattr(_thread, "reformatter"):
        _thread.reformatter = VideoReformatter()
    return _thread.reformatter.reformat(frame, format="rgb24").to_ndarray()


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
                found[frame.pts] = rgb(frame)
            if frame.pts >= last:
                break
    except av.FFmpegError as e:
        raise VideoError(f"{name}: decoding failed near frame {int(run[0])} ({type(e).__name__}: {e})") from None
