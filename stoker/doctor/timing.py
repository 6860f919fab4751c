"""Timing a loader: samples/s and bytes/s over one pass, with the time to the first batch."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """One timed pass over a loader."""

    samples: int
    nbytes: int
    seconds: float
    first_batch_seconds: float

    @property
    def per_second(self) -> float:
        """Samples per second."""
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_second(self) -> float:
        """Megabytes (10^6) of items per second."""
        return self.nbytes / self.seconds / 1e6 if self.seconds else 0.0


def time_loader(loader: Iterable, max_samples: int | None = None) -> Rate:
    """Iterate ``(images, labels)`` batches until exhausted or ``max_samples``; count samples and bytes.

    Bytes are counted for raw items (``bytes``) and tensors/arrays (``nbytes``), so the same
    call reports MB/s for I/O-only passes and img/s for decoded ones.
    """
    samples = nbytes = 0
    first = None
    start = time.perf_counter()
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += len(labels)
        nbytes += _size(images)
        if max_samples is not None and samples >= max_samples:
            break
    seconds = time.perf_counter() - start
    return Rate(samples, nbytes, seconds, first if first is not None else seconds)


def _size(images) -> int:
    if isinstance(images, (bytes, bytearray)):
        return len(images)
    if isinstance(images, (list, tuple)):
        return sum(_size(x) for x in images)
    return int(getattr(images, "nbytes", 0))
