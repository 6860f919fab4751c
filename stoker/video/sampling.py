"""Which frames make a clip: pure functions of the frame count (or frame times) and a generator.

Every rule returns a (clips, clip_len) array of frame indices. Padding rule for videos too
short for a clip: indices past the last frame are clamped to it, so the clip ends by repeating
the last frame (a one-frame video gives clip_len copies of its frame).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Sampling = Literal["random", "uniform", "segments"]


def clip_indices(num_frames: int, clip_len: int, stride: int, sampling: Sampling, clips: int,
                 rng: np.random.Generator, seconds: np.ndarray | None = None, fps: float | None = None) -> np.ndarray:
    """Frame indices of ``clips`` clips of ``clip_len`` frames from a video of ``num_frames``.

    - ``random``: each clip starts at a random frame and takes every ``stride``-th frame;
    - ``uniform``: clip starts spread evenly over the video (for evaluation: no randomness);
    - ``segments`` (TSN): the video is cut into ``clip_len`` equal segments and each clip takes
      one random frame from each (``stride`` is ignored).

    With ``fps`` (and the frames' times in ``seconds``), frames are taken at that rate instead of
    every ``stride``-th: the frame shown at each instant start + k / fps (variable frame rates
    included).
    """
    if num_frames < 1 or clip_len < 1 or stride < 1 or clips < 1:
        raise ValueError(f"need num_frames, clip_len, stride and clips >= 1, got {num_frames}, {clip_len}, {stride}, {clips}")
    if sampling == "segments":
        edges = np.linspace(0, num_frames, clip_len + 1)
        low = np.floor(edges[:-1]).astype(np.int64)
        high = np.maximum(low + 1, np.floor(edges[1:]).astype(np.int64))
        picks = rng.integers(low, high, size=(clips, clip_len))
        return np.minimum(picks, num_frames - 1)
    if fps is not None:
        if seconds is None:
            raise ValueError("fps= needs the frames' times (seconds)")
        span = (clip_len - 1) / fps
        starts = _starts(float(seconds[-1]) - span, sampling, clips, rng, continuous=True)
        instants = starts[:, None] + np.arange(clip_len)[None, :] / fps
        # the frame on screen at each instant: the last one that started at or before it
        picks = np.searchsorted(seconds, instants + 1e-9, side="right") - 1
        return np.clip(picks, 0, num_frames - 1)
    span = (clip_len - 1) * stride
    starts = _starts(num_frames - 1 - span, sampling, clips, rng, continuous=False)
    picks = starts.astype(np.int64)[:, None] + stride * np.arange(clip_len)[None, :]
    return np.minimum(picks, num_frames - 1)


def _starts(last_start: float, sampling: Sampling, clips: int, rng: np.random.Generator, continuous: bool) -> np.ndarray:
    """Clip starts between 0 and ``last_start`` (0 when the video is shorter than a clip)."""
    last_start = max(0.0, last_start)
    if sampling == "uniform":
        return np.linspace(0, last_start, clips) if clips > 1 else np.array([last_start / 2])
    if sampling != "random":
        raise ValueError(f"sampling must be random, uniform or segments, got {sampling!r}")
    if continuous:
        return rng.uniform(0, last_start, size=clips) if last_start > 0 else np.zeros(clips)
    return rng.integers(0, int(last_start) + 1, size=clips)
