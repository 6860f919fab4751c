"""Making one batch: the work that pipeline threads share, or that a worker process does alone.

A batch is fully determined by (seed, epoch, batch number, rank) and the order's indices, so it
comes out the same whether 1 thread, 8 threads or a worker process makes it.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from stoker.data.dataset import ShardDataset
from stoker.errors import TransformError
from stoker.loader.buffers import thread_buffer
from stoker.loader.crops import BatchDraws, CropSpec, draw_batch
from stoker.loader.decode_crop import decode_into

# Images larger than this are read into new bytes instead of the thread's reused buffer.
_READ_BUFFER_BYTES = 16 << 20

SampleTransform = Callable[[torch.Tensor], torch.Tensor]


def _unshared_pixels(shape: tuple[int, ...]) -> torch.Tensor:
    """A uint8 tensor in an anonymous memory map of its own, unmapped when the tensor is freed.
    glibc serves allocations under its dynamic mmap threshold (up to 32 MB) from a heap it rarely
    gives back: measured here, batches of 256 at 160 px (19.7 MB each) took the Loader's peak PSS
    from 293 to ~480 MB that way. The pages are mapped in at once (MAP_POPULATE): faulting them
    in one by one while decoding into them cost ~150 us per 230 KB frame here (decoding into
    a batch of 16 clips of 320x240: 439 us per frame; populated: 314; reused memory: 283)."""
    nbytes = math.prod(shape)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return torch.frombuffer(mmap.mmap(-1, max(1, nbytes), flags=flags), dtype=torch.uint8, count=nbytes).view(shape)


@dataclass
class Batch:
    """One batch in the making: cropped pixels (NHWC uint8, or (N, T, H, W, C) for clips), labels,
    the random draws behind the crops, and, with a per-sample transform, each sample's transformed
    tensor (or, for the GPU decoder, each sample's undecoded bytes)."""

    epoch: int
    number: int
    indices: np.ndarray
    images: torch.Tensor
    labels: torch.Tensor
    draws: BatchDraws
    transformed: list[torch.Tensor | None] | None
    encoded: list[torch.Tensor | None] | None = None  # decode="gpu": each sample's bytes, decoded on the GPU


@dataclass(frozen=True)
class BatchMaker:
    """Reads, decodes, crops and (optionally) transforms the images of a batch. Picklable: a
    worker process gets a copy and makes whole batches with it. Subclasses make batches of other
    samples (see stoker/loader/clips.py) by saying what one sample's pixels are."""

    dataset: ShardDataset
    crop: CropSpec
    transform: SampleTransform | None
    seed: int
    rank: int
    world_size: int

    def start(self, epoch: int, number: int, indices: np.ndarray, shared: bool = False) -> Batch:
        """Allocate batch ``number`` of ``epoch`` (its samples are ``indices``) and draw its crops.
        ``shared`` puts the pixels in shared memory, for a worker process to hand over without a copy."""
        shape = (len(indices), *self.sample_shape())
        images = torch.empty(shape, dtype=torch.uint8).share_memory_() if shared else _unshared_pixels(shape)
        labels = torch.empty(len(indices), dtype=torch.int64)
        draws = self.draws(epoch, number, len(indices))
        transformed = [None] * len(indices) if self.transform is not None else None
        return Batch(epoch, number, indices, images, labels, draws, transformed)

    def draws(self, epoch: int, number: int, n: int) -> BatchDraws:
        """The crops of batch ``number`` of ``epoch``: drawn from (seed, epoch, the batch's number
        across ranks), so they do not depend on what makes the batch."""
        return draw_batch(self.seed, epoch, self.batch_key(number), n, self.crop)

    def batch_key(self, number: int) -> int:
        """Batch ``number`` of this rank, numbered across all ranks."""
        return number * self.world_size + self.rank

    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample's pixels in the batch: (H, W, 3)."""
        return (*self.crop.size, 3)

    def fill(self, batch: Batch, positions: np.ndarray) -> None:
        """Read, decode and place the samples at ``positions`` of ``batch`` (any thread)."""
        pixels, targets = batch.images.numpy(), batch.labels.numpy()
        for j in positions:
            index = int(batch.indices[j])
            targets[j] = self.place(batch, int(j), pixels[j])
            if batch.transformed is not None:
                channels_first = batch.images[j].movedim(-1, -3)  # (3, H, W), or (T, 3, H, W) for a clip
                batch.transformed[j] = self._transform(index, channels_first)

    def place(self, batch: Batch, j: int, out: np.ndarray) -> int:
        """Read sample ``j`` of ``batch``, decode and crop it into ``out``; its label."""
        index = int(batch.indices[j])
        data, label = self.dataset.read_image(index, thread_buffer("read", _READ_BUFFER_BYTES))
        try:
            decode_into(data, self.crop, batch.draws.tries[j], bool(batch.draws.flips[j]), out, self.dataset.restart_rows)
        except Exception as e:  # decoders raise many types for bad data
            raise self.dataset.decode_error(index, e) from None
        return label

    def finish(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)``: NHWC uint8 pixels, or the transformed samples stacked."""
        if batch.transformed is None:
            return batch.images, batch.labels
        return torch.stack(batch.transformed), batch.labels  # type: ignore[arg-type]

    def make(self, epoch: int, number: int, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch, made by the calling thread (a worker process's job)."""
        batch = self.start(epoch, number, indices, shared=True)
        self.fill(batch, np.arange(len(indices)))
        return self.finish(batch)

    def _transform(self, index: int, image: torch.Tensor) -> torch.Tensor:
        assert self.transform is not None
        try:
            return self.transform(image)
        except Exception as e:
            raise TransformError(self.dataset.key(index), f"{type(e).__name__}: {e}") from e
