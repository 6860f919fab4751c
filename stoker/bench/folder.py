"""FolderDataset: loose image files with ShardDataset's item contract, the baseline stoker is measured against."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.utils.data

from stoker.data.decode import DECODE_MODES, DecodeMode, decode_image
from stoker.errors import StokerError
from stoker.sources import BadInput, open_source
from stoker.sources.inputs import read_regular_file


class FolderDataset(torch.utils.data.Dataset):
    """``(image, label)`` items read from an ImageFolder tree or a path list, one file per sample.

    Lists files exactly as ``stoker pack`` does (and as torchvision's ImageFolder does), so a
    measurement of loose files and of their packed shards covers the same samples.
    """

    def __init__(self, path: str | os.PathLike, decode: DecodeMode = "pil",
                 transform: Callable[[Any], Any] | None = None) -> None:
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        source = open_source(path)
        self.paths = source.refs
        self.targets = source.labels
        self.classes = list(source.classes or [])
        self.decode = decode
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        try:
            data = read_regular_file(self.paths[index])  # a FIFO named like an image would block forever
        except BadInput as e:
            raise StokerError(f"{self.paths[index]}: {e.reason}") from None
        image = decode_image(data, self.decode)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])
