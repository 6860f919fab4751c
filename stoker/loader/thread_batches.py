"""A Loader's batches made by a pool of threads in the loop's process (the default), into a ring
of reused buffers.

    for each of the next ``prefetch`` batches: a free buffer of the ring (:class:`BatchRing`)
        ─> the batch's samples, in the order their bytes arrive, split over the threads
           (thread k takes every n-th): read, decode, crop straight into the buffer
    the loop asks ─> the oldest batch, once all its threads' shares are done

The decoders and OpenCV release the GIL, so the threads use the cores (bench/gil.py). With no
buffer free and none queued, a batch goes into fresh memory, so a loop that keeps every batch
still runs. The threads and ``prefetch`` are read from the plan's settings as each batch is
queued, so a tuner's decision takes effect at the next batch: a new count of threads gets a new
pool (the old one finishes what it was given). Worker processes make batches the same way in
process_batches.py.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from stoker.data.epoch import EpochPlan
from stoker.data.readahead import ReadsAhead
from stoker.loader.batches import Batch, BatchMaker, Made, split
from stoker.loader.buffers import BatchRing
from stoker.loader.meter import Meter
from stoker.tune.settings import Settings


def made_in_threads(maker: BatchMaker, plan: EpochPlan, hints: ThreadPoolExecutor, ahead: ReadsAhead, *,
                    ring: BatchRing | None, numbers: range, batch_size: int, settings: Callable[[], Settings],
                    meter: Meter) -> Generator[Made, None, None]:
    """Batches ``numbers`` of ``plan``, made by ``settings().threads`` threads into ``ring``'s
    buffers (None: fresh memory each), up to ``settings().prefetch`` queued ahead of the consumer:
    whenever the consumer asks, as many as free buffers allow. Ends early, after the batches
    queued, once ``settings()`` asks for worker processes. ``hints`` runs ``ahead.advance`` as
    batches are queued; ``meter`` hears what each batch cost the threads."""
    upcoming = numbers.start  # the next batch to queue
    threads = settings().threads
    pools = [ThreadPoolExecutor(threads, thread_name_prefix="stoker-loader")]  # the last one takes new batches
    pending: deque[tuple[Batch, list[Future]]] = deque()
    try:
        while True:
            now = settings()
            if now.threads != threads:  # the tuner's decision: the old pool finishes what it was given
                pools[-1].shutdown(wait=False)
                threads = now.threads
                pools.append(ThreadPoolExecutor(threads, thread_name_prefix="stoker-loader"))
            while upcoming < numbers.stop and len(pending) < now.prefetch and not now.processes:
                pixels = ring.take() if ring is not None else None
                if pixels is None and pending:
                    break
                hints.submit(ahead.advance, upcoming * batch_size)
                pending.append(_queue(maker, pools[-1], plan, upcoming, batch_size, threads, ahead, pixels))
                upcoming += 1
            if not pending:
                return
            batch, futures = pending.popleft()
            spent = [future.result() for future in futures]
            meter.made(sum(wall for wall, _ in spent), sum(cpu for _, cpu in spent))
            yield batch.number, maker.finish(batch), int(batch.replaced.sum())
    finally:
        for _, futures in pending:
            for future in futures:
                future.cancel()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)


def _queue(maker: BatchMaker, pool: ThreadPoolExecutor, plan: EpochPlan, number: int, batch_size: int, threads: int,
           ahead: ReadsAhead, pixels: torch.Tensor | None) -> tuple[Batch, list[Future]]:
    """Start batch ``number`` in ``pixels`` and queue its samples on the pool, split across the threads."""
    indices = plan.share[number * batch_size : (number + 1) * batch_size]
    batch = maker.start(plan.epoch, number, indices, pixels=pixels)
    # Each thread takes every n-th sample in the order the bytes arrive from disk, so on a cold
    # cache all threads decode what has been read while the rest is read; the batch is the same.
    ordered = ahead.arrival_order(batch.indices)
    return batch, [pool.submit(_timed, maker, batch, share) for share in split(ordered, threads)]


def _timed(maker: BatchMaker, batch: Batch, positions: np.ndarray) -> tuple[float, float]:
    """``maker.fill`` of ``positions``; the wall and CPU seconds it took this thread."""
    wall, cpu = time.perf_counter(), time.thread_time()
    maker.fill(batch, positions)
    return time.perf_counter() - wall, time.thread_time() - cpu
