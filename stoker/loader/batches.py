"""The batch engine: one batch's read, decode, crop, augmentation and per-sample transform, made
with the strategies the Loader's plan gives it (engine.py picks them):

    samples     what a sample is, placed one at a time from Python: Images (images.py), Clips (clips.py)
    decode      how the samples a thread takes become pixels: NativeChunk (native_chunk.py: one C call,
                then the rest one at a time), PerImage (below), GpuDecode (gpu_decode.py: the threads
                read bytes, the GPU decodes the batch)
    augment     the batched ops, on the thread that decoded each crop: NativeAugment or OpenCvAugment
                (thread_augment.py); None (none, or on the GPU when the batch is delivered: delivery.py)
    transform   the rest of the user's transform, run on each sample as given (PerSample); None

A batch is fully determined by (seed, epoch, its key: where it lies in the epoch's sequence) and
its indices, so it comes out the same whether 1 thread, 8 threads or a worker process makes it.
With a batched augmentation, its parameters are drawn once per batch from those numbers too, and
each thread augments the images it decoded, right after decoding them. The engine and its
strategies pickle: a worker process gets a copy and makes whole batches (or parts) with it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from stoker.data.epoch import RankBatches
from stoker.data.readable import Readable, shard_bounds_of
from stoker.data.skips import Skips
from stoker.decode.crops import CROP_TRIES, BatchDraws, CropSpec, draw_batch
from stoker.decode.scratch import thread_buffer
from stoker.errors import TransformError
from stoker.loader.buffers import mapped_pixels

SampleTransform = Callable[[torch.Tensor], torch.Tensor]
OnError = Literal["raise", "skip"]
# What the batch-making generators (threads, processes) yield: the batch's number, (images, labels), samples skipped.
Made = tuple[int, tuple[torch.Tensor, torch.Tensor], int]


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


@dataclass
class Batch:
    """One batch in the making: cropped pixels (NHWC uint8 or float, (N, T, H, W, C) for clips),
    labels, the random draws behind the crops, and ``held``: what a sample keeps outside the pixels
    (its whole image, then the per-sample transform's result; or its bytes, for the GPU).
    ``indices`` are the samples read: a damaged one skipped under ``on_error="skip"`` is replaced
    there, and flagged in ``replaced``."""

    epoch: int
    number: int
    indices: np.ndarray
    images: torch.Tensor
    labels: torch.Tensor
    draws: BatchDraws
    held: list[Any] | None
    replaced: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per sample: a damaged one was skipped
    augmentation: Any = None  # the batched augmentation's parameters, as its strategy drew them for the batch


class Samples(Protocol):
    """What a batch's samples are (images.py, clips.py): ``shape(crop)``, one sample's pixels in
    the batch ((0,): whole images, kept in ``batch.held``); ``place(maker, batch, j, out)`` reads
    sample ``j``, decodes and crops it into ``out`` (None: whole, into ``batch.held[j]``) and
    returns its label, or raises CorruptDataError."""

    @property
    def dataset(self) -> Readable: ...

    def shape(self, crop: CropSpec | None) -> tuple[int, ...]: ...

    def place(self, maker: BatchMaker, batch: Batch, j: int, out: np.ndarray | None) -> int: ...


class Decode(Protocol):
    """How samples become pixels: ``place`` makes the samples at ``positions`` of a batch, position
    ``k``'s pixels into ``out[slots[k]]`` (the batch's slots, or a thread's scratch to augment
    from) and its label into ``batch.labels``; ``images`` gives the batch's pixels once all are
    placed; ``host``: they are made in the batch's host memory (else by ``images``: the GPU)."""

    host: bool

    def place(self, maker: BatchMaker, batch: Batch, positions: np.ndarray, out: np.ndarray | None,
              slots: np.ndarray) -> None: ...

    def images(self, maker: BatchMaker, batch: Batch) -> torch.Tensor: ...


class Augmentation(Protocol):
    """Batched ops run in the threads (thread_augment.py): ``draw`` their parameters for a batch of
    ``n`` crops once (``step``: the batch's own draw), ``apply`` them to ``crops`` (one per
    position) into ``out[positions]``; ``dtype``: the batch's (uint8: rounded back)."""

    @property
    def dtype(self) -> torch.dtype: ...

    def draw(self, n: int, height: int, width: int, step: int) -> Any: ...

    def apply(self, batch: Batch, positions: np.ndarray, crops: np.ndarray, out: np.ndarray) -> None: ...


@dataclass(frozen=True)
class PerImage:
    """The :class:`Decode` that places every sample from Python, one at a time, as its :class:`Samples` says."""

    host = True

    def place(self, maker: BatchMaker, batch: Batch, positions: np.ndarray, out: np.ndarray | None,
              slots: np.ndarray) -> None:
        maker.place_each(batch, positions, out, slots)

    def images(self, maker: BatchMaker, batch: Batch) -> torch.Tensor:
        return batch.images


