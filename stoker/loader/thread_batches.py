"""A Loader's batches made by a pool of threads in the loop's process (the default), into a ring
of reused buffers.

    for each of the next ``prefetch`` batches: a free buffer of the ring (:class:`BatchRing`)
        ─> the batch's samples, in the order their bytes arrive, split over the threads
           (thread k takes every n-th): read, decode, crop straight into the buffer
    the loop asks ─> the oldest batch, once all its threads' shares are done

The decoders and OpenCV release the GIL, so the threads use the cores (bench/gil.py). With no
buffer free and none queued, a batch goes into fresh memory, so a loop that keeps every batch
still runs. Worker processes make batches the same way in process_batches.py.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from stoker.data.epoch import EpochPlan
from stoker.data.readahead import ReadsAhead
from stoker.loader.batches import Batch, BatchMaker, Made, split
from stoker.loader.buffers import BatchRing
from stoker.loader.workers import FirstBatches


def made_in_threads(maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor, ahead: ReadsAhead, *,
                    ring: BatchRing | None, threads: int, prefetch: int, batch_size: int,
                    first_batches: FirstBatches | None) -> Generator[Made, None, None]:
    """The batches of ``plan``, made by ``threads`` threads into ``ring``'s buffers (None: fresh
    memory each), up to ``prefetch`` queued ahead of the consumer: whenever the consumer asks, as
    many as free buffers allow. ``hints`` runs ``ahead.advance`` as batches are queued;
    ``first_batches`` (when measuring) hears of each batch and each wait for one."""
    upcoming = 0  # the next batch to queue
    pool = ThreadPoolExecutor(threads, thread_name_prefix="stoker-loader")
    pending: deque[tuple[Batch, list[Future]]] = deque()
    try:
        while True:
            while upcoming < len(plan.batches) and len(pending) < prefetch:
                pixels = ring.take() if ring is not None else None
                if pixels is None and pending:
                    break
                hints.submit(ahead.advance, upcoming * batch_size)
                pending.append(_queue(maker, pool, plan, upcoming, batch_size, threads, ahead, pixels))
                upcoming += 1
            if not pending:
                return
            batch, futures = pending.popleft()
            waiting = time.perf_counter()
            for future in futures:
                future.result()
            if first_batches is not None:
                first_batches.blocked(time.perf_counter() - waiting)
                first_batches.batch()
            yield batch.number, maker.finish(batch), int(batch.replaced.sum())
    finally:
        for _, futures in pending:
            for future in futures:
                future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _queue(maker: BatchMaker, pool: ThreadPoolExecutor, plan: EpochPlan, number: int, batch_size: int, threads: int,
           ahead: ReadsAhead, pixels: torch.Tensor | None) -> tuple[Batch, list[Future]]:
    """Start batch ``number`` in ``pixels`` and queue its samples on the pool, split across the threads."""
    indices = plan.share[number * batch_size : (number + 1) * batch_size]
    batch = maker.start(plan.epoch, number, indices, pixels=pixels)
    # Each thread takes every n-th sample in the order the bytes arrive from disk, so on a cold
    # cache all threads decode what has been read while the rest is read; the batch is the same.
    ordered = ahead.arrival_order(batch.indices)
    return batch, [pool.submit(maker.fill, batch, share) for share in split(ordered, threads)]
