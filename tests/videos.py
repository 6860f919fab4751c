"""Videos made by the tests with PyAV whose frames carry their own index in their pixels: eight
vertical bars, black or white, are the bits of the frame number (robust to lossy coding), so
every decoded frame can be checked to be the frame asked for."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

WIDTH, HEIGHT = 64, 48
# the videos of the packed_videos fixture (tests/conftest.py): name -> frames
VIDEO_FRAMES = {"a/cfr_bframes.mp4": 60, "a/one_frame.mp4": 1, "b/vfr.mkv": 40, "b/mpeg4.avi": 30, "b/long_gop.mp4": 90}


def frame_image(i: int) -> np.ndarray:
    """The picture of frame ``i`` (0..255)."""
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    bar = WIDTH // 8
    for bit in range(8):
        if (i >> bit) & 1:
            image[:, bit * bar : (bit + 1) * bar] = 255
    return image


def frame_number(image: np.ndarray) -> int:
    """The index a decoded frame carries."""
    bar = image.shape[1] // 8
    row = image[image.shape[0] // 2]
    return sum(1 << bit for bit in range(8) if row[bit * bar + bar // 2].mean() > 127)


def make_video(path: Path, frames: int, *, codec: str = "libx264", options: dict | None = None,
               vfr_ms: list[int] | None = None, audio: bool = False, fmt: str | None = None) -> Path:
    """Encode ``frames`` numbered frames at 25 fps (or with the gaps ``vfr_ms`` between frames)."""
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = options or {}
        if vfr_ms:
            stream.codec_context.time_base = Fraction(1, 1000)
        sound = container.add_stream("aac", rate=8000) if audio else None
        t = 0
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_image(i), format="rgb24")
            if vfr_ms:
                frame.pts, frame.time_base = t, Fraction(1, 1000)
                t += vfr_ms[i % len(vfr_ms)]
            container.mux(stream.encode(frame))
            if sound is not None and i % 5 == 0:
                chunk = av.AudioFrame.from_ndarray(np.zeros((1, 1600), np.float32), format="fltp", layout="mono")
                chunk.sample_rate = 8000
                container.mux(sound.encode(chunk))
        container.mux(stream.encode())
        if sound is not None:
            container.mux(sound.encode())
    return path
