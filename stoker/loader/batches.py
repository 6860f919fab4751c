"""Making one batch: the work that pipeline threads share, or that a worker process does alone.

A batch is fully determined by (seed, epoch, its key: where it lies in the epoch's sequence) and
its indices, so it
comes out the same whether 1 thread, 8 threads or a worker process makes it. With a batched
augmentation (a translated torchvision pipeline), its parameters are drawn once per batch from
those numbers too, and each thread augments the images it decoded, right after decoding them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from stoker.augment.native import NativeOps, augment_chunk, encode, supports
from stoker.augment.pipeline import Augment, Draws
from stoker.data.dataset import ShardDataset
from stoker.data.decode import decode_image
from stoker.data.epoch import RankBatches
from stoker.data.mix import Mix
from stoker.data.readable import shard_bounds_of
from stoker.data.skips import Skips
from stoker.errors import TransformError
from stoker.loader.buffers import mapped_pixels, thread_buffer
from stoker.loader.crops import CROP_TRIES, BatchDraws, CropSpec, draw_batch
from stoker.loader.decode_crop import decode_into
from stoker.loader.native_chunk import decode_samples, decodes_natively

# Images larger than this are read into new bytes instead of the thread's reused buffer.
_READ_BUFFER_BYTES = 16 << 20

SampleTransform = Callable[[torch.Tensor], torch.Tensor]
OnError = Literal["raise", "skip"]


def split(positions: np.ndarray, threads: int) -> list[np.ndarray]:
    """A batch's ``positions`` as one share per thread: every ``threads``-th one, so that each
    thread's share spreads over the order the bytes arrive in."""
    return [positions[t::threads] for t in range(min(threads, len(positions)))]


def part_positions(n: int, part: int, parts: int) -> np.ndarray:
    """The positions of a batch of ``n`` that its ``part`` of ``parts`` makes (:func:`split`'s share)."""
    return np.arange(part, n, parts)


_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # per (process id, threads): made on first use


def _process_pool(threads: int) -> ThreadPoolExecutor:
    """This process's pool of ``threads`` threads for :meth:`BatchMaker.make` (kept for the
    worker's life; a forked child makes its own: the parent's threads are not in it)."""
    key = (os.getpid(), threads)
    if key not in _pools:
        _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="stoker-worker")
    return _pools[key]


@dataclass(frozen=True)
class ThreadAugment:
    """Batched augmentation run image by image on the thread that decoded the image: ``augment``
    (CPU, opencv backend; its parameters drawn once per batch) writes float32, which the batch
    keeps as ``dtype``: a float dtype, or uint8 (rounded back) where the pipeline is still at uint8."""

    augment: Augment
    dtype: torch.dtype = torch.float32


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
    transformed: list[Any] | None  # each sample's transformed tensor (first its whole image, without a crop)
    encoded: list[torch.Tensor] | None = None  # decode="gpu": each sample's bytes, decoded on the GPU
    replaced: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per sample: a damaged one was skipped
    augment_draws: Draws | None = None  # the batched augmentation's parameters, drawn once for the batch
    native_ops: NativeOps | None = None  # the same as the photometric extension's arrays, where it runs them


