"""The standard torchvision pipelines the benchmarks time, as a training script holds them (needs
torchvision: run those benchmarks with a Python that has it, e.g. .venv-tv/bin/python)."""

from __future__ import annotations

import torchvision.transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def pipeline(name: str, size: int) -> T.Compose:
    """``train``: RandomResizedCrop, flip, ColorJitter 0.4/0.4/0.4, ToTensor, Normalize; ``val``:
    Resize(size * 8/7), CenterCrop, ToTensor, Normalize."""
    if name == "train":
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                          T.Normalize(MEAN, STD)])
    return T.Compose([T.Resize(round(size * 8 / 7)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
