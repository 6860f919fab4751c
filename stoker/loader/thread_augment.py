"""The batched ops of a translated torchvision pipeline in the loader threads: each crop augmented
by the thread that decoded it, right after, with parameters drawn once per batch. OpenCvAugment
runs stoker.augment's opencv backend image by image (numpy and OpenCV calls, the GIL held between
them); NativeAugment the same ops and draws in one call per chunk of crops without the GIL (the
_photometric extension: the plan picks it where photometric.supports says it computes them all).
Both write float32, or uint8 rounded back where the pipeline is still at uint8 (``dtype``), and are
values (ops, seed, dtype): the engines of two passes compare equal, so worker processes are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from stoker.augment.native import NativeOps, augment_chunk, encode
from stoker.augment.pipeline import Augment, Draws
from stoker.decode.scratch import thread_buffer
from stoker.loader.batches import Batch


@dataclass(frozen=True)
class OpenCvAugment:
    """``ops`` (stoker.augment's), parameters drawn from ``seed``, each crop by :meth:`Augment.apply_image`."""

    ops: tuple
    seed: int
    dtype: torch.dtype = torch.float32

    @cached_property
    def augment(self) -> Augment:
        """The ops as an Augment (made once per copy: each worker process makes its own)."""
        return Augment(*self.ops, seed=self.seed, device="cpu", backend="opencv", threads=1)

    def draw(self, n: int, height: int, width: int, step: int) -> Draws:
        """The parameters of a batch of ``n`` crops of ``height`` x ``width``."""
        return self.augment.draw((np.full(n, height), np.full(n, width)), step=step)

    def apply(self, batch: Batch, positions: np.ndarray, crops: np.ndarray, out: np.ndarray) -> None:
        """Augment ``crops[k]`` into ``out[positions[k]]``, image by image."""
        for k, j in enumerate(map(int, positions)):
            if out.dtype == np.float32:
                self.augment.apply_image(crops[k], j, batch.augmentation, out[j])
                continue
            size = out[j].size
            result = np.frombuffer(thread_buffer("augmented", size * 4), np.float32, size).reshape(out[j].shape)
            self.augment.apply_image(crops[k], j, batch.augmentation, result)
            np.multiply(result, 255, out=result)
            np.rint(result, out=result)
            out[j] = result


@dataclass(frozen=True)
class NativeAugment:
    """What ``per_image`` computes, drawn the same way, in one call per chunk of crops."""

    per_image: OpenCvAugment

    @property
    def dtype(self) -> torch.dtype:
        return self.per_image.dtype

    def draw(self, n: int, height: int, width: int, step: int) -> NativeOps:
        """``per_image``'s parameters for the batch, encoded as the extension's op codes."""
        return encode(self.per_image.augment, self.per_image.draw(n, height, width, step), n)

    def apply(self, batch: Batch, positions: np.ndarray, crops: np.ndarray, out: np.ndarray) -> None:
        """Augment ``crops`` into ``out[positions]`` in one call without the GIL."""
        augment_chunk(crops, out, batch.augmentation, positions)
