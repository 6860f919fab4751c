"""VideoClipDataset: exact clips from a packed video data set (``stoker pack --video-mode``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import simplejpeg
import torch.utils.data

from stoker.data.readers import ShardReader
from stoker.data.shards import ShardSet
from stoker.errors import CorruptDataError, StokerError
from stoker.format import member_checksum
from stoker.format.layout import FRAME_TABLE_FIELD, frame_field, is_frame_field
from stoker.ranges import CLIP_FPS
from stoker.storage.settings import StorageSettings
from stoker.video.decode import decode_frames
from stoker.video.sampling import Sampling, clip_indices
from stoker.video.table import FrameTable, VideoError


class VideoClipDataset(torch.utils.data.Dataset):
    """Items are ``(clip, label, frames)``: ``clip`` a uint8 tensor (T, H, W, C) (``layout="TCHW"``
    for (T, C, H, W); with ``clips_per_video`` > 1 a leading clips dimension), ``frames`` the
    frame indices used: positions among the frames stored, in presentation order (all frames of
    the decoded stream, or those kept by the pack's ``--fps`` and a list's start/end columns).

    ``sampling``: ``random`` (random start, every ``stride``-th frame), ``uniform`` (starts spread
    evenly; for evaluation), ``segments`` (TSN: one frame from each of ``clip_len`` equal parts);
    with ``fps``, frames are taken at that rate following the frames' own times. Videos shorter
    than a clip repeat their last frame. Frames-mode data reads a clip's frames in one read and
    decodes only those frames; video-mode data seeks to the keyframe before the first frame and
    decodes forward once. ``seed``: the same clips for the same index every time (default: fresh
    randomness). Other arguments as for :class:`stoker.ShardDataset`.
    """

    def __init__(self, path: str | os.PathLike, clip_len: int = 8, stride: int = 1, sampling: Sampling = "random",
                 clips_per_video: int = 1, fps: float | None = None, *, layout: Literal["THWC", "TCHW"] = "THWC",
                 transform: Callable[[torch.Tensor], Any] | None = None, seed: int | None = None, verify: bool = True,
                 storage_options: dict[str, Any] | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | None = None) -> None:
        if layout not in ("THWC", "TCHW"):
            raise ValueError(f"layout must be THWC or TCHW, got {layout!r}")
        if fps is not None:
            CLIP_FPS.check(fps)
        self.root = os.fspath(path)
        self.clip_len, self.stride, self.sampling, self.clips_per_video, self.fps = (clip_len, stride, sampling,
                                                                                      clips_per_video, fps)
        self.layout, self.transform, self.seed, self.verify = layout, transform, seed, verify
        settings = StorageSettings(storage_options=storage_options or {}, cache_dir=cache_dir, cache_limit=cache_limit)
        self.shards = ShardSet(path, verify=verify, settings=settings)
        kinds = set(self.shards.manifest.schema.values())
        if "frame_table" not in kinds:
            raise StokerError(f"{self.root}: not a video data set (pack it with stoker pack --video-mode frames|video)")
        self.mode = "frames" if "frame" in kinds else "video"
        clip_indices(1, clip_len, stride, sampling, clips_per_video, np.random.default_rng(0))  # checks the arguments

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def classes(self) -> list[str]:
        """Class names; index i is label i."""
        return list(self.shards.manifest.classes or [])

    @property
    def targets(self) -> np.ndarray:
        """Every video's label (int64 array), read from the indexes without touching shard data."""
        return self.shards.column("label")

    def __getitem__(self, index: int) -> tuple[Any, int, torch.Tensor]:
        video = self.open_video(int(index))
        rng = np.random.default_rng(None if self.seed is None else [self.seed, int(index)])
        picks = self.pick_frames(video, rng)
        wanted = np.unique(picks)
        if self.mode == "frames":
            jpegs = self.frame_jpegs(video, wanted)
            with video.failure(f"frame {int(wanted[0])} does not decode"):  # every frame has the first one's size
                height, width, _, _ = simplejpeg.decode_jpeg_header(jpegs[0])
                images = np.empty((len(wanted), height, width, 3), np.uint8)
            for k, (i, data) in enumerate(zip(wanted, jpegs, strict=True)):
                with video.failure(f"frame {int(i)} does not decode"):
                    # simplejpeg straight into the clip array: ~25% less CPU per frame than Pillow
                    # (see stoker/decode/per_image.py), and no copy to stack the frames
                    simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True, buffer=images[k])
        else:
            images = self.decode_video(video, wanted)
        order = np.searchsorted(wanted, picks)
        in_order = order.shape[0] == 1 and np.array_equal(order[0], np.arange(len(wanted)))
        clip = torch.from_numpy(images[None] if in_order else images[order])  # no copy for the usual clip
        if self.layout == "TCHW":
            clip = clip.permute(0, 1, 4, 2, 3)
        if self.clips_per_video == 1:
            clip, picks = clip[0], picks[0]
        if self.transform is not None:
            clip = self.transform(clip)
        return clip, video.label, torch.from_numpy(picks)

    def key(self, index: int) -> str:
        """The key of sample ``index`` (its path in the source, without the extension)."""
        shard, local = self.shards.locate(index)
        return self.shards.reader(shard).index.key(local)

    def open_video(self, index: int) -> StoredVideo:
        """Sample ``index``: where it is, its members and its frame table."""
        shard, local = self.shards.locate(index)
        reader = self.shards.reader(shard)
        members = {reader.index.fields[int(m["field"])]: m for m in reader.index.sample_members(local)}
        if FRAME_TABLE_FIELD not in members:
            raise CorruptDataError(reader.path, reader.index.key(local), f"no {FRAME_TABLE_FIELD} member")
        try:
            table = FrameTable.from_json(reader.read_member(local, members[FRAME_TABLE_FIELD]))
        except VideoError as e:
            raise CorruptDataError(reader.path, reader.index.key(local), str(e)) from None
        frames = sum(1 for name in members if is_frame_field(name))
        if self.mode == "frames" and frames != len(table):
            raise CorruptDataError(reader.path, reader.index.key(local), f"damaged {FRAME_TABLE_FIELD}: lists "
                                   f"{len(table)} frames, the sample holds {frames}")
        return StoredVideo(reader, local, members, table)

    def pick_frames(self, video: StoredVideo, rng: np.random.Generator) -> np.ndarray:
        """The frame indices of this sample's clips, (clips_per_video, clip_len), as ``sampling`` says."""
        return clip_indices(len(video.table), self.clip_len, self.stride, self.sampling, self.clips_per_video, rng,
                            seconds=video.table.seconds, fps=self.fps)

    def frame_jpegs(self, video: StoredVideo, wanted: np.ndarray) -> list[bytes | memoryview]:
        """The JPEG bytes of frames ``wanted`` (sorted) of a frames-mode sample: one read of their
        span, each frame checked against its checksum."""
        chosen = [video.members[frame_field(int(i))] for i in wanted]
        start = min(int(m["offset"]) for m in chosen)
        end = max(int(m["offset"]) + int(m["size"]) for m in chosen)
        span = video.reader.read_span(video.local, start, end)
        frames = []
        for member, i in zip(chosen, wanted, strict=True):
            data = span[int(member["offset"]) - start : int(member["offset"]) - start + int(member["size"])]
            if self.verify and member_checksum(data) != int(member["checksum"]):
                raise video.error(f"checksum mismatch in frame {int(i)}")
            frames.append(data)
        return frames

    def decode_video(self, video: StoredVideo, wanted: np.ndarray) -> np.ndarray:
        """Frames ``wanted`` of a video-mode sample, decoded from the stored video, (T, H, W, 3) uint8."""
        field = next(name for name, kind in self.shards.manifest.schema.items() if kind == "video" and name in video.members)
        data = bytes(video.reader.read_member(video.local, video.members[field]))
        try:
            return decode_frames(data, video.table, wanted, name=f"{video.reader.path}:{video.key}")
        except VideoError as e:
            raise video.error(str(e).removeprefix(f"{video.reader.path}:{video.key}: ")) from None


@dataclass(frozen=True)
class StoredVideo:
    """One packed video: its shard reader, position there, members (by field) and frame table."""

    reader: ShardReader
    local: int
    members: dict[str, np.void]
    table: FrameTable

    @property
    def key(self) -> str:
        return self.reader.index.key(self.local)

    @property
    def label(self) -> int:
        return int(self.reader.index.labels[self.local])

    def error(self, reason: str) -> CorruptDataError:
        """A CorruptDataError naming this video's shard, key and ``reason``."""
        return CorruptDataError(self.reader.path, self.key, reason)

    @contextmanager
    def failure(self, what: str) -> Iterator[None]:
        """Turn a decoder's error (any type) into :meth:`error`: ``what`` and the decoder's message."""
        try:
            yield
        except Exception as e:
            raise self.error(f"{what} ({type(e).__name__}: {e})") from None
