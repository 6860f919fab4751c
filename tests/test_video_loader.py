"""stoker.Loader over a VideoClipDataset: batches of clips, exact frames, one crop per clip,
the same batches from threads and from spawned worker processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker
from stoker.errors import CorruptDataError
from stoker.loader import CropSpec
from tests.videos import HEIGHT, VIDEO_FRAMES, WIDTH, frame_number

# The whole frame at its own size, unflipped: pixels pass through, so frame numbers can be read.
AS_IS = CropSpec("resize", size=(HEIGHT, WIDTH), flip=False)


def test_clip_batches_hold_the_frames_of_each_clip(packed_videos):
    _, dst, _ = packed_videos
    dataset = stoker.VideoClipDataset(dst, clip_len=6, stride=2)
    loader = stoker.Loader(dataset, batch_size=2, crop=AS_IS, order="sequential", threads=2)
    lengths = {frames: 0 for frames in VIDEO_FRAMES.values()}
    seen = 0
    for clips, labels in loader:
        assert clips.shape[1:] == (6, HEIGHT, WIDTH, 3) and clips.dtype == torch.uint8  # (B, T, H, W, C)
        assert set(labels.tolist()) <= {0, 1}
        for clip in clips:
            numbers = [frame_number(frame.numpy()) for frame in clip]
            last = max(numbers)
            # every 2nd frame from the start, the last frame repeated where the video ends
            assert numbers == [min(numbers[0] + 2 * t, last) for t in range(6)]
            lengths[next(n for n in sorted(lengths) if n > last)] += 1
        seen += len(clips)
    assert seen == len(VIDEO_FRAMES) and len(loader) == 3


def test_every_frame_of_a_clip_gets_the_same_crop(tmp_path):
    # Still videos (every frame the same picture): frames of one clip must come out identical,
    # while different clips get different crops and flips.
    import av

    src = tmp_path / "still" / "a"
    src.mkdir(parents=True)
    blocks = np.random.default_rng(0).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    picture = np.kron(blocks, np.ones((8, 8, 1), np.uint8))  # 96x128 of 8x8 blocks: every cut looks different
    for v in range(4):
        with av.open(str(src / f"v{v}.mp4"), "w") as container:
            stream = container.add_stream("libx264", rate=25)
            stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
            for _ in range(12):
                container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
            container.mux(stream.encode())
    stoker.pack(tmp_path / "still", tmp_path / "ds", video_mode="frames", workers=1, progress=False)
    dataset = stoker.VideoClipDataset(tmp_path / "ds", clip_len=4)
    loader = stoker.Loader(dataset, batch_size=4, crop=CropSpec(size=(32, 32), scale=(0.1, 0.5)), seed=3)
    clips, _ = next(iter(loader))
    assert clips.shape == (4, 4, 32, 32, 3)
    clips = clips.int()
    for clip in clips:
        assert (clip - clip[0]).abs().float().mean() < 1  # the same cut of the same picture (codec noise aside)
    assert min((clips[a, 0] - clips[b, 0]).abs().float().mean() for a in range(4) for b in range(a)) > 20


def test_worker_processes_make_the_same_clip_batches(packed_videos):
    _, dst, _ = packed_videos
    dataset = stoker.VideoClipDataset(dst, clip_len=4, clips_per_video=2, layout="TCHW")
    threads = list(stoker.Loader(dataset, batch_size=2, crop=CropSpec(size=(24, 32)), seed=5))
    spawned = list(stoker.Loader(dataset, batch_size=2, crop=CropSpec(size=(24, 32)), seed=5, processes=2,
                                 mp_context="spawn"))
    assert threads[0][0].shape == (2, 2, 4, 3, 24, 32)  # (B, clips, T, C, H, W), as the data set's layout
    assert len(threads) == len(spawned) == 3
    for (a, la), (b, lb) in zip(threads, spawned, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_a_damaged_video_is_named_by_the_loader(packed_videos, tmp_path):
    import shutil

    _, dst, _ = packed_videos
    copy = tmp_path / "ds"
    shutil.copytree(dst, copy)
    dataset = stoker.VideoClipDataset(copy, clip_len=4, sampling="segments")
    video = dataset.open_video(0)
    with open(video.reader.path, "r+b") as f:
        for name, member in video.members.items():
            if name != "frames.json":  # every frame (or the video): whatever the clip picks is damaged
                f.seek(int(member["offset"]) + int(member["size"]) // 2)
                f.write(b"\x00" * 16)
    with pytest.raises(CorruptDataError, match=rf"{video.key}.*checksum mismatch"):
        for _ in stoker.Loader(stoker.VideoClipDataset(copy, clip_len=4, sampling="segments"), batch_size=2,
                               order="sequential"):
            pass
