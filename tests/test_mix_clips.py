"""stoker.Mix of video clip sets read by stoker.Loader: each clip as its own source cuts it, labels
that say the source, stratified batches, an exact resume; images and clips do not mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from stoker.data.epoch import rank_batches
from stoker.loader import CropSpec
from tests.videos import HEIGHT, WIDTH

# The whole frame at its own size, unflipped: no random crop, so a clip is the same in any batch.
AS_IS = CropSpec("resize", size=(HEIGHT, WIDTH), flip=False)
WEIGHTS = {"frames": 0.6, "video": 0.4}


@pytest.fixture(scope="module")
def clip_packs(video_folder, tmp_path_factory) -> dict[str, Path]:
    """The test videos packed in each video mode, each a clip set of its own."""
    root = tmp_path_factory.mktemp("clip_mix")
    for mode in WEIGHTS:
        stoker.pack(video_folder, root / mode, video_mode=mode, shard_bytes=200_000, workers=1, progress=False)
    return {mode: root / mode for mode in WEIGHTS}


def _mix(clip_packs: dict[str, Path]) -> stoker.Mix:
    # uniform sampling (no randomness), each source its own stride: a clip is what its source makes of it
    sources = {"frames": stoker.VideoClipDataset(clip_packs["frames"], clip_len=4, stride=2, sampling="uniform"),
               "video": stoker.VideoClipDataset(clip_packs["video"], clip_len=4, stride=3, sampling="uniform")}
    return stoker.Mix(sources, WEIGHTS, epoch_size=20)


def _own_clips(mix: stoker.Mix) -> dict[int, torch.Tensor]:
    """Each mix sample's clip, made by a Loader over its own source."""
    clips = {}
    for i, source in enumerate(mix.sources):
        (batch, _), = stoker.Loader(source, len(source), crop=AS_IS, order="sequential", threads=1)
        for local in range(len(source)):
            clips[int(mix.offsets[i]) + local] = batch[local]
    return clips


def _sequence(mix: stoker.Mix, seed: int, batch_size: int, window: int) -> np.ndarray:
    """Epoch 0 of ``mix`` in quasi-random order, read in batches of ``batch_size`` on one rank."""
    order = mix.epoch_order("quasi_random", window)
    chunks = rank_batches(len(order), start=0, world_size=1, rank=0, batch_size=batch_size,
                          drop_last=False).chunks()
    return order.sequence(seed, 0, 0, chunks, None)


@pytest.mark.parametrize("processes", [0, 1])
def test_clip_batches_are_stratified_and_hold_each_sources_own_clips(clip_packs, processes):
    mix = _mix(clip_packs)
    assert mix.clips and mix.classes == ["frames/a", "frames/b", "video/a", "video/b"]
    loader = stoker.Loader(mix, 5, crop=AS_IS, threads=2, processes=processes, seed=3)
    sequence = _sequence(mix, 3, 5, loader.window)
    own = _own_clips(mix)
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    for number, (clips, labels) in enumerate(batches):
        assert clips.shape == (5, 4, HEIGHT, WIDTH, 3) and clips.dtype == torch.uint8
        indices = sequence[number * 5 : (number + 1) * 5]
        assert labels.tolist() == mix.targets[indices].tolist()
        assert mix.label_source(labels).tolist() == mix.source_of(indices).tolist()
        assert np.bincount(mix.label_source(labels), minlength=2).tolist() == [3, 2]  # 0.6 and 0.4 of 5
        assert all(torch.equal(clips[j], own[int(i)]) for j, i in enumerate(indices))
    # a DataLoader's item: the source's clip and frames, the label shifted into the mix's classes
    first_video = int(mix.offsets[1])
    clip, label, frames = mix[first_video]
    own_clip, own_label, own_frames = mix.sources[1][0]
    assert torch.equal(clip, own_clip) and torch.equal(frames, own_frames)
    assert label == own_label + 2 and mix.source_label(np.array([label]))[0] == own_label


def test_a_dataloader_with_the_sampler_reads_a_clip_mix(clip_packs):
    mix = _mix(clip_packs)
    sampler = stoker.QuasiRandomSampler(mix, batch_size=5, seed=5)
    sequence = _sequence(mix, 5, 5, 16)
    batches = list(torch.utils.data.DataLoader(mix, batch_size=5, sampler=sampler))
    assert len(batches) == 4
    for number, (clips, labels, frames) in enumerate(batches):
        indices = sequence[number * 5 : (number + 1) * 5]
        assert clips.shape == (5, 4, HEIGHT, WIDTH, 3) and frames.shape == (5, 4)
        assert labels.tolist() == mix.targets[indices].tolist()
        assert np.bincount(mix.label_source(labels), minlength=2).tolist() == [3, 2]


def test_a_clip_mix_resumed_mid_epoch_continues_exactly(clip_packs):
    whole = list(stoker.Loader(_mix(clip_packs), 5, crop=AS_IS, threads=2, seed=1))
    first = stoker.Loader(_mix(clip_packs), 5, crop=AS_IS, threads=2, seed=1)
    seen = []
    for batch in first:
        seen.append(batch)
        if len(seen) == 2:
            break
    state = first.state_dict()
    assert state["consumed"] == [6, 4]
    resumed = stoker.Loader(_mix(clip_packs), 5, crop=AS_IS, threads=1, seed=1)
    resumed.load_state_dict(state)
    seen += list(resumed)
    assert len(seen) == len(whole) == 4
    for (clips, labels), (want_clips, want_labels) in zip(seen, whole):
        assert torch.equal(clips, want_clips) and torch.equal(labels, want_labels)


def test_images_and_clips_do_not_mix(clip_packs, packed):
    clips = stoker.VideoClipDataset(clip_packs["frames"], clip_len=4)
    with pytest.raises(TypeError, match=r"one kind: \['photos'\] are image sets .* \['clips'\] video clip sets"):
        stoker.Mix({"photos": stoker.ShardDataset(packed), "clips": clips})
    other = stoker.VideoClipDataset(clip_packs["video"], clip_len=8)
    with pytest.raises(ValueError, match="clips of different shapes .*clip_len=4.*clip_len=8"):
        stoker.Mix({"short": clips, "long": other})
