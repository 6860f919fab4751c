"""Timing a loader: samples/s and bytes/s over one pass, or over passes read as one long epoch
with a training loop's step time; with the time to the first batch."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

import torch

_END = object()


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


def time_passes(loader: Iterable, seconds: float, *, step_time: float | None = None, min_batches: int = 8,
                before_pass: Callable[[], object] | None = None) -> Rate:
    """Images/s of ``loader`` read pass after pass as one long epoch, the training loop taking
    ``step_time`` per batch (a sleep: the GPU's step, leaving the cores to the loader), for about
    ``seconds`` and at least ``min_batches`` batches after the first (at most ``4 * seconds``).

    A small sample passed epoch by epoch would drain the loader's pipeline at every epoch end
    (a real epoch is thousands of batches), so a thread starts each pass as soon as the last one
    ends, while the loop still has queued batches. ``before_pass`` runs before each pass (e.g.
    to evict the files, so every pass reads cold). Batches on a GPU are waited for. Counted from
    the first batch; the time to it is ``first_batch_seconds``.
    """
    batches: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def feed() -> None:
        try:
            while not stop.is_set():
                if before_pass is not None:
                    before_pass()
                passed = iter(loader)
                try:
                    for batch in passed:
                        while not stop.is_set():
                            with contextlib.suppress(queue.Full):
                                batches.put(batch, timeout=0.05)
                                break
                        if stop.is_set():
                            break
                finally:
                    if isinstance(passed, Generator):  # stoker.Loader's threads stop now, not when collected
                        passed.close()
        except BaseException as e:  # handed to the loop, which raises it
            batches.put(e)
        batches.put(_END)

    feeder = threading.Thread(target=feed, name="stoker-doctor-passes", daemon=True)
    start = time.perf_counter()
    feeder.start()
    first_at = None
    samples = nbytes = counted = 0
    try:
        while True:
            batch = batches.get()
            if batch is _END:
                raise RuntimeError("the loader yielded no batch")
            if isinstance(batch, BaseException):
                raise batch
            images, labels = batch[0], batch[1]
            if getattr(images, "is_cuda", False):
                torch.cuda.synchronize(images.device)
            now = time.perf_counter()
            if first_at is None:
                first_at = now
            else:
                samples, nbytes, counted = samples + len(labels), nbytes + _size(images), counted + 1
            spent = now - first_at
            if spent > 4 * seconds or (spent >= seconds and counted >= min_batches):
                break
            if step_time:
                time.sleep(step_time)
    finally:
        stop.set()
        while feeder.is_alive():  # let the feeder leave a full queue
            with contextlib.suppress(queue.Empty):
                batches.get(timeout=0.05)
        feeder.join()
    return Rate(samples, nbytes, now - first_at, first_at - start)
