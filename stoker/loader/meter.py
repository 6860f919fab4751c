"""What a running Loader measures of itself, as windows of a few batches (stoker.tune's Window):
counters it has anyway or reads cheaply, once per batch and once per window, never per sample.

    per batch made        the worker threads' wall and CPU seconds making it (thread_batches.py
                          times each thread's share; worker processes send theirs with each part)
    per batch served      fresh or an echo, and how long the loop waited for it (loader.py)
    per window            wall time; this process's CPU (time.process_time) and the workers';
                          the busy time of this process's cores (/proc/stat): what is not ours was
                          other processes'; bytes read from disk (/proc/self/io); an object store's
                          requests, bytes and seconds (RemoteData.counts)

After a change of settings the batches already queued were made the old way: :meth:`Meter.skip`
leaves them out of the next window.
"""

from __future__ import annotations

import os
import time

from stoker.counters import busy_cpu_seconds, own_read_bytes
from stoker.storage.remote import RemoteData
from stoker.tune.estimate import Window

# A window holds at least this many batches and seconds: enough to average a few batches' noise,
# few enough that a tuner settles within a few seconds.
WINDOW_BATCHES, WINDOW_SECONDS = 3, 0.5
# What a window starts and ends at: the process's CPU time, its cores' busy time (None: not readable),
# its disk reads, and the stores' requests, bytes and seconds
Counters = tuple[float, float | None, int, tuple[float, float, float]]


class Meter:
    """Counts a Loader's batches into windows; ``remotes``: the object stores its data comes from."""

    def __init__(self, remotes: list[RemoteData]) -> None:
        self.remotes = remotes
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        self._skip = 0
        self._start(self._counters())

    def made(self, busy_s: float, cpu_s: float, process_cpu_s: float = 0.0) -> None:
        """A batch was made: the workers' threads spent ``busy_s`` and ``cpu_s`` on it, and worker
        processes ``process_cpu_s`` of CPU in all (0: threads of this process)."""
        self._busy += busy_s
        self._cpu += cpu_s
        self._worker_cpu += process_cpu_s

    def served(self, images: int, fresh: bool, waited_s: float) -> None:
        """The loop took a batch of ``images`` (``fresh``, or an echo) after waiting ``waited_s``."""
        if self._skip:
            self._skip -= 1
            if not self._skip:
                self._start(self._counters())
            return
        self._batches += 1
        self._served += images
        self._images += images if fresh else 0
        self._waited += waited_s

    def skip(self, batches: int) -> None:
        """Leave the next ``batches`` served out: they were made before a change of settings."""
        self._skip = batches
        if not batches:
            self._start(self._counters())

    def window(self, batches: int = WINDOW_BATCHES, seconds: float = WINDOW_SECONDS) -> Window | None:
        """The window since the last one once it holds ``batches`` and ``seconds`` (else None); the next begins."""
        elapsed = time.perf_counter() - self._started
        if self._skip or self._batches < batches or elapsed < seconds:
            return None
        counters = self._counters()
        process_cpu, busy, disk, remote = counters
        own = process_cpu - self._process_cpu + self._worker_cpu
        other = 0.0 if busy is None or self._cores_busy is None else max(0.0, busy - self._cores_busy - own) / elapsed
        requests, nbytes, read_s = (now - then for now, then in zip(remote, self._remote_start))
        window = Window(elapsed, self._images, self._served, self._waited, self._busy, self._cpu, own, other,
                        disk_bytes=float(disk - self._disk), read_bytes=float(nbytes), read_s=read_s,
                        requests=int(requests))
        self._start(counters)  # the next window begins where this one ended: the counters read once
        return window

    def _counters(self) -> Counters:
        """The process's CPU time, its cores' busy time, its disk reads and the stores' counts, now."""
        return time.process_time(), busy_cpu_seconds(self._cpus), own_read_bytes(), self._remote()

    def _start(self, counters: Counters) -> None:
        """Begin a window at ``counters`` (:meth:`_counters`)."""
        self._started = time.perf_counter()
        self._process_cpu, self._cores_busy, self._disk, self._remote_start = counters
        self._batches = self._served = self._images = 0
        self._waited = self._busy = self._cpu = self._worker_cpu = 0.0

    def _remote(self) -> tuple[float, float, float]:
        """Requests, bytes and seconds of every object store's reads so far."""
        totals = [remote.counts.totals() for remote in self.remotes]
        return (float(sum(t[0] for t in totals)), float(sum(t[1] for t in totals)), sum(t[2] for t in totals))
