"""Packing videos (frames and video modes) and reading exact clips back with VideoClipDataset,
through DataLoader workers too; bad videos rejected with a reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.errors import StokerError
from tests.videos import VIDEO_FRAMES as FRAMES
from tests.videos import frame_number


def test_bad_videos_are_rejected_with_a_reason(packed_videos):
    _, _, result = packed_videos
    assert result.num_samples == len(FRAMES)
    reasons = dict(result.rejected)
    assert set(map(lambda p: p.rsplit("/", 1)[-1], reasons)) == {"truncated.mp4", "garbage.mkv"}
    assert all(reason for reason in reasons.values())


@pytest.mark.parametrize("sampling", ["random", "uniform", "segments"])
def test_every_clip_frame_is_the_frame_asked_for(packed_videos, sampling):
    mode, dst, _ = packed_videos
    dataset = stoker.VideoClipDataset(dst, clip_len=8, stride=2, sampling=sampling, seed=1)
    assert dataset.mode == mode and len(dataset) == len(FRAMES)
    for i in range(len(dataset)):
        clip, label, frames = dataset[i]
        assert clip.shape == (8, 48, 64, 3) and clip.dtype == torch.uint8
        assert [frame_number(image.numpy()) for image in clip] == frames.tolist()
        assert label in (0, 1)


def test_several_clips_and_channels_first(packed_videos):
    _, dst, _ = packed_videos
    dataset = stoker.VideoClipDataset(dst, clip_len=4, clips_per_video=3, sampling="uniform", layout="TCHW")
    clip, _, frames = dataset[0]
    assert clip.shape == (3, 4, 3, 48, 64) and frames.shape == (3, 4)
    numbers = [[frame_number(image.permute(1, 2, 0).numpy()) for image in one] for one in clip]
    assert numbers == frames.tolist()


def test_a_dataloader_with_two_workers_reads_clips(packed_videos):
    _, dst, _ = packed_videos
    dataset = stoker.VideoClipDataset(dst, clip_len=4, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    seen = 0
    for clips, labels, frames in loader:
        assert clips.shape[1:] == (4, 48, 64, 3) and set(labels.tolist()) <= {0, 1}
        seen += len(clips)
        for clip, used in zip(clips, frames, strict=True):
            assert [frame_number(image.numpy()) for image in clip] == used.tolist()
    assert seen == len(FRAMES)


def test_frames_mode_resamples_to_a_frame_rate(video_folder, tmp_path):
    result = stoker.pack(video_folder, tmp_path / "ds", video_mode="frames", fps=5, progress=False, workers=1)
    assert result.num_samples == len(FRAMES)
    dataset = stoker.VideoClipDataset(tmp_path / "ds", clip_len=3, stride=1, sampling="uniform")
    cfr = next(i for i in range(len(dataset)) if key_of(dataset, i).endswith("cfr_bframes"))
    clip, _, _ = dataset[cfr]
    assert [frame_number(image.numpy()) % 5 for image in clip] == [0, 0, 0]  # 25 fps kept at 5: every 5th frame


def key_of(dataset, i):
    shard, local = dataset.shards.locate(i)
    return dataset.shards.index(shard).key(local)


def test_an_image_data_set_is_not_a_video_data_set(packed):
    with pytest.raises(StokerError, match="not a video data set"):
        stoker.VideoClipDataset(packed)


def test_video_mode_with_a_short_gop_keeps_every_frame_exact(video_folder, tmp_path):
    result = stoker.pack(video_folder, tmp_path / "ds", video_mode="video", gop=4, progress=False, workers=2)
    assert result.num_samples == len(FRAMES)
    dataset = stoker.VideoClipDataset(tmp_path / "ds", clip_len=6, stride=3, seed=2)
    for i in range(len(dataset)):
        clip, _, frames = dataset[i]
        assert [frame_number(image.numpy()) for image in clip] == frames.tolist()
        shard, local = dataset.shards.locate(i)
        reader = dataset.shards.reader(shard)
        table = json.loads(bytes(reader.read_member(local, next(
            m for m in reader.index.sample_members(local) if reader.index.fields[int(m["field"])] == "frames.json"))))
        assert np.flatnonzero(table["keyframe"]).tolist() == list(range(0, len(table["pts"]), 4))
        assert len(table["packets"]["pts"]) == len(table["pts"])  # decoded from byte ranges, no container
    stoker.pack(video_folder, tmp_path / "crf", video_mode="video", gop=4, crf=35, progress=False, workers=2)
    assert _video_bytes(tmp_path / "crf") < _video_bytes(tmp_path / "ds")  # tiny frames: mostly container bytes
    with pytest.raises(StokerError, match="crf=60"):
        stoker.pack(video_folder, tmp_path / "bad", video_mode="video", gop=4, crf=60, progress=False)


def test_gop_needs_video_mode(video_folder, tmp_path):
    with pytest.raises(StokerError, match="gop=4"):
        stoker.pack(video_folder, tmp_path / "ds", video_mode="frames", gop=4, progress=False)


@pytest.mark.parametrize("mode", ["frames", "video"])
def test_a_list_with_start_and_end_keeps_that_part(video_folder, tmp_path, mode):
    listing = tmp_path / "videos.csv"
    listing.write_text(f"path,label,start,end\n{video_folder}/a/cfr_bframes.mp4,walk,0.4,1.2\n"
                       f"{video_folder}/b/long_gop.mp4,run,,\n{video_folder}/b/vfr.mkv,run,99,100\n")
    result = stoker.pack(listing, tmp_path / "ds", video_mode=mode, progress=False, workers=1)
    assert result.num_samples == 2 and "no frame between 99 s and 100" in result.rejected[0][1]
    dataset = stoker.VideoClipDataset(tmp_path / "ds", clip_len=8, stride=3, sampling="uniform")
    first = {"cfr_bframes": 10, "long_gop": 0}  # 0.4 s at 25 fps is frame 10
    for i in range(len(dataset)):
        clip, _, frames = dataset[i]
        name = key_of(dataset, i).rsplit("/", 1)[-1]
        numbers = [frame_number(image.numpy()) for image in clip]
        assert numbers == [first[name] + f for f in frames.tolist()]  # positions among the frames kept
        if name == "cfr_bframes":
            assert max(numbers) <= 29  # 1.2 s is frame 30, not kept


def test_start_and_end_columns_are_for_videos(tmp_path, photos):
    listing = tmp_path / "images.csv"
    image = next(photos.rglob("*.jpg"))
    listing.write_text(f"{image},cat,0,1\n")
    with pytest.raises(StokerError, match="expected 'path,label', got 4 columns"):
        stoker.pack(listing, tmp_path / "ds", progress=False)


def _video_bytes(root) -> int:
    """The bytes of the stored videos (tar members named mp4) of a packed data set."""
    dataset = stoker.VideoClipDataset(root)
    total = 0
    for i in range(len(dataset)):
        shard, local = dataset.shards.locate(i)
        index = dataset.shards.reader(shard).index
        total += sum(int(m["size"]) for m in index.sample_members(local) if index.fields[int(m["field"])] == "mp4")
    return total
