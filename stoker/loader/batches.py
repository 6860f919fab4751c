"""Making one batch: the work that pipeline threads share, or that a worker process does alone.

A batch is fully determined by (seed, epoch, batch number, rank) and the order's indices, so it
comes out the same whether 1 thread, 8 threads or a worker process makes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from stoker.data.dataset import ShardDataset
from stoker.errors import CorruptDataError, TransformError
from stoker.loader.buffers import mapped_pixels, thread_buffer
from stoker.loader.crops import BatchDraws, CropSpec, draw_batch
from stoker.loader.decode_crop import decode_into

# Images larger than this are read into new bytes instead of the thread's reused buffer.
_READ_BUFFER_BYTES = 16 << 20

SampleTransform = Callable[[torch.Tensor], torch.Tensor]
OnError = Literal["raise", "skip"]
log = logging.getLogger("stoker.loader")


@dataclass
class Batch:
    """One batch in the making: cropped pixels (NHWC uint8, or (N, T, H, W, C) for clips), labels,
    the random draws behind the crops, and, with a per-sample transform, each sample's transformed
    tensor (or, for the GPU decoder, each sample's undecoded bytes). ``indices`` are the samples
    read: a damaged one skipped under ``on_error="skip"`` is replaced there, and flagged in ``replaced``."""

    epoch: int
    number: int
    indices: np.ndarray
    images: torch.Tensor
    labels: torch.Tensor
    draws: BatchDraws
    transformed: list[torch.Tensor | None] | None
    encoded: list[torch.Tensor | None] | None = None  # decode="gpu": each sample's bytes, decoded on the GPU
    replaced: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per sample: a damaged one was skipped


@dataclass(frozen=True)
class BatchMaker:
    """Reads, decodes, crops and (optionally) transforms the images of a batch. Picklable: a
    worker process gets a copy and makes whole batches with it. Subclasses make batches of other
    samples (see stoker/loader/clips.py) by saying what one sample's pixels are. With ``on_error``
    "skip", a damaged sample (CorruptDataError: bad bytes, or pixels no decoder accepts) is
    replaced by the next readable one in the data set, with the same crop, as ShardDataset does."""

    dataset: ShardDataset
    crop: CropSpec
    transform: SampleTransform | None
    seed: int
    rank: int
    world_size: int
    on_error: OnError = "raise"

    def start(self, epoch: int, number: int, indices: np.ndarray, shared: bool = False,
              pixels: torch.Tensor | None = None) -> Batch:
        """Start batch ``number`` of ``epoch`` (its samples are ``indices``) and draw its crops; its
        pixels go into ``pixels`` (a reused buffer of the batch's shape), else fresh memory:
        shared memory with ``shared``, for a worker process to hand over without a copy."""
        shape = (len(indices), *self.sample_shape())
        if pixels is not None and tuple(pixels.shape) == shape:
            images = pixels
        else:
            images = torch.empty(shape, dtype=torch.uint8).share_memory_() if shared else mapped_pixels(shape)
        labels = torch.empty(len(indices), dtype=torch.int64)
        draws = self.draws(epoch, number, len(indices))
        transformed = [None] * len(indices) if self.transform is not None else None
        return Batch(epoch, number, np.array(indices), images, labels, draws, transformed,
                     replaced=np.zeros(len(indices), bool))

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
            targets[j] = self._place_readable(batch, int(j), pixels[j])
            index = int(batch.indices[j])
            if batch.transformed is not None:
                channels_first = batch.images[j].movedim(-1, -3)  # (3, H, W), or (T, 3, H, W) for a clip
                batch.transformed[j] = self._transform(index, channels_first)

    def _place_readable(self, batch: Batch, j: int, out: np.ndarray) -> int:
        """:meth:`place` sample ``j``; under ``on_error="skip"``, the next readable sample instead of
        a damaged one (its index written into ``batch.indices``)."""
        n = len(self.dataset)
        first = int(batch.indices[j])
        for attempt in range(n):
            try:
                return self.place(batch, j, out)
            except CorruptDataError as e:
                if self.on_error == "raise":
                    raise
                batch.replaced[j] = True
                log.warning("skipping damaged sample: %s", e)
                batch.indices[j] = (first + attempt + 1) % n
        raise CorruptDataError(self.dataset.root, None, "no readable sample left")

    def place(self, batch: Batch, j: int, out: np.ndarray) -> int:
        """Read sample ``j`` of ``batch``, decode and crop it into ``out``; its label."""
        index = int(batch.indices[j])
        data, label = self.dataset.read_image(index, thread_buffer("read", _READ_BUFFER_BYTES))
        try:
            decode_into(data, self.crop, batch.draws.tries[j], bool(batch.draws.flips[j]), out)
        except Exception as e:  # decoders raise many types for bad data
            raise self.dataset.decode_error(index, e) from None
        return label

    def finish(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)``: NHWC uint8 pixels, or the transformed samples stacked."""
        if batch.transformed is None:
            return batch.images, batch.labels
        return torch.stack(batch.transformed), batch.labels  # type: ignore[arg-type]

    def make(self, epoch: int, number: int, indices: np.ndarray) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        """A whole batch, made by the calling thread (a worker process's job), and how many damaged
        samples it skipped."""
        batch = self.start(epoch, number, indices, shared=True)
        self.fill(batch, np.arange(len(indices)))
        return self.finish(batch), int(batch.replaced.sum())

    def _transform(self, index: int, image: torch.Tensor) -> torch.Tensor:
        assert self.transform is not None
        try:
            return self.transform(image)
        except Exception as e:
            raise TransformError(self.dataset.key(index), f"{type(e).__name__}: {e}") from e