@dataclass(frozen=True)
class BatchMaker:
    """Reads, decodes, crops, augments and transforms the samples of a batch, with the strategies
    it is given (see the module's docstring). With ``on_error`` "skip", a damaged sample
    (CorruptDataError: bad bytes, or pixels no decoder accepts) is replaced by the next readable one
    in the data set, with the same crop, by ShardDataset's rule (stoker/data/skips.py; ``skips``:
    what this engine found damaged in this process)."""

    samples: Samples
    decode: Decode
    crop: CropSpec | None  # None: whole images, decoded with Pillow for ``transform`` (which makes them one size)
    seed: int
    batches: RankBatches  # where the pass's batches lie in the epoch: their draws are keyed by it
    on_error: OnError = "raise"
    augment: Augmentation | None = None
    transform: SampleTransform | None = None
    skips: Skips = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "skips", Skips(shard_bounds_of(self.dataset)))

    @property
    def dataset(self) -> Readable:
        """The data set the samples come from."""
        return self.samples.dataset

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
        if self.crop is None:
            draws = BatchDraws(np.zeros((n, CROP_TRIES, 4)), np.zeros(n, dtype=bool))
        else:  # drawn from (seed, epoch, the batch's key): they do not depend on what makes the batch
            draws = draw_batch(self.seed, epoch, self.batch_key(number), n, self.crop)
        held = [None] * n if self.transform is not None or not self.decode.host else None
        augmentation = None
        if self.augment is not None:
            augmentation = self.augment.draw(n, shape[1], shape[2], self.augment_step(epoch, number))
        return Batch(epoch, number, np.array(indices), images, torch.empty(n, dtype=torch.int64), draws, held,
                     replaced=np.zeros(n, bool), augmentation=augmentation)

    def batch_key(self, number: int) -> int:
        """Batch ``number`` of this rank's pass as a key of its own in the epoch: the position of its
        first sample in the epoch's global sequence (the same on every resume of the same run)."""
        return self.batches.first(number)

    def augment_step(self, epoch: int, number: int) -> int:
        """Which draw of the augmentation's seeded stream batch ``number`` of ``epoch`` gets: a
        number of its own for every (epoch, batch key), never a count of earlier calls."""
        return (epoch << 32) + self.batch_key(number)

    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample's pixels in the batch's host memory ((0,): none there)."""
        return self.samples.shape(self.crop) if self.decode.host else (0,)

    def pixel_dtype(self) -> torch.dtype:
        """The batch's pixels: uint8, or float32 where the augmentation writes floats."""
        return torch.float32 if self.augment is not None and self.augment.dtype != torch.uint8 else torch.uint8

    def buffer_shape(self) -> tuple[int, ...]:
        """:meth:`sample_shape` in bytes (a uint8 buffer, viewed as :meth:`pixel_dtype`)."""
        shape = self.sample_shape()
        return (*shape[:-1], shape[-1] * self.pixel_dtype().itemsize)

    def fill(self, batch: Batch, positions: np.ndarray) -> None:
        """Read, decode, crop, augment and transform the samples at ``positions`` of ``batch`` (any
        thread): the decode strategy makes them into their slots of the batch or, to augment from,
        into this thread's scratch."""
        positions = np.asarray(positions, np.int64)
        out, slots = (None if self.crop is None else batch.images.numpy()), positions
        if self.augment is not None and self.crop is not None:
            shape = (len(positions), *self.sample_shape())
            size = int(np.prod(shape))
            out, slots = np.frombuffer(thread_buffer("crop", size), np.uint8, size).reshape(shape), np.arange(len(slots))
        self.decode.place(self, batch, positions, out, slots)
        if self.augment is not None and out is not None:
            self.augment.apply(batch, positions, out, batch.images.numpy())
        if self.transform is not None:
            held = batch.held
            assert held is not None  # start() makes it for a transform
            for j in map(int, positions):
                # the whole image as ImageFolder gives it, or the crop as (3, H, W) ((T, 3, H, W) for a
                # clip); a tensor view only here: making one costs ~20 us of held GIL per image
                image = held[j] if self.crop is None else batch.images[j].movedim(-1, -3)
                held[j] = self._transform(int(batch.indices[j]), image)

    def place_each(self, batch: Batch, positions: np.ndarray, out: np.ndarray | None, slots: np.ndarray) -> None:
        """Place the samples at ``positions`` one at a time (position ``k`` into ``out[slots[k]]``);
        under ``on_error="skip"`` the next readable sample in place of a damaged one (its index
        written into ``batch.indices``)."""
        labels = batch.labels.numpy()
        for k, j in enumerate(map(int, positions)):
            target = None if out is None else out[slots[k]]

            def place(index: int, j: int = j, target: np.ndarray | None = target) -> int:
                batch.indices[j] = index
                return self.samples.place(self, batch, j, target)

            first = int(batch.indices[j])
            if self.on_error == "raise":
                labels[j] = place(first)
                continue
            found, labels[j] = self.skips.first_readable(first, place, self.dataset.root)
            batch.replaced[j] = found != first

    def finish(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)``: NHWC pixels (uint8, or float as augmented), or the transformed samples stacked."""
        if self.transform is None or batch.held is None:  # (start() makes ``held`` for a transform)
            return self.delivered(self.decode.images(self, batch)), batch.labels
        try:
            return torch.stack(batch.held), batch.labels
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
