"""Making batches of video clips: every frame of a clip cut by the same crop and flip.

A clip's frames are read and decoded as :class:`stoker.VideoClipDataset` does (frames mode: one
read of the span, only the chosen JPEGs decoded, each at the smallest DCT scale the crop allows;
video mode: decoded once from the keyframe before the first), then cropped straight into the
batch, (B, T, H, W, 3) uint8, or (B, clips, T, H, W, 3) with several clips per video.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.loader.batches import Batch, BatchMaker
from stoker.loader.crops import CropSpec
from stoker.loader.decode_crop import crop_into, decode_into
from stoker.video.dataset import VideoClipDataset


@dataclass(frozen=True)
class ClipBatchMaker(BatchMaker):
    """A :class:`BatchMaker` whose samples are the clips of a VideoClipDataset. Which frames make
    each clip follows the Loader's seed, epoch and batch (not the data set's ``seed``), so a batch
    is the same whatever makes it."""

    dataset: VideoClipDataset  # type: ignore[assignment]  # no ShardDataset, but has what the base reads (key, root, len)
    crop: CropSpec  # clips are always cropped (Loader: CropSpec() by default)

    def sample_shape(self) -> tuple[int, ...]:
        """(T, H, W, 3), after a clips dimension when the data set gives several clips per video."""
        clips = (self.dataset.clips_per_video,) if self.dataset.clips_per_video > 1 else ()
        return (*clips, self.dataset.clip_len, *self.crop.size, 3)

    def place(self, batch: Batch, j: int, out: np.ndarray) -> int:
        """Pick the frames of sample ``j``'s clips, decode each frame once, crop into ``out``."""
        video = self.dataset.open_video(int(batch.indices[j]))
        rng = np.random.default_rng([self.seed, batch.epoch, self.batch_key(batch.number), j])
        picks = self.dataset.pick_frames(video, rng).reshape(-1)
        frames = out.reshape(-1, *out.shape[-3:])  # (clips * T, H, W, 3)
        wanted, first = np.unique(picks, return_index=True)  # each frame decoded into its first slot
        tries, flip = batch.draws.tries[j], bool(batch.draws.flips[j])
        if self.dataset.mode == "frames":
            for i, slot, data in zip(wanted, first, self.dataset.frame_jpegs(video, wanted), strict=True):
                with video.failure(f"frame {int(i)} does not decode"):
                    decode_into(data, self.crop, tries, flip, frames[slot])
        else:
            for slot, image in zip(first, self.dataset.decode_video(video, wanted), strict=True):
                crop_into(image, self.crop, tries, flip, frames[slot])
        source = first[np.searchsorted(wanted, picks)]
        repeats = np.flatnonzero(source != np.arange(len(picks)))
        frames[repeats] = frames[source[repeats]]  # a short video's last frame, repeated
        return video.label
