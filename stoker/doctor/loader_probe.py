"""Loader probes: end-to-end images/s of a torch DataLoader at each worker count over the doctor's
sample with a warm page cache (storage is measured apart, so these rows show what the CPU side
of each loader delivers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.utils.data
from torch.utils.data import default_collate

from stoker.data.dataset import ShardDataset
from stoker.data.decode import DecodeMode, decode_image
from stoker.doctor.contention import CpuShare, CpuWatch
from stoker.doctor.numbers import rounded
from stoker.doctor.target import Target


@dataclass
class LoaderRow:
    """One loader configuration, what it delivered after its first batch, and the CPU other
    processes took meanwhile (``cpu``: None where not watched)."""

    name: str
    workers: int
    images_per_s: float
    first_batch_s: float
    cpu: CpuShare | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "workers": self.workers, "images_per_s": round(self.images_per_s, 1),
                "first_batch_s": round(self.first_batch_s, 3),
                "other_cores": None if self.cpu is None else rounded(self.cpu.other_cores, 3)}


class SampledFiles(torch.utils.data.Dataset):
    """The sampled loose files as torchvision's ImageFolder reads them: open, Pillow, RGB, transform."""

    def __init__(self, paths: list[str], transform: Callable | None) -> None:
        self.paths = np.array(paths)  # one numpy array, not a list of str: no copy-on-write growth in workers
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        with open(str(self.paths[i]), "rb") as f:
            image = decode_image(f.read(), "pil")
        return (self.transform(image) if self.transform is not None else image), 0


def collate_or_list(batch: list) -> Any:
    """torch's default collation, or ``(items, labels)`` lists when it cannot stack the items
    (shapes that differ, PIL images), so the doctor can time any transform a user gives it."""
    try:
        return default_collate(batch)
    except (RuntimeError, TypeError):  # tensors of different shapes; PIL images
        return [item for item, _ in batch], [label for _, label in batch]


def worker_counts(most: int) -> list[int]:
    """The worker counts tried: 0, 1, 2, 4, ... up to ``most``, and ``most`` itself."""
    counts, n = [0], 1
    while n < most:
        counts.append(n)
        n *= 2
    return counts + ([most] if most > 0 else [])


def sampled_dataset(target: Target, transform: Callable | None,
                    decode: DecodeMode = "pil") -> SampledFiles | torch.utils.data.Subset:
    """The sampled items as a map-style Dataset, read as the user's DataLoader reads them."""
    if target.loose:
        return SampledFiles(target.paths, transform)
    if target.kind == "packed":
        return torch.utils.data.Subset(ShardDataset(target.description, decode=decode, transform=transform),
                                       target.indices.tolist())
    return torch.utils.data.Subset(target.dataset, target.indices.tolist())


def probe_loaders(target: Target, transform: Callable | None, batch_size: int, workers: list[int], seconds: float,
                  decode: DecodeMode = "pil") -> list[LoaderRow]:
    """A DataLoader row per worker count; ``seconds`` is shared out among the rows. ``decode``
    is the mode a packed data set's items are decoded in before ``transform`` (a ShardDataset's
    own). stoker.Loader's rows come from the sample pack (stoker/doctor/pack_probe.py)."""
    dataset = sampled_dataset(target, transform, decode)
    each = seconds / len(workers)
    rows = []
    for count in workers:
        # One long epoch drawn with replacement: a small sample passed epoch by epoch would drain the
        # workers' pipeline at every epoch end and understate the DataLoader.
        sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=batch_size * 10_000)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=count, sampler=sampler,
                                             collate_fn=collate_or_list)
        rows.append(_timed(f"DataLoader, {count} workers", count, loader, 1 << 30, each))
    return rows


def _timed(name: str, workers: int, loader: Iterable, limit: int, seconds: float) -> LoaderRow:
    """Images/s after the first batch (worker start-up is reported apart, as the first batch's
    time), over at least ``seconds`` and at least four batches per worker (workers deliver in
    bursts, so fewer would make the rate depend on where a burst is cut), at most ``4 * seconds``
    or ``limit`` images; passes repeat while the budget lasts. The CPU other processes took
    meanwhile is watched (the loader's rate depends on what it was left)."""
    watch = CpuWatch().start()
    start = time.perf_counter()
    first_at, first_count, images, batches = None, 0, 0, 0
    wanted = 4 * max(1, workers)

    def enough(spent: float) -> bool:
        return images >= limit or spent > 4 * seconds or (spent > seconds and batches >= wanted)

    while first_at is None or not enough(time.perf_counter() - first_at):
        passed = images
        for batch in loader:
            images += len(batch[1])
            now = time.perf_counter()
            if first_at is None:
                first_at, first_count = now, images
                continue
            batches += 1
            if enough(now - first_at):
                break
        if images == passed:
            raise RuntimeError(f"{name}: the loader yielded no batch")
    end = time.perf_counter()
    steady = images - first_count
    rate = steady / (end - first_at) if steady and end > first_at else images / (end - start)
    return LoaderRow(name, workers, rate, first_at - start, watch.stop())
