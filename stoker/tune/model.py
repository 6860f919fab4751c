"""The pipeline model: the rate each stage of a Loader can give, what the whole delivers, and
which stage limits it.

    storage ─────────────> read, decode, crop (and transform) ──────> the training loop
    a disk: blocks read     on the cores: workers x duty of the        consumer img/s;
    ahead; an object        free cores x img/s per core; one           echo serves up to
    store: k ranged reads   process's threads at most gil_rate         ``echo`` times the
    in flight of a part     (the Python each image holds the GIL for)  fresh images

The stages run overlapped (reads ahead of the order, the next batches made while the loop steps),
so the loop gets the least of their rates, and the stage that gives it is the bottleneck
(``none`` where the loop itself is slower). Pure functions of figures: the Loader's tuner gives
them what a running Loader measured (stoker/tune/tuner.py), ``stoker doctor`` what its probes
measured; :func:`choose` is what the tuner would choose from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from stoker.tune.settings import INF, MIB, Bounds, Settings, loader_bounds, loader_start

Bottleneck = Literal["storage", "object store", "cpu", "gil", "none"]
# A setting within this share of the best rate counts as good as it: the cheapest of those is chosen.
CLOSE_ENOUGH = 0.02
# The cores were all busy (ours and other processes' together) past this share of them.
BUSY = 0.9


@dataclass(frozen=True)
class Source:
    """Where the bytes come from, read by requests: each answers after ``first_byte_s`` and then
    streams ``stream_bytes_per_s``; all of them together move at most ``link_bytes_per_s`` (a
    link's, a disk's or a store's limit; ``inf``: none seen)."""

    first_byte_s: float
    stream_bytes_per_s: float = INF
    link_bytes_per_s: float = INF

    def bytes_per_s(self, in_flight: float, part_bytes: float) -> float:
        """Bytes per second with ``in_flight`` requests of ``part_bytes`` each at all times."""
        seconds = self.first_byte_s + part_bytes / self.stream_bytes_per_s
        per_request = part_bytes / seconds if seconds > 0 else INF
        return min(self.link_bytes_per_s, in_flight * per_request)


@dataclass(frozen=True)
class Stages:
    """What each stage of a Loader costs or gives, measured (``inf``: no limit, or not measured).

    ``cores``: the cores the process may run on, ``other_cores`` the cores' worth other processes
    took of them; ``other_demand`` the cores' worth they would run if they could (their threads
    ready to run: the kernel shares the cores between all such threads, so more threads of ours get
    more of them; see :meth:`cores_for`), None where what they took is theirs whatever we run (a
    cgroup's share, or not known); ``per_core``: images one core reads, decodes, crops and augments per second
    (a running Loader measures every per-sample stage together here), ``transform_per_core``: the
    images one core runs a per-sample transform on besides (the doctor measures it apart); ``duty``: the share of its time a
    worker thread computes while it makes samples (below 1: it waits for reads); ``gil_rate``:
    img/s one process's threads reach at most, the GIL held by the Python each image needs;
    ``storage``: where the bytes come from (None: memory, the page cache), ``remote`` whether that
    is an object store read by range (reads in flight and part size apply) rather than a disk read
    ahead by blocks; ``image_bytes``: the mean stored bytes of a sample, ``block_bytes`` those of
    a block of the order (read whole); ``consumer``: img/s the training loop takes."""

    cores: float
    per_core: float
    other_cores: float = 0.0
    other_demand: float | None = None
    duty: float = 1.0
    gil_rate: float = INF
    storage: Source | None = None
    remote: bool = False
    image_bytes: float = 100e3
    block_bytes: float = 8 * MIB
    consumer: float = INF
    transform_per_core: float = INF

    @property
    def cpu_per_core(self) -> float:
        """Images one core takes through every per-sample stage, one after the other."""
        return 1.0 / (1.0 / self.per_core + 1.0 / self.transform_per_core)

    @property
    def free_cores(self) -> float:
        """The cores other processes leave (at least a tenth of one: a core shared is never none)."""
        return max(0.1, self.cores - self.other_cores)

    def cores_for(self, workers: float) -> float:
        """The cores ``workers`` threads of ours get (each computing ``duty`` of its time): what
        they use while the others leave room; on cores shared with ``other_demand``, each thread
        ready to run its equal share (the others no more than they ask); else the cores others leave."""
        ours = workers * self.duty
        if self.other_demand is None:
            return min(ours, self.free_cores)
        threads = max(1.0, self.other_demand)  # a process asking less than a core still runs a thread
        theirs = self.other_demand if ours + self.other_demand <= self.cores else min(
            self.other_demand, self.cores * threads / (ours + threads))
        return max(0.1, min(ours, self.cores - theirs))


@dataclass(frozen=True)
class Prediction:
    """What a Loader at some settings delivers: ``rate`` img/s to the loop (echoes included),
    ``fresh`` img/s of them read and made, the ``bottleneck``, and each stage's ``rates``."""

    rate: float
    fresh: float
    bottleneck: Bottleneck
    rates: dict[str, float]


def storage_rate(stages: Stages, settings: Settings) -> float:
    """Images/s the storage gives at ``settings``: a disk with ``readahead`` blocks requested ahead
    of the order, an object store with ``reads_in_flight`` parts of ``part_bytes`` (no more than
    the blocks read ahead hold)."""
    source = stages.storage
    if source is None:
        return INF
    if not stages.remote:
        return source.bytes_per_s(settings.readahead, stages.block_bytes) / stages.image_bytes
    parts_ahead = settings.readahead * math.ceil(stages.block_bytes / settings.part_bytes)
    in_flight = min(settings.reads_in_flight, parts_ahead)
    return source.bytes_per_s(in_flight, settings.part_bytes) / stages.image_bytes


def cpu_rate(stages: Stages, settings: Settings) -> float:
    """Images/s the cores give at ``settings``: the cores the workers get (:meth:`Stages.cores_for`)."""
    return stages.cores_for(settings.workers) * stages.cpu_per_core


def gil_rate(stages: Stages, settings: Settings) -> float:
    """Images/s the GIL lets through: one process's at most ``gil_rate``, each worker process its own."""
    return stages.gil_rate * max(1, settings.processes)


def predict(stages: Stages, settings: Settings) -> Prediction:
    """What a Loader at ``settings`` delivers with ``stages`` (see the module's docstring)."""
    rates = {"storage": storage_rate(stages, settings), "cpu": cpu_rate(stages, settings),
             "gil": gil_rate(stages, settings)}
    limit = min(rates, key=lambda name: rates[name])
    fresh = rates[limit]
    rate = min(stages.consumer, fresh * settings.echo)
    if stages.consumer <= fresh:
        bottleneck: Bottleneck = "none"
    else:
        bottleneck = "object store" if limit == "storage" and stages.remote else limit  # type: ignore[assignment]
    return Prediction(rate, fresh, bottleneck, {**rates, "consumer": stages.consumer})


def choose(stages: Stages, bounds: Bounds, start: Settings) -> Settings:
    """What the tuner would choose with ``stages`` from ``start``: for the workers, then for the
    storage, the cheapest settings within :data:`CLOSE_ENOUGH` of the best rate the bounds allow
    (a stage faster than the loop needs gains nothing), then the least echo that serves the loop
    (where ``bounds.echo`` allows echoing at all)."""
    # The workers as if the bytes were in memory (a slow store would make any count look as good),
    # then the storage for those workers.
    chosen = _cheapest(replace(stages, storage=None), bounds, start, worker_options(bounds, start), "fresh")
    chosen = _cheapest(stages, bounds, chosen, storage_options(bounds, chosen), "fresh")
    return _cheapest(stages, bounds, chosen, [replace(chosen, echo=k) for k in _span(bounds.echo)], "rate")


def _cheapest(stages: Stages, bounds: Bounds, start: Settings, options: list[Settings], measure: str) -> Settings:
    """The first of ``options`` (cheapest first) whose predicted ``measure`` is within
    :data:`CLOSE_ENOUGH` of the best of them, capped at what the loop takes; ``start`` when none fits."""
    allowed = [settings for settings in options if bounds.allows(settings)]
    if not allowed:
        return start
    rate = {settings: getattr(predict(stages, settings), measure) for settings in allowed}
    best = min(max(rate.values()), stages.consumer)
    return next(settings for settings in allowed if rate[settings] >= (1 - CLOSE_ENOUGH) * best)


def other_demand(cores: float, workers: int, own_cores: float, other_cores: float) -> float:
    """The cores' worth other processes would run (:attr:`Stages.other_demand`), from a measurement
    of ``workers`` threads of ours that used ``own_cores`` while the others took ``other_cores`` of
    ``cores``: what they took where the cores had room; where they were all busy, the kernel gave
    each thread ready to run its equal share, so the others' threads were to ours as their cores to ours."""
    if own_cores + other_cores < BUSY * cores or own_cores <= 0:
        return other_cores
    return other_cores * workers / own_cores


def worker_options(bounds: Bounds, start: Settings) -> list[Settings]:
    """The workers ``bounds`` allow from ``start``: threads, then worker processes of a few
    threads each, cheapest first (fewest workers)."""
    options = [replace(start, processes=0, threads=t) for t in _span(bounds.threads)] if bounds.processes[0] == 0 else []
    low, high = bounds.threads
    for processes in _span(bounds.processes):
        if processes >= 2:  # a few threads each: one more than its share of the threads, at most
            most = max(low, min(high, math.ceil(high / processes) + 1))
            options += [replace(start, processes=processes, threads=t) for t in range(low, most + 1)]
    return sorted(options, key=lambda s: (s.workers, s.processes))


def storage_options(bounds: Bounds, start: Settings) -> list[Settings]:
    """The storage settings ``bounds`` allow from ``start``: read-ahead depths, reads in flight
    and part sizes (powers of two), least first."""
    options = [replace(start, readahead=depth, reads_in_flight=k, part_bytes=part)
               for depth in _doublings(bounds.readahead) for k in _doublings(bounds.reads_in_flight)
               for part in _doublings(bounds.part_bytes)]
    return sorted(options, key=lambda s: (s.readahead * s.part_bytes, s.reads_in_flight, s.part_bytes))


def _span(bounds: tuple[int, int]) -> range:
    return range(bounds[0], bounds[1] + 1)


def _doublings(bounds: tuple[int, int]) -> list[int]:
    """``low``, 2 x ``low``, ... up to ``high``, and ``high``."""
    low, high = bounds
    values = [low]
    while values[-1] * 2 <= high:
        values.append(values[-1] * 2)
    return values if values[-1] == high else [*values, high]


def loader_choice(stages: Stages, *, echo: bool = False, processes: bool = True,
                  memory_bytes: float = INF) -> tuple[Settings, Prediction]:
    """What a default Loader's tuner would choose with ``stages`` (``stoker doctor``'s figures, or
    a running Loader's), and what the model predicts it delivers: from :func:`loader_start` on
    ``stages.cores`` cores within :func:`loader_bounds` (``echo``: the Loader was given
    ``echo="auto"``; ``processes``: worker processes are allowed, as they are not for data at a
    URL without a node cache)."""
    cores = max(1, math.floor(stages.cores))
    start = loader_start(cores)
    bounds = loader_bounds(cores, start, remote=stages.remote, processes=processes, echo=echo,
                           memory_bytes=memory_bytes, block_bytes=int(stages.block_bytes))
    chosen = choose(stages, bounds, start)
    return chosen, predict(stages, chosen)
