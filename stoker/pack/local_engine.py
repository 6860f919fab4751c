"""The local engine: shard jobs on a pool of worker processes on this machine.

Workers write their shards and records themselves (see stoker/pack/shard_job.py); this module
only runs them, forwards their progress and hands back the records as they finish.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from multiprocessing.queues import Queue

from stoker.pack.shard_job import ShardJob, ShardRecord, run_shard_job
from stoker.sources.inputs import Inputs


def run_local(todo: list[ShardJob], workers: int | None,
              progress: Callable[[int], None]) -> Generator[ShardRecord, None, None]:
    """Run ``todo`` on ``workers`` processes (default: all cores); yield each record as its shard is done.

    ``progress(samples)`` is called from this thread only after every worker has been forked, so
    a progress bar's monitor thread never exists in a forked child.
    """
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    progress_queue = context.Queue()
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    # The inputs (a Dataset, for one) go to each worker once, inherited under fork, not with every job.
    # This process's pid is taken here, before any fork: a worker started after this process died
    # would otherwise take its new parent (init) for the pack.
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(progress_queue, todo[0].inputs, os.getpid())) as pool:
        pending: set[Future] = {pool.submit(_worker_job, replace(job, inputs=None)) for job in todo}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(progress_queue, progress)
                for future in done:
                    yield future.result()
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        _drain(progress_queue, progress)


_queue: Queue | None = None
_inputs: Inputs | None = None
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _init_worker(progress_queue: Queue, inputs: Inputs | None, parent: int) -> None:
    global _queue, _inputs
    _queue, _inputs = progress_queue, inputs
    if "torch" in sys.modules:  # a Dataset source uses torch: one thread per worker, as DataLoader workers do;
        sys.modules["torch"].set_num_threads(1)  # a forked child entering an OpenMP region of its parent's hangs
    _exit_with(parent)


def _exit_with(parent: int) -> None:
    """End this worker when the pack process ``parent`` dies (SIGKILL, OOM), however early: an
    orphaned worker must not go on writing, nor hold the pack's lock (inherited) so that no later
    pack can start. On Linux the kernel kills it (PR_SET_PDEATHSIG, set while the parent may already
    be gone: hence the check after it); elsewhere a thread looks every half second."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker_job(job: ShardJob) -> ShardRecord:
    progress_queue = _queue
    if progress_queue is None:
        raise RuntimeError("a pack worker runs jobs only after _init_worker")
    return run_shard_job(replace(job, inputs=_inputs), lambda n, nbytes: progress_queue.put(n))


def _drain(progress_queue: Queue, progress: Callable[[int], None]) -> None:
    while True:
        try:
            n = progress_queue.get_nowait()
        except queue.Empty:
            return
        progress(n)
