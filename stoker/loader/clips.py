"""Samples that are video clips, for the batch engine (batches.py): every frame of a clip cut by
the same crop and flip.

A clip's frames are read and decoded as :class:`stoker.VideoClipDataset` does (frames mode: one
read of the span, only the chosen JPEGs decoded, each at the smallest DCT scale the crop allows;
video mode: decoded once from the keyframe before the first), then cropped straight into the
batch, (B, T, H, W, 3) uint8, or (B, clips, T, H, W, 3) with several clips per video. A Mix of
clip sets is read the same way, each clip from its source, as that source cuts its clips.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from stoker.data.mix import Mix
from stoker.decode.crops import CropSpec
from stoker.decode.per_image import crop_into, decode_into
from stoker.loader.batches import Batch, BatchMaker
from stoker.video.dataset import VideoClipDataset


@dataclass(frozen=True)
class Clips:
    """The :class:`~stoker.loader.batches.Samples` of a VideoClipDataset, or of a Mix of them.
    Which frames make each clip follows the Loader's seed, epoch and batch (not the data set's
    ``seed``), so a batch is the same whatever makes it."""

    dataset: VideoClipDataset | Mix

    def shape(self, crop: CropSpec | None) -> tuple[int, ...]:
        """(T, H, W, 3), after a clips dimension when the data set gives several clips per video."""
        assert crop is not None  # clips are always cropped (the plan gives them CropSpec() by default)
        clip_set = self.clip_set(0)[0]  # a Mix's sources give clips of one shape (Mix checks it)
        clips = (clip_set.clips_per_video,) if clip_set.clips_per_video > 1 else ()
        return (*clips, clip_set.clip_len, *crop.size, 3)

    def clip_set(self, index: int) -> tuple[VideoClipDataset, int, Callable[[int], int]]:
        """Where sample ``index`` is: its clip set (a Mix's source, or the data set), its index
        there, and what its labels are in the batch (a Mix's labels: shifted past earlier sources')."""
        if not isinstance(self.dataset, Mix):
            return self.dataset, index, int
        source, local = self.dataset.locate(index)
        clip_set = self.dataset.sources[source]
        assert isinstance(clip_set, VideoClipDataset)  # the Loader makes clips of a Mix of clip sets only
        return clip_set, local, partial(self.dataset.mix_label, source)

    def place(self, maker: BatchMaker, batch: Batch, j: int, out: np.ndarray | None) -> int:
        """Pick the frames of sample ``j``'s clips, decode each frame once, crop into ``out``."""
        assert out is not None and maker.crop is not None  # clips are always cropped
        crop = maker.crop
        clip_set, local, label = self.clip_set(int(batch.indices[j]))
        video = clip_set.open_video(local)
        rng = np.random.default_rng([maker.seed, batch.epoch, maker.batch_key(batch.number), j])
        picks = clip_set.pick_frames(video, rng).reshape(-1)
        frames = out.reshape(-1, *out.shape[-3:])  # (clips * T, H, W, 3)
        wanted, first = np.unique(picks, return_index=True)  # each frame decoded into its first slot
        tries, flip = batch.draws.tries[j], bool(batch.draws.flips[j])
        if clip_set.mode == "frames":
            for i, slot, data in zip(wanted, first, clip_set.frame_jpegs(video, wanted), strict=True):
                with video.failure(f"frame {int(i)} does not decode"):
                    decode_into(data, crop, tries, flip, frames[slot])
        else:
            for slot, image in zip(first, clip_set.decode_video(video, wanted), strict=True):
                crop_into(image, crop, tries, flip, frames[slot])
        source = first[np.searchsorted(wanted, picks)]
        repeats = np.flatnonzero(source != np.arange(len(picks)))
        frames[repeats] = frames[source[repeats]]  # a short video's last frame, repeated
        return label(video.label)
