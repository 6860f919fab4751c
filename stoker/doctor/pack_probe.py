"""The sample packed: the doctor's sampled images written as a small stoker data set in a
temporary folder, read back front to back cold, and stoker.Loader timed on it (warm; cold where
the folder is on the data's disk; with the user's transform after the crop; decoding on the GPU
where there is one). The remedies that use stoker are predicted from these runs of stoker itself
on the user's images, not from a rule of thumb (a rule, 85% of the cores' simplejpeg rate, read
19% low on ImageNet-like photos).

The sample is repeated (each repeat stored apart, so a cold pass reads it again from the disk)
up to a few thousand images or a byte cap, so a pass is long enough for a cold read to reach its
steady rate.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.utils.data
from PIL import Image

from stoker.data.dataset import ShardDataset
from stoker.doctor.compute_probe import transform_stages
from stoker.doctor.contention import CpuWatch, block_device
from stoker.doctor.loader_probe import LoaderRow
from stoker.doctor.numbers import rounded
from stoker.doctor.standard import StandardTransform
from stoker.doctor.storage_probe import resident, sequential_rate
from stoker.doctor.timing import time_passes
from stoker.errors import StokerError
from stoker.loader import CropSpec, Loader
from stoker.pack import pack
from stoker.storage import evict
from stoker.transforms.torchvision_plan import is_torchvision, plan

# Stages of a user's transform that stoker.Loader's default crop does itself (RandomResizedCrop
# then a horizontal flip, as torchvision's and stoker's standard transform name them).
FUSED_HEAD = ("RandomResizedCrop", "RandomHorizontalFlip")
_SHARD_BYTES = 32 << 20


class SampleItems(torch.utils.data.Dataset):
    """The sampled images' stored bytes, ``repeats`` times over, as items ``stoker.pack`` keeps unchanged."""

    def __init__(self, blobs: Sequence[bytes], repeats: int) -> None:
        self.blobs, self.repeats = list(blobs), repeats

    def __len__(self) -> int:
        return len(self.blobs) * self.repeats

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.blobs[i % len(self.blobs)], 0


class AfterCrop:
    """The stages of a user's transform after the ones the Loader's crop does, run per sample on
    the Loader's threads: the cropped (3, H, W) uint8 tensor becomes the PIL image those stages
    got in the user's pipeline."""

    def __init__(self, stages: Sequence[Callable[[Any], Any]]) -> None:
        self.stages = list(stages)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        item: Any = Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy()))
        for stage in self.stages:
            item = stage(item)
        return item if isinstance(item, torch.Tensor) else torch.from_numpy(np.asarray(item))


def loader_transform(transform: Callable | None) -> tuple[bool, Callable | None]:
    """How stoker.Loader runs ``transform``: ``(True, None)`` when its default crop is the whole
    transform (stoker's standard one, or none); ``(True, transform)`` for a torchvision pipeline
    the Loader reads itself (``Loader(transform=...)``: fused crop, batched augmentation, the rest
    per sample); ``(True, rest)`` when another transform starts with RandomResizedCrop (+ flip)
    and ``rest`` runs per sample after the crop; ``(False, None)`` when the Loader cannot take it.
    """
    if transform is None or isinstance(transform, StandardTransform):
        return True, None
    if is_torchvision(transform):
        try:
            plan(transform, None)
        except ValueError:  # a pipeline the Loader refuses (one that ends in PIL images, ...)
            return False, None
        return True, transform
    stages = [stage for _, stage in transform_stages(transform)]
    head = 0
    while head < len(stages) and head < len(FUSED_HEAD) and type(stages[head]).__name__ == FUSED_HEAD[head]:
        head += 1
    if head == 0:
        return False, None
    return True, AfterCrop(stages[head:])


def stoker_loader(root: str | os.PathLike, batch_size: int, size: int, transform: Callable | None = None,
                  decode: Literal["cpu", "gpu"] = "cpu") -> Loader:
    """The Loader every remedy that uses it is timed with, in the doctor and in ``--prove``: a
    torchvision pipeline says its own crop, anything else runs after a ``size`` crop."""
    crop = None if is_torchvision(transform) else CropSpec(size=(size, size))
    return Loader(ShardDataset(root), batch_size, crop=crop, transform=transform, decode=decode)


