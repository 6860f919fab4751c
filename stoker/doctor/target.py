"""What the doctor examines: a bounded random sample of a data set's items and how to read them.

A loose folder of millions of files is not listed whole: its top-level folders are listed in
random order until the listing budget is spent, and the total is estimated from those listed. A
path list or a packed data set's index is read whole (each one sequential file). Nothing is ever
written into the data set's folder.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import fsspec
import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.errors import StokerError
from stoker.format import MANIFEST_NAME
from stoker.sources import IMAGE_EXTENSIONS, read_path_list
from stoker.sources.inputs import file_kind
from stoker.storage.remote import is_url

LIST_SUFFIXES = (".csv", ".tsv", ".txt")

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
    left_out: list[str] = field(default_factory=list)  # sampled paths that are not regular files, and why
    storage_options: dict[str, Any] | None = None  # fsspec's, for data at a URL
    sizes: list[int] = field(default_factory=list)  # loose files at a URL: each one's bytes, as listed

    @property
    def remote(self) -> bool:
        """The data lies at an fsspec URL (an object store), not in a local folder."""
        return is_url(self.description)

    @property
    def loose(self) -> bool:
        """Items are one file each."""
        return self.kind in ("folder", "list")

    @property
    def sample_size(self) -> int:
        """Items in the sample."""
        return len(self.paths) if self.loose else len(self.indices)

    def subset(self, positions: list[int]) -> Target:
        """The same target with only the sampled items at ``positions`` (e.g. those that decode)."""
        return replace(self, paths=[self.paths[k] for k in positions] if self.loose else [],
                       sizes=[self.sizes[k] for k in positions] if self.sizes else [],
                       indices=self.indices[positions] if not self.loose else self.indices)

    def item_bytes(self) -> float:
        """The mean stored bytes of an item: the shards' bytes per sample, or the sampled files' mean size."""
        if self.kind == "packed":
            return sum(entry.bytes for entry in self.dataset.shards.manifest.shards) / max(1, self.num_samples)
        return float(np.mean(self.sizes)) if self.sizes else 0.0

    def files_read(self) -> list[str]:
        """The files the random-read probes touch: the sampled files, or the shards holding the sampled samples."""
        if self.loose:
            return list(self.paths)
        if self.kind == "packed":
            shards = sorted({self.dataset.shards.locate(int(i))[0] for i in self.indices})
            return [self.shard_files[s] for s in shards]
        return []

    def name(self, i: int) -> str:
        """What to call sampled item ``i`` in a report: its path, or its data set key."""
        if self.loose:
            return self.paths[i]
        if self.kind == "packed":
            return self.dataset.key(int(self.indices[i]))
        return f"item {int(self.indices[i])}"

    def reader(self) -> Callable[[int], bytes]:
        """``read(i)``: the stored bytes of sampled item ``i`` (a whole file, or a shard member)."""
        if self.loose and self.remote:
            fs, _ = fsspec.core.url_to_fs(self.description, **(self.storage_options or {}))
            return lambda i: fs.cat_file(fs._strip_protocol(self.paths[i]))  # noqa: SLF001 -- fsspec's own rule
        if self.loose:
            def read_file(i: int) -> bytes:
                with open(self.paths[i], "rb", buffering=0) as f:
                    return f.read()
            return read_file
        if self.kind == "packed":
            return lambda i: bytes(self.dataset.read_image(int(self.indices[i]))[0])
        raise TypeError("a user's dataset has no stored bytes to read")


def open_target(source: str | os.PathLike | torch.utils.data.Dataset, sample: int, seed: int = 0,
                list_seconds: float = 5.0, storage_options: dict[str, Any] | None = None) -> Target:
    """Sample up to ``sample`` items of ``source``: a folder (ImageFolder or flat), a path list
    (``.csv``/``.tsv``/``.txt``), a packed stoker data set, or a map-style Dataset object; or at
    an fsspec URL (``storage_options`` go to fsspec), a packed data set or a folder of images. A
    folder is listed for at most about ``list_seconds``."""
    rng = np.random.default_rng(seed)
    if isinstance(source, ShardDataset):  # stoker's own: its files are known
        storage_options = source.shards.settings.storage_options
        source = source.shards.source
    if isinstance(source, str) and is_url(source):
        return _remote_target(source.rstrip("/"), sample, rng, list_seconds, storage_options)
    if isinstance(source, torch.utils.data.Dataset):
        if isinstance(source, torch.utils.data.IterableDataset) or not isinstance(source, Sized):
            raise StokerError(f"{type(source).__name__}: the doctor samples a map-style Dataset (one with __len__ and "
                              "__getitem__) by index; an IterableDataset or a Dataset without a length cannot be sampled")
        if len(source) == 0:
            raise StokerError(f"{type(source).__name__}: the data set is empty")
        return _dataset_target(source, sample, rng)
    path = Path(source)
    if (path / MANIFEST_NAME).is_file():
        dataset = ShardDataset(path, decode="raw")
        if len(dataset) == 0:
            raise StokerError(f"{path}: the packed data set is empty")
        target = _dataset_target(dataset, sample, rng)
        target.kind, target.description = "packed", str(path)
        target.shard_files = [str(path / entry.name) for entry in dataset.shards.manifest.shards]
        return target
    if path.is_dir():
        paths, total, estimated = _sample_folder(path, sample, rng, list_seconds)
        kept, left_out = _regular_files(paths)
        return Target("folder", str(path), total, estimated, paths=kept, left_out=left_out)
    if path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
        listed = read_path_list(path)
        if not len(listed):
            raise StokerError(f"{path}: the path list is empty")
        chosen = rng.choice(len(listed), size=min(sample, len(listed)), replace=False)
        kept, left_out = _regular_files([listed.refs[i] for i in chosen])
        return Target("list", str(path), len(listed), paths=kept, left_out=left_out)
    if path.is_file():
        raise StokerError(f"{path}: not a folder, a path list ({', '.join(LIST_SUFFIXES)}) or a packed data set")
    raise StokerError(f"{path}: no such folder, path list or packed data set")


def _remote_target(url: str, sample: int, rng: np.random.Generator, list_seconds: float,
                   storage_options: dict[str, Any] | None) -> Target:
    """A packed data set at ``url`` (its manifest and indexes fetched as any reader fetches them),
    or the image files below it, listed for at most about ``list_seconds``."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    try:
        packed = fs.isfile(f"{root}/{MANIFEST_NAME}")
    except OSError as e:
        raise StokerError(f"{url}: cannot read it ({e})") from None
    if packed:
        dataset = ShardDataset(url, decode="raw", storage_options=storage_options)
        if len(dataset) == 0:
            raise StokerError(f"{url}: the packed data set is empty")
        target = _dataset_target(dataset, sample, rng)
        target.kind, target.description, target.storage_options = "packed", url, storage_options
        target.shard_files = [f"{url}/{entry.name}" for entry in dataset.shards.manifest.shards]
        return target
    deadline = time.monotonic() + list_seconds
    found: list[tuple[str, int]] = []
    cut = False
    try:
        for directory, _, files in fs.walk(root, detail=True):
            found.extend((f"{directory}/{name}", int(info.get("size") or 0)) for name, info in files.items()
                         if name.lower().endswith(IMAGE_EXTENSIONS))
            if cut := time.monotonic() > deadline:
                break
    except OSError as e:
        raise StokerError(f"{url}: cannot list it ({e})") from None
    if not found:
        raise StokerError(f"{url}: no packed data set ({MANIFEST_NAME}) and no image files "
                          f"({', '.join(IMAGE_EXTENSIONS)}) found" + (" before the listing budget ran out" if cut else ""))
    chosen = rng.choice(len(found), size=min(sample, len(found)), replace=False)
    protocol = url.split("://", 1)[0]
    return Target("folder", url, len(found), cut, paths=[f"{protocol}://{found[i][0]}" for i in chosen],
                  sizes=[found[i][1] for i in chosen], storage_options=storage_options)


