"""What the doctor examines: a bounded random sample of a data set's items and how to read them.

A loose folder of millions of files is never listed whole: class folders are listed, then files
from randomly chosen class folders until the sample is full or the listing budget is spent, and
the total is estimated from the folders seen. A path list or a packed data set is read whole
(one sequential file each). Nothing is ever written into the data set's folder.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.format import MANIFEST_NAME
from stoker.pack.sources import IMAGE_EXTENSIONS, read_path_list

TargetKind = Literal["folder", "list", "packed", "dataset"]


@dataclass
class Target:
    """A sample of ``num_samples`` items (``estimated`` when counted from part of a listing).

    Loose data (``folder``, ``list``): ``paths`` are the sampled files in random order. Packed
    data: ``indices`` are the sampled global sample numbers and ``shard_files`` the shards. A
    user's map-style ``dataset`` has neither: only its ``__getitem__`` can be timed.
    """

    kind: TargetKind
    description: str
    num_samples: int
    estimated: bool = False
    paths: list[str] = field(default_factory=list)
    indices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    shard_files: list[str] = field(default_factory=list)
    dataset: Any = None

    @property
    def loose(self) -> bool:
        """Items are one file each."""
        return self.kind in ("folder", "list")

    @property
    def sample_size(self) -> int:
        return len(self.paths) if self.loose else len(self.indices)

    def subset(self, positions: list[int]) -> Target:
        """The same target with only the sampled items at ``positions`` (e.g. those that decode)."""
        return replace(self, paths=[self.paths[k] for k in positions] if self.loose else [],
                       indices=self.indices[positions] if not self.loose else self.indices)

    def name(self, i: int) -> str:
        """What to call sampled item ``i`` in a report: its path, or its data set key."""
        if self.loose:
            return self.paths[i]
        if self.kind == "packed":
            return self.dataset.key(int(self.indices[i]))
        return f"item {int(self.indices[i])}"

    def reader(self) -> Callable[[int], bytes]:
        """``read(i)``: the stored bytes of sampled item ``i`` (a whole file, or a shard member)."""
        if self.loose:
            def read_file(i: int) -> bytes:
                with open(self.paths[i], "rb", buffering=0) as f:
                    return f.read()
            return read_file
        if self.kind == "packed":
            return lambda i: bytes(self.dataset.read_image(int(self.indices[i]))[0])
        raise TypeError("a user's dataset has no stored bytes to read")


def open_target(source: str | os.PathLike | torch.utils.data.Dataset, sample: int, seed: int = 0,
                list_seconds: float = 5.0) -> Target:
    """Sample up to ``sample`` items of ``source``: a folder (ImageFolder or flat), a path list
    (``.csv``/``.tsv``/``.txt``), a packed stoker data set, or a map-style Dataset object."""
    rng = np.random.default_rng(seed)
    if isinstance(source, ShardDataset):  # stoker's own: its files and stages are known
        source = source.root
    if isinstance(source, torch.utils.data.Dataset):
        return _dataset_target(source, sample, rng)
    path = Path(source)
    if (path / MANIFEST_NAME).is_file():
        dataset = ShardDataset(path, decode="raw")
        shard_files = [str(path / entry.name) for entry in dataset.shards.manifest.shards]
        target = _dataset_target(dataset, sample, rng)
        target.kind, target.description, target.shard_files = "packed", str(path), shard_files
        return target
    if path.is_dir():
        paths, total, estimated = _sample_folder(path, sample, rng, list_seconds)
        return Target("folder", str(path), total, estimated, paths=paths)
    if path.is_file():
        listed = read_path_list(path)
        chosen = rng.choice(len(listed), size=min(sample, len(listed)), replace=False)
        return Target("list", str(path), len(listed), paths=[listed.paths[i] for i in chosen])
    raise FileNotFoundError(f"{path}: no such folder, path list or packed data set")


def _dataset_target(dataset: Any, sample: int, rng: np.random.Generator) -> Target:
    n = len(dataset)
    indices = np.sort(rng.choice(n, size=min(sample, n), replace=False)).astype(np.int64)
    rng.shuffle(indices)
    return Target("dataset", type(dataset).__name__, n, indices=indices, dataset=dataset)


def _sample_folder(root: Path, sample: int, rng: np.random.Generator, budget: float) -> tuple[list[str], int, bool]:
    """Up to ``sample`` image files below ``root`` at random, the total count, and whether it is estimated."""
    folders = sorted(entry.path for entry in os.scandir(root) if entry.is_dir())
    if not folders:
        files = _images_below(str(root))
        if not files:
            raise FileNotFoundError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)})")
        chosen = rng.choice(len(files), size=min(sample, len(files)), replace=False)
        return [files[i] for i in chosen], len(files), False
    deadline = time.monotonic() + budget
    found: list[str] = []
    listed = 0
    for folder in rng.permutation(folders):  # random folders until all are listed or the budget is spent
        found.extend(_images_below(str(folder)))
        listed += 1
        if time.monotonic() > deadline:
            break
    if not found:
        raise FileNotFoundError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in {listed} folders listed")
    chosen = rng.choice(len(found), size=min(sample, len(found)), replace=False)
    total = round(len(found) / listed * len(folders))
    return [found[i] for i in chosen], total, listed < len(folders)


def _images_below(folder: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(folder, followlinks=True)
                  for f in names if f.lower().endswith(IMAGE_EXTENSIONS))