@dataclass(frozen=True)
class BatchMaker:
    """Reads, decodes, crops and (optionally) transforms the images of a batch. Picklable: a
    worker process gets a copy and makes whole batches with it. Subclasses make batches of other
    samples (see stoker/loader/clips.py) by saying what one sample's pixels are. With ``on_error``
    "skip", a damaged sample (CorruptDataError: bad bytes, or pixels no decoder accepts) is
    replaced by the next readable one in the data set, with the same crop, by ShardDataset's rule
    (stoker/data/skips.py; ``skips``: what this maker found damaged in this process)."""

    dataset: ShardDataset | Mix
    crop: CropSpec | None  # None: whole images, decoded with Pillow for ``transform`` (which makes them one size)
    transform: SampleTransform | None
    seed: int
    batches: RankBatches  # where the pass's batches lie in the epoch: their draws are keyed by it
    on_error: OnError = "raise"
    augment: ThreadAugment | None = None
    skips: Skips = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "skips", Skips(shard_bounds_of(self.dataset)))

    def start(self, epoch: int, number: int, indices: np.ndarray, shared: bool = False,
              pixels: torch.Tensor | None = None) -> Batch:
        """Start batch ``number`` of ``epoch`` (its samples are ``indices``) and draw its crops; its
        pixels go into ``pixels`` (a reused buffer of at least the batch's shape), else fresh memory:
        shared memory with ``shared``, for a worker process to hand over without a copy."""
        n, dtype = len(indices), self.pixel_dtype()
        shape, nbytes = (n, *self.sample_shape()), (n, *self.buffer_shape())
        if pixels is not None and tuple(pixels.shape[1:]) == nbytes[1:] and len(pixels) >= n:
            images = pixels[:n].view(dtype)  # the epoch's short last batch too: no fresh 24-38 MB to fault in
        elif shared:
            images = torch.empty(shape, dtype=dtype).share_memory_()
        else:
            images = mapped_pixels(nbytes).view(dtype)
        labels = torch.empty(n, dtype=torch.int64)
        if self.crop is None:
            draws = BatchDraws(np.zeros((n, CROP_TRIES, 4)), np.zeros(n, dtype=bool))
        else:
            draws = self.draws(epoch, number, n)
        transformed: list[Any] | None = [None] * n if self.transform is not None else None
        augment_draws, native_ops = None, None
        if self.augment is not None:
            height, width = shape[1:3]
            augment_draws = self.augment.augment.draw((np.full(n, height), np.full(n, width)),
                                                      step=self.augment_step(epoch, number))
            if self.augments_natively():
                native_ops = encode(self.augment.augment, augment_draws, n)
        return Batch(epoch, number, np.array(indices), images, labels, draws, transformed,
                     replaced=np.zeros(n, bool), augment_draws=augment_draws, native_ops=native_ops)

    def draws(self, epoch: int, number: int, n: int) -> BatchDraws:
        """The crops of batch ``number`` of the pass over ``epoch``: drawn from (seed, epoch, the
        batch's key), so they do not depend on what makes the batch."""
        assert self.crop is not None, "whole images have no crop to draw"
        return draw_batch(self.seed, epoch, self.batch_key(number), n, self.crop)

    def batch_key(self, number: int) -> int:
        """Batch ``number`` of this rank's pass as a key of its own in the epoch: the position of its
        first sample in the epoch's global sequence (the same on every resume of the same run)."""
        return self.batches.first(number)

    def augment_step(self, epoch: int, number: int) -> int:
        """Which draw of the augmentation's seeded stream batch ``number`` of ``epoch`` gets: a
        number of its own for every (epoch, batch key), never a count of earlier calls."""
        return (epoch << 32) + self.batch_key(number)

    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample's pixels in the batch: (H, W, 3); (0,) for whole images."""
        return (*self.crop.size, 3) if self.crop is not None else (0,)

    def pixel_dtype(self) -> torch.dtype:
        """The batch's pixels: uint8, or float32 where the augmentation writes floats."""
        return torch.float32 if self.augment is not None and self.augment.dtype != torch.uint8 else torch.uint8

    def buffer_shape(self) -> tuple[int, ...]:
        """:meth:`sample_shape` in bytes (a uint8 buffer, viewed as :meth:`pixel_dtype`)."""
        shape = self.sample_shape()
        return (*shape[:-1], shape[-1] * self.pixel_dtype().itemsize)

    def fill(self, batch: Batch, positions: np.ndarray) -> None:
        """Read, decode, crop, augment and place the samples at ``positions`` of ``batch`` (any thread):
        first all of them in one native call where it can (native_chunk.py), then one by one what is
        left; the augmentation in one native call too where it can (photometric.py)."""
        pixels, targets = batch.images.numpy(), batch.labels.numpy()
        positions = np.asarray(positions, np.int64)
        crops, made = self._decode_natively(batch, positions)  # crops: this thread's scratch, to augment from
        for k, j in enumerate(map(int, positions)):
            if self.crop is None:
                targets[j] = self._place_readable(batch, j, None)
            elif not made[k]:
                targets[j] = self._place_readable(batch, j, pixels[j] if crops is None else crops[k])
        if crops is not None and batch.native_ops is not None:
            augment_chunk(crops, pixels, batch.native_ops, positions)
        elif crops is not None:
            for k, j in enumerate(map(int, positions)):
                self._augment(batch, j, crops[k], pixels[j])
        if batch.transformed is not None:
            for j in map(int, positions):
                # the whole image as ImageFolder gives it, or the crop as (3, H, W) ((T, 3, H, W) for a
                # clip); a tensor view only here: making one costs ~20 us of held GIL per image
                image = batch.transformed[j] if self.crop is None else batch.images[j].movedim(-1, -3)
                batch.transformed[j] = self._transform(int(batch.indices[j]), image)

    def _decode_natively(self, batch: Batch, positions: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(crops, made): the samples at ``positions`` decoded and cropped by one native call where
        it can make them, into their slots of the batch, or, with an augmentation, into this
        thread's scratch (``crops[k]``: position k's crop); ``made[k]``: done, label set."""
        made = np.zeros(len(positions), bool)
        crops = None
        if self.crop is not None and self.augment is not None:
            shape = (len(positions), *self.sample_shape())
            size = int(np.prod(shape))
            crops = np.frombuffer(thread_buffer("crop", size), np.uint8, size).reshape(shape)
        if not self.natively_decoded() or not len(positions):
            return crops, made
        assert self.crop is not None
        indices, draws = batch.indices[positions], BatchDraws(batch.draws.tries[positions], batch.draws.flips[positions])
        out, slots = (batch.images.numpy(), positions) if crops is None else (crops, np.arange(len(positions)))
        made, labels = decode_samples(self.dataset, self.crop, self.dataset.restart_rows, indices, draws, out, slots)
        batch.labels.numpy()[positions[made]] = labels[made]
        return crops, made

    def decode_route(self) -> str:
        """How this maker reads, decodes and crops samples, and why (for :meth:`Loader.explain`)."""
        if self.natively_decoded():
            return "one native call per chunk of samples on each thread, the GIL released (decode_chunk)"
        if self.crop is None:
            reason = "whole images: no crop to fuse"
        elif not decodes_natively(self.crop):
            reason = "the region-decode extension is not built here (see stoker env)"
        else:
            reason = f"{type(self).__name__} reads its samples its own way"
        return f"per image from Python ({reason})"

    def augments_natively(self) -> bool:
        """Whether the batched augmentation runs as one native call per chunk (photometric.py)."""
        return self.augment is not None and supports(self.augment.augment)

    def augment_route(self) -> str:
        """How the batched augmentation runs on the CPU, for :meth:`Loader.explain`."""
        if self.augments_natively():
            return "one native call per chunk of crops on each thread, the GIL released (stoker.augment._photometric)"
        return "each image by the loader thread that decoded it (stoker.augment's OpenCV ops)"

    def natively_decoded(self) -> bool:
        """Whether this maker's samples go through one native call per chunk (native_chunk.py): a
        crop it makes, of images placed as :meth:`place` does (not clips, not the GPU decoder's bytes)."""
        return decodes_natively(self.crop) and type(self).place is BatchMaker.place

    def _augment(self, batch: Batch, j: int, cropped: np.ndarray, out: np.ndarray) -> None:
        """Augment sample ``j``'s crop into ``out``, its slot of the batch (float32, or rounded to uint8)."""
        assert self.augment is not None and batch.augment_draws is not None
        if out.dtype == np.float32:
            self.augment.augment.apply_image(cropped, j, batch.augment_draws, out)
            return
        result = np.frombuffer(thread_buffer("augmented", out.size * 4), np.float32, out.size).reshape(out.shape)
        self.augment.augment.apply_image(cropped, j, batch.augment_draws, result)
        np.multiply(result, 255, out=result)
        np.rint(result, out=result)
        out[...] = result

    def _place_readable(self, batch: Batch, j: int, out: np.ndarray | None) -> int:
        """:meth:`place` sample ``j``; under ``on_error="skip"``, the next readable sample instead of
        a damaged one (its index written into ``batch.indices``)."""

        def place(index: int) -> int:
            batch.indices[j] = index
            return self.place_whole(batch, j) if out is None else self.place(batch, j, out)

        first = int(batch.indices[j])
        if self.on_error == "raise":
            return place(first)
        found, label = self.skips.first_readable(first, place, self.dataset.root)
        batch.replaced[j] = found != first
        return label

    def place_whole(self, batch: Batch, j: int) -> int:
        """Read sample ``j`` of ``batch`` and decode the whole image as ImageFolder's loader does (an
        RGB PIL image), kept in ``batch.transformed[j]`` for the transform (no crop); its label."""
        index = int(batch.indices[j])
        data, label = self.dataset.read_image(index)
        try:
            batch.transformed[j] = decode_image(bytes(data), "pil")  # type: ignore[index]
        except Exception as e:  # decoders raise many types for bad data
            raise self.dataset.decode_error(index, e) from None
        return label

    def place(self, batch: Batch, j: int, out: np.ndarray) -> int:
        """Read sample ``j`` of ``batch``, decode and crop it into ``out``; its label."""
        index = int(batch.indices[j])
        assert self.crop is not None  # only whole images (place_whole) have none
        data, label = self.dataset.read_image(index, thread_buffer("read", _READ_BUFFER_BYTES))
        try:
            decode_into(data, self.crop, batch.draws.tries[j], bool(batch.draws.flips[j]), out, self.dataset.restart_rows)
        except Exception as e:  # decoders raise many types for bad data
            raise self.dataset.decode_error(index, e) from None
        return label

    def finish(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)``: NHWC pixels (uint8, or float as augmented), or the transformed samples stacked."""
        if batch.transformed is None:
            return self.delivered(batch.images), batch.labels
        try:
            return torch.stack(batch.transformed), batch.labels
        except RuntimeError as e:  # sizes differ: the transform did not make them one size
            first = self.dataset.key(int(batch.indices[0]))
            raise TransformError(first, f"the per-sample transform's results of this batch cannot be stacked ({e}); "
                                 "a DataLoader could not collate them either") from None

    def delivered(self, images: torch.Tensor) -> torch.Tensor:
        """A batch's pixels (:meth:`pixel_dtype`) as the loop gets them: uint8, or the augmentation's dtype."""
        wanted = self.augment.dtype if self.augment is not None else torch.uint8
        return images if images.dtype == wanted else images.to(wanted)

    def make(self, epoch: int, number: int, indices: np.ndarray, threads: int = 1, pixels: torch.Tensor | None = None,
             part: int = 0, parts: int = 1) -> Batch:
        """Batch ``number`` of ``epoch``, or its ``part`` of ``parts`` (the samples at :func:`part_positions`:
        what one of several worker processes makes), made by the calling thread and ``threads`` - 1
        more of this process into ``pixels`` (a buffer of the batch's bytes), else fresh shared
        memory (a worker process's job). The process's own random generators (torch's, Python's),
        which per-sample transforms draw from, are seeded from the batch's numbers first, so the
        batch is the same whichever worker makes it (with one thread; with more, which sample draws
        first depends on the threads)."""
        if self.transform is not None:
            seed = int(np.random.SeedSequence([self.seed, epoch, self.batch_key(number)]).generate_state(1)[0])
            torch.manual_seed(seed)
            random.seed(seed)
        batch = self.start(epoch, number, indices, shared=pixels is None, pixels=pixels)
        positions = part_positions(len(indices), part, parts)
        if threads > 1:
            for future in [_process_pool(threads).submit(self.fill, batch, chunk) for chunk in split(positions, threads)]:
                future.result()
        else:
            self.fill(batch, positions)
        return batch

    def _transform(self, index: int, image: torch.Tensor) -> torch.Tensor:
        assert self.transform is not None
        try:
            return self.transform(image)
        except Exception as e:
            raise TransformError(self.dataset.key(index), f"{type(e).__name__}: {e}") from e
