"""Augment: a seeded chain of augmentations applied to whole batches, parameters per sample.

    uint8 batch (B, C, H, W) or (B, H, W, C), or clips (B, T, ...), or a list of images
      │  parameters drawn on the host per sample (per clip), one generator per call
      ├─> geometric ops: their maps multiplied into one affine map per sample; one bilinear
      │   sampling pass reads the source once and writes the output size
      └─> photometric ops in order on the sampled images; output dtype, channels_last

Two backends compute the same thing. ``torch`` (the default on CUDA) works on whole batches:
grid_sample (always in float32) and vectorized colour ops, in float16 unless asked. ``opencv`` (the default on the
CPU) works image by image on threads: 4-10x faster than the torch ops on a CPU (see
stoker/augment/cpu.py), and always float32 there: grid_sample in float16 or bfloat16 on a CPU
gives wrong values (torch 2.13).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from stoker.augment.color import PHOTOMETRIC, ColorJitter, GaussianBlur, Grayscale, Normalize
from stoker.augment.cpu import augment_image, augment_images
from stoker.augment.device import default_device
from stoker.augment.geometry import (
    GEOMETRIC,
    Affine,
    CenterCrop,
    HorizontalFlip,
    RandomResizedCrop,
    Resampling,
    Resize,
    VerticalFlip,
    sample,
)
from stoker.state import COUNT, EPOCH, SEED, checked, read_state, record

Geometric = RandomResizedCrop | CenterCrop | Resize | HorizontalFlip | VerticalFlip | Affine
Photometric = ColorJitter | Grayscale | GaussianBlur | Normalize
Layout = Literal["auto", "NCHW", "NHWC"]
Backend = Literal["auto", "torch", "opencv"]
Sizes = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Draws:
    """One batch's parameters, drawn before any pixel is touched: each sample's map from output
    to source pixels (None without geometric ops), the output size (height, width), and each
    photometric op's values, one per sample."""

    maps: np.ndarray | None
    size: tuple[int, int]
    params: list[dict[str, np.ndarray]]


