"""What the Loader's tuner turns (:class:`Settings`) and within what (:class:`Bounds`): the knobs
that change how fast batches come, never which samples, labels or crops they hold."""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf
MIB = 1 << 20
# The recent fresh batches a Loader keeps to draw echoes from.
ECHO_BATCHES = 4


@dataclass(frozen=True)
class Settings:
    """What the tuner turns: ``threads`` (per process), worker ``processes`` (0: threads in the
    loop's process), batches made ahead (``prefetch``), blocks of the order read ahead
    (``readahead``), ranged reads of an object store at once per process (``reads_in_flight``) of
    ``part_bytes`` each, and ``echo``: the most times an example may be served (1: never echoed)."""

    threads: int
    processes: int = 0
    prefetch: int = 2
    readahead: int = 16
    reads_in_flight: int = 16
    part_bytes: int = 2 * MIB
    echo: int = 1

    @property
    def workers(self) -> int:
        """Threads making samples, in all processes."""
        return self.threads * max(1, self.processes)

    @property
    def worker_layout(self) -> tuple[int, int]:
        """(processes, threads per process): a change in it makes a new pool of workers."""
        return self.processes, self.threads

    def describe(self) -> str:
        """One line: '3 threads, prefetch 2, read-ahead 16 blocks, 16 reads in flight of 2 MiB'."""
        workers = (f"{self.processes} processes x {self.threads} threads" if self.processes
                   else f"{self.threads} thread{'s' * (self.threads != 1)}")
        text = (f"{workers}, prefetch {self.prefetch}, read-ahead {self.readahead} blocks, "
                f"{self.reads_in_flight} reads in flight of {_size(self.part_bytes)}")
        return text + (f", echo up to {self.echo}x" if self.echo > 1 else "")


@dataclass(frozen=True)
class Bounds:
    """What the tuner may set each knob to: ``(low, high)``, equal where an argument fixes it;
    within ``memory_bytes`` for what the settings add beyond the least of each: batches made ahead
    and :data:`ECHO_BATCHES` kept for echoes, of ``batch_bytes`` each; worker processes of
    ``process_bytes``; blocks of an object store read ahead into memory, ``block_bytes`` each."""

    threads: tuple[int, int]
    processes: tuple[int, int] = (0, 0)
    prefetch: tuple[int, int] = (2, 2)
    readahead: tuple[int, int] = (16, 16)
    reads_in_flight: tuple[int, int] = (16, 16)
    part_bytes: tuple[int, int] = (2 * MIB, 2 * MIB)
    echo: tuple[int, int] = (1, 1)
    memory_bytes: float = INF
    batch_bytes: float = 0.0
    process_bytes: float = 0.0
    block_bytes: float = 0.0

    def memory(self, settings: Settings) -> float:
        """What ``settings`` hold beyond the least settings: batches ahead, processes, blocks in
        memory, and the recent batches echoes are drawn from."""
        return ((settings.prefetch - self.prefetch[0] + (ECHO_BATCHES if settings.echo > 1 else 0)) * self.batch_bytes
                + settings.processes * self.process_bytes
                + (settings.readahead - self.readahead[0]) * self.block_bytes)

    def allows(self, settings: Settings) -> bool:
        """Whether every knob of ``settings`` is within its bounds and the whole within the memory budget."""
        return all(low <= getattr(settings, name) <= high for name, (low, high) in self.knobs().items()) and (
            self.memory(settings) <= self.memory_bytes)

    def knobs(self) -> dict[str, tuple[int, int]]:
        """Each knob's bounds, by the name of its field in :class:`Settings`."""
        return {"threads": self.threads, "processes": self.processes, "prefetch": self.prefetch,
                "readahead": self.readahead, "reads_in_flight": self.reads_in_flight,
                "part_bytes": self.part_bytes, "echo": self.echo}

    def free(self, knob: str) -> bool:
        """Whether the tuner may change ``knob``."""
        low, high = self.knobs()[knob]
        return low < high


def _size(nbytes: float) -> str:
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


# Below this many cores worker processes are not tried: on 2 cores they measured 0.89-0.93x the
# threads with fresh shared memory per batch, and ~1.0x with the shared ring (bench/scaling.py,
# native path); a per-sample transform's batches still go through fresh memory, which is where
# the GIL would call for processes, so there is nothing to win on so few cores.
FEW_CORES = 4
# What a worker process holds of its own (torch imported, its threads' buffers), counted against the budget.
PROCESS_BYTES = 300e6
# The most the tuner reads ahead, reads at once from an object store, makes ahead and echoes.
MOST_READAHEAD, MOST_IN_FLIGHT, MOST_PREFETCH, MOST_ECHO = 64, 64, 8, 4
# Where other processes' threads share the cores, the kernel gives each thread ready to run its
# share, so more threads get a process more of them: the tuner may run up to this many per core
# (bench/autotune.py's scenario f: 6 threads on 2 cores, one taken, 1.11x 3 threads). Not past
# cores + 1 for one of several ranks of a node, whose others would answer in kind.
MOST_THREADS_PER_CORE = 3
PARTS = (1 * MIB, 16 * MIB)


def loader_start(cores: int, window: int = 16, reads_in_flight: int = 16) -> Settings:
    """Where a Loader left to tune itself starts on ``cores`` cores (what an untuned Loader runs):
    a thread more than the cores, 2 batches ahead, ``window`` blocks read ahead, ``reads_in_flight``
    ranged reads of 2 MiB."""
    return Settings(threads=cores + 1, readahead=window, reads_in_flight=reads_in_flight)


def loader_bounds(cores: int, start: Settings, *, remote: bool = False, processes: bool = True, echo: bool = False,
                  memory_bytes: float = INF, batch_bytes: float = 0.0, block_bytes: float = 8 * MIB,
                  ranks_here: int = 1) -> Bounds:
    """What a Loader's tuner may set from ``start`` on ``cores`` cores: 1 to
    :data:`MOST_THREADS_PER_CORE` x ``cores`` threads (cores + 1 for one of ``ranks_here`` > 1
    ranks of a node; more than cores + 1 gain only where other processes share them); worker
    processes where ``processes`` allows them and there are at least :data:`FEW_CORES` cores;
    more batches ahead; more blocks read ahead;
    for data at a URL (``remote``) reads in flight and their part size; echo up to
    :data:`MOST_ECHO` where ``echo`` allows it; all within ``memory_bytes`` (batches of
    ``batch_bytes``, blocks of ``block_bytes`` held in memory when ``remote``)."""
    fixed_remote = not remote
    return Bounds(
        threads=(1, max(start.threads, cores + 1 if ranks_here > 1 else MOST_THREADS_PER_CORE * cores)),
        processes=(0, cores if processes and cores >= FEW_CORES else 0),
        prefetch=(start.prefetch, max(start.prefetch, MOST_PREFETCH)),
        readahead=(start.readahead, max(start.readahead, MOST_READAHEAD)),
        reads_in_flight=(start.reads_in_flight,) * 2 if fixed_remote else (1, max(start.reads_in_flight, MOST_IN_FLIGHT)),
        part_bytes=(start.part_bytes,) * 2 if fixed_remote else (min(PARTS[0], start.part_bytes),
                                                                 max(PARTS[1], start.part_bytes)),
        echo=(1, MOST_ECHO if echo else 1),
        memory_bytes=memory_bytes, batch_bytes=batch_bytes, process_bytes=PROCESS_BYTES,
        block_bytes=block_bytes if remote else 0.0)
