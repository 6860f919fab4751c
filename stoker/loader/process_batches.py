"""A Loader's batches made in worker processes (``processes=N``), into a ring of shared buffers.

Fresh shared memory per batch cost a worker ~9,400 page faults per batch of 256 at 224 px while it
decoded into it, and the loop's process a map and an unmap (BENCHMARKS.md, "Threads, processes,
and the model"). So the loop's process makes ``prefetch`` + 2 batch buffers in shared memory once
(a :class:`BatchRing`, ``shared``), and tells the workers which one to fill with each batch:

    loop's process: a free slot of the ring (nothing holds its buffer) ─> one task per worker:
                    (epoch, batch, its samples, slot, part k of N)
    worker k:       the batch's draws, then every N-th sample from the k-th, into the slot
                    ─> its labels and the samples it skipped (small, pickled)
    loop's process: the N parts, in order ─> the slot's pixels are the batch

Measured here (bench/scaling.py, 224 px crops, batches of 256, 2 cores): a worker's CPU per image
went from ~710 us to ~570 (threads: ~555-570), the loop's process spends ~6 us per image, and 2
workers of 1 thread made 0.98x the images per second of 2 threads (0.79x before), A-B-A in one
session. Every worker makes a share of every batch, as threads do, so no worker waits at the end
of a pass while another makes the last batch. The ring has ``prefetch`` + 2 slots: the batches in
the workers' hands, the one arriving and the one the loop holds. A slot is free again once nothing holds its buffer (the ring's
rule: a batch the loop keeps stays valid); while its batch is being made, the pending batch holds
it. With none free, the batch goes to one worker, in fresh shared memory, as do batches with a
per-sample transform (their results are the transform's tensors, whatever their size; their
pixels go into a buffer the worker reuses).

The workers (a torch DataLoader's, ``persistent_workers``) live from one whole pass to the next,
while the Loader makes its batches the same way; a pass left early (a ``break``, an error) stops
them at once, and nothing of it is left in flight.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from stoker.errors import StokerError
from stoker.loader.batches import BatchMaker, Made, part_positions
from stoker.loader.buffers import BatchRing
from stoker.loader.meter import Meter
from stoker.loader.opencv_threads import one_opencv_thread_in_worker


@dataclass(frozen=True)
class Task:
    """What one worker makes: part ``part`` of ``parts`` of batch ``number`` of ``epoch`` (its
    samples: ``indices``), into the ring's buffer ``slot``, or (None) in memory it sends back."""

    epoch: int
    number: int
    indices: np.ndarray
    slot: int | None
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class Part:
    """What a worker sends back for a :class:`Task`: the labels of its samples, how many damaged
    ones it skipped, the batch's images when they are not in the ring, or the StokerError it met
    (raised again as itself in the loop's process: a DataLoader re-raises a worker's exception by
    calling its type with the message alone, which stoker's errors with fields do not take)."""

    labels: np.ndarray | None
    skipped: int = 0
    images: torch.Tensor | None = None
    error: StokerError | None = None
    busy_s: float = 0.0  # the worker's threads' wall seconds making it, summed
    cpu_s: float = 0.0  # the worker process's CPU seconds meanwhile


def _always() -> bool:
    return True


class _Work(Dataset):
    """The worker side: ``dataset[task]`` makes a :class:`Task` with ``threads`` threads."""

    def __init__(self, maker: BatchMaker, threads: int, rows: int, slots: list[torch.Tensor]) -> None:
        self.maker, self.threads, self.rows, self.slots = maker, threads, rows, slots
        self._own: BatchRing | None = None  # pixels that never leave the worker (made in it, not pickled)

    def __getitem__(self, task: Task) -> Part:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            part = self._make(task)
        except StokerError as e:
            return Part(None, error=e)
        return replace(part, busy_s=(time.perf_counter() - wall) * self.threads, cpu_s=time.process_time() - cpu)

    def _make(self, task: Task) -> Part:
        if task.slot is not None:
            batch = self.maker.make(task.epoch, task.number, task.indices, self.threads, self.slots[task.slot],
                                    task.part, task.parts)
            positions = part_positions(len(task.indices), task.part, task.parts)
            return Part(batch.labels.numpy()[positions], int(batch.replaced[positions].sum()))
        pixels = None
        if self.maker.transform is not None:  # the transform's results are sent: the pixels stay here
            if self._own is None:
                self._own = BatchRing((self.rows, *self.maker.buffer_shape()), 1)
            pixels = self._own.take()
        batch = self.maker.make(task.epoch, task.number, task.indices, self.threads, pixels)
        images, labels = self.maker.finish(batch)
        return Part(labels.numpy(), int(batch.replaced.sum()), images)


def _as_made(part: Any) -> Any:
    """The DataLoader's collate_fn: a worker's :class:`Part` as it is (the default would make its
    arrays tensors, each sent through shared memory of its own)."""
    return part


@dataclass(frozen=True)
class _Pending:
    """A batch handed to the workers: in how many parts, and the ring's buffer it is made in."""

    number: int
    size: int
    parts: int
    pixels: torch.Tensor | None