class Augment:
    """Apply ``ops`` to batches: ``Augment(RandomResizedCrop(224), HorizontalFlip(), Rotate(30),
    ColorJitter(0.4, 0.4, 0.4, 0.1), Normalize())(images)``.

    Every op draws its own parameters for each sample (each clip of a (B, T, ...) batch: all its
    frames share them), with that op's probability ``p``. Geometric ops (crops, flips, rotation,
    affine) may come in any order, but all before the photometric ones; they cost one sampling
    pass together. The same ``seed`` gives the same outputs for the same batches in the same
    order (each call advances; ``seed=None`` draws fresh randomness). Like stoker's readers it
    has ``set_epoch``, ``state_dict`` and ``load_state_dict`` (see :mod:`stoker.state`): the
    parameters come from (seed, epoch, call number), so a resumed run draws what an uninterrupted
    one would have.

    ``device``: where to compute (default: :func:`default_device`, the GPU of this rank under
    torchrun); a uint8 input moves there as uint8, four times fewer bytes than float32.
    ``dtype``: the output dtype (default float16 on CUDA, float32 on the CPU), also the compute
    dtype of the torch backend on CUDA. ``channels_last``: the output's memory format.
    ``layout``: the input's, ``auto`` from the shape (channels: the dimension of size 1 or 3).
    ``backend``: ``opencv`` (CPU only) or ``torch``; ``auto`` picks opencv on the CPU, using
    ``threads`` threads (default: torch's intra-op thread count). The output is (B, C, H, W),
    or (B, T, C, H, W) for clips.
    """

    def __init__(self, *ops: Geometric | Photometric, seed: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, channels_last: bool = True, layout: Layout = "auto",
                 backend: Backend = "auto", threads: int | None = None) -> None:
        kinds: list[str | None] = ["geometric" if isinstance(op, GEOMETRIC) else "photometric" if isinstance(op, PHOTOMETRIC)
                                   else None for op in ops]
        if None in kinds:
            raise TypeError(f"not an augmentation: {ops[kinds.index(None)]!r}")
        if "photometric" in kinds and "geometric" in kinds[kinds.index("photometric"):]:
            raise ValueError("geometric ops (crops, flips, rotations) must come before photometric ones: "
                             "they are fused into one sampling pass")
        if layout not in ("auto", "NCHW", "NHWC"):
            raise ValueError(f"layout must be auto, NCHW or NHWC, got {layout!r}")
        self.geometric: list[Geometric] = [op for op in ops if isinstance(op, GEOMETRIC)]
        self.photometric: list[Photometric] = [op for op in ops if isinstance(op, PHOTOMETRIC)]
        self.resampling = Resampling.of(self.geometric)
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.backend = backend if backend != "auto" else "opencv" if self.device.type == "cpu" else "torch"
        if self.backend not in ("torch", "opencv") or (self.backend == "opencv" and self.device.type != "cpu"):
            raise ValueError(f"backend must be torch, or opencv on the CPU; got {backend!r} on {self.device}")
        self.threads = threads or torch.get_num_threads() or os.cpu_count() or 1
        self.channels_last, self.layout = channels_last, layout
        self.seed, self.epoch, self._calls = (None if seed is None else SEED.check(seed)), 0, 0
        self._pool: ThreadPoolExecutor | None = None

    def __call__(self, images: torch.Tensor | Sequence[torch.Tensor], out: torch.Tensor | None = None, *,
                 step: int | None = None) -> torch.Tensor:
        """The augmented batch. ``images``: uint8 or float (in [0, 1]) batch, clips, or a list of
        (C, H, W) / (H, W, C) images of any sizes (then a crop or resize op sets one output size).

        ``out``: a tensor to write the result into (of the output's shape, dtype and device),
        typically the previous call's result once the training step is done with it. On the CPU
        a fresh 154 MB output (256 x 3 x 224 x 224 float32) is mapped in page by page, which cost
        here about as much as augmenting into it (see BENCHMARKS.md).

        ``step``: which draw of the seeded parameter stream this batch gets (default: the next,
        counting calls). A caller that numbers its batches (stoker.Loader: epoch, batch, rank)
        passes that number, so the parameters of a batch never depend on the calls before it."""
        chw, clips, frames = self._images(images)
        sizes = (np.array([i.shape[-2] for i in chw[::frames]]), np.array([i.shape[-1] for i in chw[::frames]]))
        draws = self.draw(sizes, step)
        maps, params, size = draws.maps, draws.params, draws.size
        if frames > 1:  # one parameter set per clip, for each of its frames
            maps = None if maps is None else np.repeat(maps, frames, axis=0)
            params = [{k: np.repeat(v, frames) for k, v in p.items()} for p in params]
        shape = (clips, frames, chw[0].shape[0], *size) if frames > 1 else (len(chw), chw[0].shape[0], *size)
        if out is not None and (tuple(out.shape) != shape or out.dtype != self.dtype or out.device != self._out_device):
            raise ValueError(f"out must be a {self.dtype} tensor of shape {shape} on {self._out_device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        flat_out = None if out is None else out.reshape(-1, *out.shape[-3:])
        if flat_out is not None and out is not None and flat_out.data_ptr() != out.data_ptr():
            raise ValueError("out must be one block of memory (contiguous or channels_last)")
        if self.backend == "opencv":
            result = self._opencv(chw, maps, size, params, flat_out)
        else:
            result = self._torch(chw, maps, size, params)
            if flat_out is not None:
                result = flat_out.copy_(result)
        if out is not None:
            return out
        return result.view(clips, frames, *result.shape[1:]) if frames > 1 else result

    def draw(self, sizes: Sizes, step: int | None = None) -> Draws:
        """The parameters of a batch of images of ``sizes`` (heights, widths), for :meth:`apply_image`
        (``step``: as in :meth:`__call__`). One call per batch: a loader's threads then augment each
        their own images with them, in any order, and get what ``__call__`` gives."""
        if step is None:
            step, self._calls = self._calls, self._calls + 1
        rng = np.random.default_rng(None if self.seed is None else [self.seed, self.epoch, step])
        maps, out_sizes = self._maps(rng, sizes)
        if len(set(out_sizes[0].tolist())) > 1 or len(set(out_sizes[1].tolist())) > 1:
            raise ValueError("images of different sizes need a RandomResizedCrop, CenterCrop or Resize op "
                             "to give them one output size")
        params = [op.draw(rng, len(sizes[0])) for op in self.photometric]
        return Draws(maps, (int(out_sizes[0][0]), int(out_sizes[1][0])), params)

    def apply_image(self, image: np.ndarray, i: int, draws: Draws, out: np.ndarray) -> None:
        """Augment ``image`` ((H, W, C) uint8 or float in [0, 1]) as sample ``i`` of ``draws`` into
        ``out`` ((height, width, C) float32), on the calling thread, as the ``opencv`` backend does."""
        augment_image(image, None if draws.maps is None else draws.maps[i], draws.size, self.resampling,
                      self.photometric, [{name: float(values[i]) for name, values in p.items()} for p in draws.params],
                      out)

    def __getstate__(self) -> dict:
        """Picklable (a loader's worker processes get a copy): the thread pool stays behind."""
        return self.__dict__ | {"_pool": None}

    def set_epoch(self, epoch: int) -> None:
        """Draw the parameters of ``epoch`` from its own stream, counting calls from 0 (kept where a
        loaded state is, when ``epoch`` is already the current one, as stoker's readers do)."""
        if epoch != self.epoch:
            self.epoch, self._calls = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """Seed, epoch and calls so far: what the next call's parameters are drawn from (a record
        of :mod:`stoker.state`, saying that an Augment wrote it)."""
        return record("Augment", seed=self.seed, epoch=self.epoch, calls=self._calls)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next call draws what it would have drawn then.
        Another part's state, or a value out of range, is refused (StateError); a state saved by the
        previous format (no record tag) is taken, checked the same way."""
        saved = read_state(state, "Augment", ("seed", "epoch", "calls"), version_1=True)
        seed = None if saved["seed"] is None else checked("Augment", "seed", saved["seed"], SEED)
        epoch = checked("Augment", "epoch", saved["epoch"], EPOCH)
        self.seed, self.epoch, self._calls = seed, epoch, checked("Augment", "calls", saved["calls"], COUNT)

    def _images(self, images: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor | list[torch.Tensor], int, int]:
        """The input as (C, H, W) images (a (n, C, H, W) view of a batch, or a list), the number of
        samples (clips) and of frames per sample."""
        if not isinstance(images, torch.Tensor):
            if not images:
                raise ValueError("no images")
            return [i.permute(2, 0, 1) if self._channels_last_input(i.unsqueeze(0)) else i for i in images], len(images), 1
        if images.dim() not in (4, 5):
            raise ValueError("expected a batch (B, C, H, W) / (B, H, W, C) or clips (B, T, ...), "
                             f"got shape {tuple(images.shape)}")
        flat = images.reshape(-1, *images.shape[-3:])
        chw = flat.permute(0, 3, 1, 2) if self._channels_last_input(flat) else flat
        return chw, images.shape[0], images.shape[1] if images.dim() == 5 else 1

    def _opencv(self, chw: torch.Tensor | list[torch.Tensor], maps: np.ndarray | None, size: tuple[int, int],
                params: list[dict[str, np.ndarray]], into: torch.Tensor | None) -> torch.Tensor:
        """The CPU backend: every image on its own, written into the output's memory."""
        if into is not None and into.dtype == torch.float32:
            out = into
        else:
            out = self._empty(len(chw), chw[0].shape[0], size, torch.float32)
        nhwc = out.permute(0, 2, 3, 1)  # channels_last memory seen as (n, H, W, C)
        direct = nhwc.is_contiguous()
        target = nhwc.numpy() if direct else np.empty(nhwc.shape, np.float32)
        images = [i.permute(1, 2, 0).numpy() for i in chw]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stoker-augment")
        augment_images(images, maps, size, self.resampling, self.photometric, params, target, self._pool, self.threads)
        if not direct:
            nhwc.copy_(torch.from_numpy(target))
        if into is not None and into is not out:
            return into.copy_(out)
        return out.to(self.dtype)

    def _torch(self, chw: torch.Tensor | list[torch.Tensor], maps: np.ndarray | None, size: tuple[int, int],
               params: list[dict[str, np.ndarray]]) -> torch.Tensor:
        """The torch backend: the whole batch at once, or a list image by image."""
        if isinstance(chw, torch.Tensor):
            result = self._torch_part(chw, maps, size, params)
        else:
            result = torch.cat([self._torch_part(image.unsqueeze(0), None if maps is None else maps[j : j + 1], size,
                                                 [{k: v[j : j + 1] for k, v in p.items()} for p in params])
                                for j, image in enumerate(chw)])
        memory = torch.channels_last if self.channels_last else torch.contiguous_format
        return result.contiguous(memory_format=memory)

    def _torch_part(self, part: torch.Tensor, maps: np.ndarray | None, size: tuple[int, int],
                    params: list[dict[str, np.ndarray]]) -> torch.Tensor:
        part = part.to(self.device, non_blocking=True)
        # Resampled in float32 whatever self.dtype is: grid_sample takes its grid in the images'
        # dtype, and a float16 grid places samples only to ~1/8 pixel at 224 px, 1/2 pixel at
        # 1,000 px. Measured on an H200 (torch 2.11, crop + rotate + jitter + normalize, 300x400
        # sources): float16 sampling was off float32 by a mean ~1 gray level, up to 0.35 of the
        # range at edges. On the CPU, float16 grid_sample is wrong outright (see the docstring).
        x = part.to(torch.float32)
        if part.dtype == torch.uint8:
            x = x.mul_(1 / 255)
        x = x.contiguous()
        if maps is not None:
            x = sample(x, torch.from_numpy(maps).to(self.device, torch.float32), size, self.resampling)
        x = x.to(self.dtype)
        for op, p in zip(self.photometric, params, strict=True):
            x = op.apply(x, {k: torch.from_numpy(v).to(self.device, self.dtype) for k, v in p.items()})
        return x

    def _channels_last_input(self, flat: torch.Tensor) -> bool:
        if self.layout != "auto":
            return self.layout == "NHWC"
        return flat.shape[-1] in (1, 3) and flat.shape[-3] not in (1, 3)

    def _maps(self, rng: np.random.Generator, sizes: Sizes) -> tuple[np.ndarray | None, Sizes]:
        """The product of the geometric ops' maps (output pixels to source pixels) and the output sizes."""
        total = None
        for op in self.geometric:
            m, sizes = op.draw(rng, sizes)
            total = m if total is None else total @ m
        return total, sizes

    @property
    def _out_device(self) -> torch.device:
        return self.device if self.backend == "torch" else torch.device("cpu")

    def _empty(self, n: int, channels: int, size: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        memory = torch.channels_last if self.channels_last else torch.contiguous_format
        return torch.empty((n, channels, *size), dtype=dtype, device=self._out_device, memory_format=memory)

    def __repr__(self) -> str:
        ops = ", ".join(repr(op) for op in [*self.geometric, *self.photometric])
        return f"Augment({ops}, device={self.device}, dtype={self.dtype}, backend={self.backend})"