def _regular_files(paths: list[str]) -> tuple[list[str], list[str]]:
    """The sampled ``paths`` that are regular files, and the others named with what they are: a
    FIFO, socket or device (or a link to one) is left out after a stat, never opened, since every
    probe reads, evicts or copies what it samples, and reading a FIFO waits forever."""
    kept, left_out = [], []
    for p in paths:
        try:
            regular = stat.S_ISREG(os.stat(p).st_mode)
        except OSError:
            regular = True  # missing or unreadable: the read probes report it
        if regular:
            kept.append(p)
        else:
            left_out.append(f"{p}: left out of the sample, not a regular file: {file_kind(p)}")
    return kept, left_out


def _dataset_target(dataset: Any, sample: int, rng: np.random.Generator) -> Target:
    n = len(dataset)
    indices = rng.choice(n, size=min(sample, n), replace=False).astype(np.int64)
    return Target("dataset", type(dataset).__name__, n, indices=indices, dataset=dataset)


def _sample_folder(root: Path, sample: int, rng: np.random.Generator, budget: float) -> tuple[list[str], int, bool]:
    """Up to ``sample`` image files below ``root`` at random, the total count, and whether that
    total is estimated: top-level folders are listed in random order until all are listed or the
    budget is spent; the total is then extrapolated from the folders listed completely (or, when
    not even one was, is the count found so far: a lower bound)."""
    deadline = time.monotonic() + budget
    folders = [entry.path for entry in os.scandir(root) if entry.is_dir()]
    found = [] if folders else _images_below(str(root), deadline)[0]  # ImageFolder ignores files beside class folders
    complete, cut = 0, False
    for folder in rng.permutation(folders) if folders else []:
        files, cut = _images_below(str(folder), deadline)
        found.extend(files)
        if cut:
            break
        complete += 1
    if not found:
        raise StokerError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) found"
                          + (" before the listing budget ran out" if cut else ""))
    chosen = rng.choice(len(found), size=min(sample, len(found)), replace=False)
    if not folders or (complete == len(folders)):
        return [found[i] for i in chosen], len(found), False
    total = round(len(found) / complete * len(folders)) if complete else len(found)
    return [found[i] for i in chosen], max(total, len(found)), True


def _images_below(folder: str, deadline: float) -> tuple[list[str], bool]:
    """Image files anywhere below ``folder``, and whether the deadline cut the walk short."""
    found: list[str] = []
    for directory, _, names in os.walk(folder, followlinks=True):
        found.extend(os.path.join(directory, n) for n in names if n.lower().endswith(IMAGE_EXTENSIONS))
        if time.monotonic() > deadline:
            return found, True
    return found, False

