"""The transform the doctor times when it is given none: what most image classifiers train with
(RandomResizedCrop, horizontal flip, to a uint8 CHW tensor), in Pillow and torch alone so it
needs no torchvision. Each stage is a small picklable class, so DataLoader workers can run it
under ``spawn`` and the doctor can time it stage by stage through ``transforms``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from stoker.decode.crops import CROP_TRIES, CropSpec, crop_box


class RandomResizedCrop:
    """torchvision's RandomResizedCrop(size) on a PIL image: the same box rule, bilinear resize."""

    def __init__(self, size: int = 224, seed: int = 0) -> None:
        self.size = size
        self.spec = CropSpec(size=(size, size))
        self.rng = np.random.default_rng(seed)

    def __call__(self, image: Image.Image) -> Image.Image:
        top, left, height, width = crop_box(self.spec, image.height, image.width, self.rng.random((CROP_TRIES, 4)))
        return image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(left, top, left + width, top + height))

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size})"


class RandomHorizontalFlip:
    """Mirror half the images."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, image: Image.Image) -> Image.Image:
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if self.rng.random() < 0.5 else image

    def __repr__(self) -> str:
        return "RandomHorizontalFlip()"


class ToUint8Tensor:
    """A PIL RGB image as a (3, H, W) uint8 tensor (torchvision v2's PILToTensor)."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        # numpy transposes, not torch: in a main process with several intra-op threads, torch's
        # permute().contiguous() of one 224 px image took ~5.6 ms against ~0.1 ms here.
        return torch.from_numpy(np.ascontiguousarray(np.asarray(image.convert("RGB")).transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return "ToUint8Tensor()"


class StandardTransform:
    """RandomResizedCrop(size) + RandomHorizontalFlip + ToUint8Tensor, with ``transforms`` listing
    the stages as torchvision's Compose does."""

    def __init__(self, size: int = 224) -> None:
        self.transforms: list[Callable[[Any], Any]] = [RandomResizedCrop(size), RandomHorizontalFlip(), ToUint8Tensor()]

    def __call__(self, image: Image.Image) -> torch.Tensor:
        out: Any = image  # a PIL image through the crop and flip, a tensor after the last stage
        for stage in self.transforms:
            out = stage(out)
        return out

    def __repr__(self) -> str:
        return " + ".join(map(repr, self.transforms))