class _Tasks:
    """The DataLoader's sampler: the tasks of the current pass, each batch's slot chosen when the
    DataLoader asks for its first task (so the slot is free then, not when the pass started)."""

    def __init__(self, ring: BatchRing | None, processes: int) -> None:
        self.ring, self.processes = ring, processes
        self.epoch, self.batch_size = 0, 1
        self.share, self.numbers = np.zeros(0, np.int64), range(0)
        self.pending: deque[_Pending] = deque()
        self.keep_going: Callable[[], bool] = _always

    def __iter__(self) -> Iterator[Task]:
        for number in self.numbers:
            if not self.keep_going():  # the tuner changed how batches are made: the pass's next run makes the rest
                return
            indices = self.share[number * self.batch_size : (number + 1) * self.batch_size]
            slot = self.ring.free() if self.ring is not None else None
            parts = 1 if slot is None else min(self.processes, len(indices))
            pixels = None if slot is None or self.ring is None else self.ring.pixels(slot)
            self.pending.append(_Pending(number, len(indices), parts, pixels))
            for part in range(parts):
                yield Task(self.epoch, number, indices, slot, part, parts)


class WorkerProcesses:
    """``processes`` DataLoader worker processes making a Loader's batches with ``threads`` threads
    each, into a shared ring of ``prefetch`` + 2 batches (batches with a per-sample transform:
    in memory each worker sends, ``prefetch`` per worker). ``rows``: the samples a buffer holds
    (``batch_size``, or fewer where no batch can be larger: a data set smaller than a batch)."""

    def __init__(self, maker: BatchMaker, batch_size: int, rows: int, processes: int, threads: int, prefetch: int,
                 mp_context: str | None) -> None:
        self.settings = (maker, batch_size, rows, processes, threads, prefetch, mp_context)
        self.maker, self.batch_size = maker, batch_size
        in_ring = maker.transform is None
        self.ring = BatchRing((rows, *maker.buffer_shape()), prefetch + 2, shared=True) if in_ring else None
        # batches queued ahead of the one the loop takes
        self.queued = prefetch if in_ring else prefetch * processes
        self._tasks = _Tasks(self.ring, processes)
        work = _Work(maker, threads, rows, self.ring.shared_buffers if self.ring is not None else [])
        self._workers: DataLoader | None = DataLoader(
            work, batch_size=None, sampler=self._tasks, num_workers=processes, prefetch_factor=prefetch,
            persistent_workers=True, collate_fn=_as_made, multiprocessing_context=mp_context,
            worker_init_fn=one_opencv_thread_in_worker)
        self._parts: Iterator[Part] | None = None
        self.running = False  # a pass is taking batches from them

    @classmethod
    def for_pass(cls, kept: WorkerProcesses | None, maker: BatchMaker, batch_size: int, rows: int, processes: int,
                 threads: int, prefetch: int, mp_context: str | None) -> WorkerProcesses:
        """The workers for a pass: ``kept`` where they make batches as asked (a maker equal to theirs)
        and no other pass is taking batches from them; else new ones (``kept`` stopped, unless a pass
        runs on them: they stop when it ends and lets go of them)."""
        settings = (maker, batch_size, rows, processes, threads, prefetch, mp_context)
        if kept is not None and not kept.running:
            if kept._workers is not None and kept.settings == settings:
                return kept
            kept.close()
        return cls(*settings)

    def batches(self, epoch: int, share: np.ndarray, numbers: range, keep_going: Callable[[], bool],
                meter: Meter) -> Generator[Made, None, None]:
        """Batches ``numbers`` of ``epoch`` (whose samples are ``share``), in order, until
        ``keep_going()`` says no before one is handed out (then the ones handed out; the workers
        wait). Left early, the workers stop (:meth:`close`); at the pass's end they wait for the
        next. ``meter`` hears what each batch cost the workers."""
        assert self._workers is not None, "closed"
        tasks = self._tasks
        tasks.epoch, tasks.batch_size, tasks.share, tasks.numbers = epoch, self.batch_size, share, numbers
        tasks.keep_going = keep_going
        tasks.pending.clear()
        self.running, finished = True, False
        try:
            self._parts = iter(self._workers)
            for first in self._parts:
                pending = tasks.pending.popleft()
                parts = [first] + [next(self._parts) for _ in range(pending.parts - 1)]
                meter.made(sum(p.busy_s for p in parts), sum(p.cpu_s for p in parts), sum(p.cpu_s for p in parts))
                yield pending.number, self._batch(pending, parts), sum(part.skipped for part in parts)
            finished = True
        finally:
            tasks.pending.clear()  # let go of the slots
            tasks.keep_going = _always  # and of the caller (a Loader kept alive by its own workers' sampler)
            self.running = False
            if not finished:
                self.close()

    def _batch(self, pending: _Pending, parts: list[Part]) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) of a batch from its ``parts``; the first error a worker met raised here."""
        for part in parts:
            if part.error is not None:
                raise part.error
        if pending.pixels is None:
            assert parts[0].images is not None and parts[0].labels is not None
            return parts[0].images, torch.from_numpy(parts[0].labels)
        labels = torch.empty(pending.size, dtype=torch.int64)
        for k, part in enumerate(parts):
            assert part.labels is not None
            labels[part_positions(pending.size, k, pending.parts)] = torch.from_numpy(part.labels)
        return self.maker.delivered(pending.pixels[: pending.size].view(self.maker.pixel_dtype())), labels

    def close(self) -> None:
        """Stop the workers now: the DataLoader's iterator, which only these references hold, shuts them down when freed."""
        self._parts, self._workers = None, None
