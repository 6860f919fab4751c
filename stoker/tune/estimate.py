"""What a running Loader measured over a few batches (:class:`Window`), and the stages the model
reads from it (:func:`estimate`): which stage held the batches back, calibrated so that the model
predicts, at the settings measured, the rate that was measured.

    the loop waited under WAITED_ENOUGH of the time   the input keeps up: nothing limits it
    the worker threads were idle half of it           queue: too few batches were queued for them
    the workers used the cores they could             cpu: img/s per core from their CPU time
    an object store's reads were all in flight        object store: its requests' time and bytes
    a disk read what the samples hold                 storage: the blocks read ahead in flight
    none of these, the cores free                     gil: one process's threads make no more
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from stoker.tune.model import Source, Stages, other_demand
from stoker.tune.settings import INF, Settings

Limit = Literal["none", "queue", "cpu", "object store", "storage", "gil"]

# The loop waited at least this share of the time: the input holds the training back.
WAITED_ENOUGH = 0.05
# The worker threads were busy less than this share of the time while the loop waited: too few
# batches were queued for them (a loop whose pace varies drains the queue).
WORKERS_IDLE = 0.5
# The workers used this share of the cores they could (their count, or the free cores): CPU bound.
CORES_USED = 0.8
# An object store's reads in flight were, on average, this share of those allowed: it is the limit.
READS_BUSY = 0.7
# A disk read at least this share of the bytes of the samples made: their reads wait on it.
DISK_SHARE = 0.25


@dataclass(frozen=True)
class Window:
    """A Loader's counters over a few batches at one setting: ``seconds`` of wall time, ``images``
    made and read fresh, ``served`` to the loop (echoes included), ``waited_s`` the loop spent
    waiting for batches; the worker threads' ``busy_s`` making samples and their ``cpu_s``
    (summed over threads), the CPU seconds of all the Loader's processes (``process_cpu_s``), and
    the cores' worth other processes took (``other_cores``); bytes read from a disk
    (``disk_bytes``), and from an object store: ``read_bytes`` in ``requests`` that took
    ``read_s`` (summed)."""

    seconds: float
    images: int
    served: int
    waited_s: float
    busy_s: float
    cpu_s: float
    process_cpu_s: float
    other_cores: float = 0.0
    disk_bytes: float = 0.0
    read_bytes: float = 0.0
    read_s: float = 0.0
    requests: int = 0

    @property
    def rate(self) -> float:
        """Images served per second."""
        return self.served / self.seconds if self.seconds > 0 else 0.0

    @property
    def fresh(self) -> float:
        """Fresh images per second."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def waited(self) -> float:
        """The share of the time the loop waited."""
        return min(1.0, self.waited_s / self.seconds) if self.seconds > 0 else 0.0

    def describe(self) -> str:
        """The figures a decision rests on, in one line."""
        text = (f"{self.rate:,.0f} img/s served ({self.fresh:,.0f} fresh), the loop waited {self.waited:.0%}, "
                f"the Loader used {self.process_cpu_s / self.seconds:.1f} cores")
        if self.other_cores >= 0.05:
            text += f", other processes {self.other_cores:.1f}"
        if self.requests:
            text += (f", {self.read_bytes / self.seconds / 1e6:,.0f} MB/s from the store "
                     f"({self.read_s / self.seconds:.1f} reads in flight, {self.read_s / self.requests * 1e3:,.0f} ms each)")
        elif self.disk_bytes >= 1e6 * self.seconds:
            text += f", {self.disk_bytes / self.seconds / 1e6:,.0f} MB/s from the disk"
        return text


@dataclass(frozen=True)
class Known:
    """What does not change while a Loader runs: its ``cores``, whether the data is at a URL
    (``remote``), the mean stored bytes of a sample and of a block; and what the tuner has learned
    of the storage from its own trials: the most it moved (``link_bytes_per_s``) and one
    request's streaming rate (``stream_bytes_per_s``); and of the cores, whether other processes
    share them thread by thread (``shared_by_thread``: the kernel's way, until fewer threads of ours
    were measured as fast, which shows the others hold their cores whatever we run)."""

    cores: int
    remote: bool = False
    image_bytes: float = 100e3
    block_bytes: float = 8 << 20
    link_bytes_per_s: float = INF
    stream_bytes_per_s: float = INF
    shared_by_thread: bool = True


def estimate(window: Window, settings: Settings, known: Known) -> tuple[Stages, Limit]:
    """The stages ``window`` shows at ``settings`` (see the module's docstring), and which held the
    batches back. Waiting for reads or the GIL is the stage that makes the threads wait, so the
    threads' share of computing (``Stages.duty``) stays 1 here."""
    seconds = max(window.seconds, 1e-9)
    consumer = window.served / max(seconds - window.waited_s, 1e-9)
    per_core = window.images / window.cpu_s if window.cpu_s > 0 else INF
    own, other = window.process_cpu_s / seconds, min(window.other_cores, float(known.cores))
    # Where the window waited on an object store's requests, the rate moves with the reads and the
    # store's own processes (a proxy, a local server) may be among the others: what others took is
    # left to them (a trial of more threads measured there compared phases of the reads, not the
    # threads: bench/autotune.py's scenarios c and d).
    shared = known.shared_by_thread and not window.requests
    demand = other_demand(known.cores, settings.workers, own, other) if shared else None
    stages = Stages(known.cores, per_core, other, demand,
                    consumer=consumer, remote=known.remote, image_bytes=known.image_bytes,
                    block_bytes=known.block_bytes)
    if window.waited < WAITED_ENOUGH:
        return stages, "none"
    if window.busy_s < WORKERS_IDLE * settings.workers * seconds:
        return stages, "queue"
    had = stages.cores_for(settings.workers)
    if own >= CORES_USED * had:
        # What the cores gave, all of it counted (the loop process's share of each batch too).
        return replace(stages, per_core=window.fresh / had), "cpu"
    if known.remote and window.requests and window.read_s / seconds >= READS_BUSY * settings.reads_in_flight:
        return replace(stages, storage=_store(window, known)), "object store"
    if not known.remote and window.disk_bytes >= DISK_SHARE * window.images * known.image_bytes:
        return replace(stages, storage=_disk(window, settings, known)), "storage"
    return replace(stages, gil_rate=window.fresh / max(1, settings.processes)), "gil"


def _store(window: Window, known: Known) -> Source:
    """An object store as its requests showed it: each took ``read_s / requests`` seconds for its
    bytes, of which the tuner's trials may have learned how long streaming takes (else none:
    every second of it counts as waiting for the first byte, so larger parts look worth a try)."""
    seconds, part = window.read_s / window.requests, window.read_bytes / window.requests
    streaming = part / known.stream_bytes_per_s
    if streaming >= seconds:  # learned at another time, slower than now: all of it streaming
        return Source(0.0, part / seconds, known.link_bytes_per_s)
    return Source(seconds - streaming, known.stream_bytes_per_s, known.link_bytes_per_s)


def _disk(window: Window, settings: Settings, known: Known) -> Source:
    """A disk as the blocks read ahead showed it: ``readahead`` blocks in flight moved what it read."""
    moved = window.disk_bytes / max(window.seconds, 1e-9)
    return Source(settings.readahead * known.block_bytes / moved, INF, known.link_bytes_per_s)