@dataclass
class PackProbe:
    """What the sample pack gave: its size, its cold sequential read, and stoker.Loader on it."""

    folder: str
    images: int
    distinct: int
    nbytes: int
    same_device: bool
    eviction_worked: bool
    batch_size: int
    threads: int
    sequential_mb_per_s: float | None = None
    loader: float | None = None
    loader_cold: float | None = None
    loader_transform: float | None = None
    loader_gpu: float | None = None
    loader_capped: float | None = None
    capped_folder: str | None = None
    rows: list[LoaderRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    modelled: LoaderRow | None = None  # the warm run the pipeline model's per-core rate comes from (with the transform)

    def timed(self, name: str, loader: Loader, seconds: float, before_pass: Callable[[], object] | None = None) -> float:
        """Time ``loader`` over the pack as one long epoch; keep its row for the report (:attr:`rows`); its img/s."""
        # Four batches suffice: the Loader's threads deliver steadily, not in bursts as DataLoader workers do.
        watch = CpuWatch().start()
        rate = time_passes(loader, seconds, before_pass=before_pass, min_batches=4)
        self.rows.append(LoaderRow(f"stoker.Loader, {loader.workers.describe()} ({name})", loader.threads, rate.per_second,
                                   rate.first_batch_seconds, watch.stop()))
        return rate.per_second

    @property
    def mean_bytes(self) -> float:
        """Mean stored bytes per image."""
        return self.nbytes / self.images if self.images else 0.0

    def files(self) -> list[str]:
        """The pack's files (shards, indexes, manifest)."""
        return [str(p) for p in sorted(Path(self.folder).iterdir()) if p.is_file()]

    def to_dict(self) -> dict:
        """The report's ``sample_pack`` section."""
        return {"images": self.images, "distinct": self.distinct, "bytes": self.nbytes, "same_device": self.same_device,
                "eviction_worked": self.eviction_worked, "batch_size": self.batch_size, "threads": self.threads,
                "sequential_mb_per_s": rounded(self.sequential_mb_per_s, 2), "loader": rounded(self.loader),
                "loader_cold": rounded(self.loader_cold), "loader_transform": rounded(self.loader_transform),
                "loader_gpu": rounded(self.loader_gpu), "loader_capped": rounded(self.loader_capped), "notes": self.notes}


def pack_sample(blobs: Sequence[bytes], folder: str | os.PathLike, max_images: int, max_bytes: int) -> int:
    """Pack ``blobs`` into ``folder``, repeated up to ``max_images`` images or ``max_bytes``
    (at least once each); the number of repeats."""
    mean = sum(len(b) for b in blobs) / max(1, len(blobs))
    repeats = max(1, min(max_images // max(1, len(blobs)), int(max_bytes / max(1.0, mean * len(blobs)))))
    pack(SampleItems(blobs, repeats), folder, shard_bytes=_SHARD_BYTES, workers=1, progress=False)
    return repeats


def probe_pack(blobs: Sequence[bytes], folder: str, data_path: str, *, size: int, batch_size: int, seconds: float,
               transform: Callable | None, max_images: int, max_bytes: int, capped_side: int | None = None,
               capped_blobs: Sequence[bytes] = ()) -> PackProbe:
    """Pack ``blobs`` into ``folder`` and time, in about ``seconds``: the pack read front to back
    cold, and stoker.Loader over it warm, cold (only where ``folder`` shares the disk of
    ``data_path`` and eviction works there), with ``transform``'s stages after the crop (when
    it has stages the crop does not do), decoding on the GPU (when torch sees one), and on the
    sample shrunk to ``capped_side`` px, ``capped_blobs`` (what the decode probe shrank, when
    ``--max-side`` is proposed: what the Loader's per-image work costs besides decoding is
    measured there, not assumed)."""
    started = time.perf_counter()
    repeats = pack_sample(blobs, folder, max_images, max_bytes)
    dataset = ShardDataset(folder)
    nbytes = int(sum(entry.bytes for entry in dataset.shards.manifest.shards))
    fits, rest = loader_transform(transform)
    same = block_device(folder) is not None and block_device(folder) == block_device(data_path)
    files = [str(Path(folder) / entry.name) for entry in dataset.shards.manifest.shards]
    evict(files)
    evicted = sum(resident(f) for f in files) == 0
    probe = PackProbe(folder, len(dataset), len(blobs), nbytes, same, evicted, batch_size,
                      Loader(dataset, batch_size).threads)
    gpu = torch.cuda.is_available()
    capped = fits and bool(capped_blobs)
    runs = 2 + (same and evicted) + (rest is not None) + gpu + capped
    each = max(0.5, (seconds - (time.perf_counter() - started)) / runs)
    probe.sequential_mb_per_s = sequential_rate(files, each / 2)
    try:
        probe.loader = probe.timed("sample pack, warm", stoker_loader(folder, batch_size, size), each)
        probe.modelled = probe.rows[-1]
    except StokerError as e:  # an image that passed Pillow but not the Loader's decoder: the rest is not timed
        probe.notes.append(f"stoker.Loader could not read the sample pack: {e}")
        return probe
    if same and evicted:
        probe.loader_cold = probe.timed("sample pack, cold", stoker_loader(folder, batch_size, size), each,
                                        before_pass=lambda: evict(files))
    elif not same:
        probe.notes.append(f"the sample was packed on another disk than the data's ({Path(folder).parent}): stoker.Loader "
                           "was timed warm only")
    if rest is not None:
        probe.loader_transform = probe.timed("sample pack, warm, your transform after the crop",
                                             stoker_loader(folder, batch_size, size, rest), each)
        probe.modelled = probe.rows[-1]
    elif not fits:
        probe.notes.append("stoker.Loader with this transform was not timed: it does not start with RandomResizedCrop")
        probe.modelled = None  # the warm run left the transform out
    if capped:
        probe.capped_folder = f"{folder}-capped"
        pack_sample(capped_blobs, probe.capped_folder, probe.images, 1 << 62)
        probe.loader_capped = probe.timed(f"sample shrunk to {capped_side} px as --max-side does, warm",
                                          stoker_loader(probe.capped_folder, batch_size, size, rest), each)
    if gpu:
        try:
            probe.loader_gpu = probe.timed("sample pack, warm, decode='gpu'",
                                           stoker_loader(folder, batch_size, size, decode="gpu"), each)
        except (ImportError, RuntimeError) as e:
            probe.notes.append(f"stoker.Loader(decode='gpu') not timed: {e}")
    if repeats > 1:
        probe.notes.append(f"the pack holds the {len(blobs)} sampled images {repeats} times over")
    return probe
