"""How many worker processes and threads a Loader makes its batches with, chosen for the machine.

Threads share one process, so the Python each image needs holds the GIL one thread at a time:
with the native chunk path that is a few microseconds per image (bench/gil.py), and threads use
every core; with per-sample Python (a user's transform) it can be hundreds, and a process's
threads then use a core or two whatever the machine has. Only a measurement tells which. A
Loader that tunes itself (the default) decides while it runs (stoker/tune, loader/tuning.py); one
made with ``tune=False`` and left to choose (``processes=None``) starts with threads only and
watches its first batches once:
how many cores its process used while the training loop waited for it. Threads that use the
cores they have are kept; where they use a fraction of them while the loop waits, the next pass
runs in worker processes, each with a few threads (:func:`choose_workers`, a pure function of
those figures).

    first pass: threads only ──> batches 2..6: CPU seconds / wall seconds = cores used,
                                               time blocked on batches / wall = loop waited
    later passes: choose_workers(cores, threads, cores used, waited) ──> (processes, threads, why)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from stoker.tune.settings import FEW_CORES

# The loop waited for batches at least this share of the time: the Loader limits the training.
WAITED_ENOUGH = 0.1
# Threads that keep this share of the cores they could use busy are not limited by the GIL.
USED_ENOUGH = 0.6


@dataclass(frozen=True)
class WorkerChoice:
    """Worker processes (0: threads in the loop's process) and threads (per process), and why."""

    processes: int
    threads: int
    reason: str

    def describe(self) -> str:
        """'17 threads' or '6 processes x 4 threads'."""
        if self.processes:
            return f"{self.processes} processes x {self.threads} threads"
        return f"{self.threads} threads"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_workers(cores: int, threads: int, cores_used: float, waited: float,
                   fetches_per_process: bool = False) -> WorkerChoice:
    """What to run the next passes with, from what ``threads`` threads of one process did in the
    first batches: ``cores_used`` (CPU seconds per second) while the training loop ``waited`` (the
    share of the time it was blocked on the Loader). ``fetches_per_process``: the data comes from
    an object store into each reading process's memory (no node cache), where worker processes
    would each fetch the blocks of the samples they share out, and threads are kept."""
    measured = f"{threads} threads used {cores_used:.1f} of {cores} cores while the loop waited {waited:.0%} of the time"
    if waited < WAITED_ENOUGH:
        return WorkerChoice(0, threads, f"{measured}: the Loader keeps up, threads kept")
    if fetches_per_process:
        return WorkerChoice(0, threads, f"{measured}: threads kept, as the data comes from an object store without "
                                        "a node cache, which worker processes would each fetch (give the data set "
                                        "cache_dir= to share one copy between processes)")
    if cores < FEW_CORES:
        return WorkerChoice(0, threads, f"{measured}: on fewer than {FEW_CORES} cores threads beat worker processes")
    if cores_used >= USED_ENOUGH * min(threads, cores):
        return WorkerChoice(0, threads, f"{measured}: the threads use the cores, threads kept")
    processes = min(cores, math.ceil(cores / max(cores_used, 1.0)))
    per_process = math.ceil(cores / processes) + 1  # one more than its share: a thread waiting on the disk idles no core
    return WorkerChoice(processes, per_process, f"{measured}: the GIL limits one process, so "
                                                f"{processes} worker processes of {per_process} threads")
