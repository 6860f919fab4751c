"""A Loader's tuner at work across its passes: the Meter's windows (meter.py) go to stoker.tune's
Tuner, each decision becomes a new plan (plan.py: ``LoaderPlan.tuned``), and what the plan's
passes do not read themselves is set here: the blocks read ahead of the order and an object
store's reads in flight and their size.

    a batch served ─> Meter ─a window─> Tuner.observe ─decisions─> LoaderPlan.tuned (logged)
        threads, prefetch        read by thread_batches.py as it queues the next batch
        processes                the pass's next run of batches (loader.py)
        read-ahead               ReadsAhead.set_depth
        reads in flight, parts   RemoteData.tune
        echo                     served.py

With ``tune=False`` the meter only measures the first pass's batches 2-6 for workers.py's rule.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from stoker.data.readable import Storage
from stoker.data.readahead import ReadsAhead
from stoker.loader.meter import Meter
from stoker.loader.plan import LoaderPlan
from stoker.tune.estimate import Known
from stoker.tune.settings import Settings
from stoker.tune.tuner import Tuner

_log = logging.getLogger("stoker.loader")

# The first pass's batches that workers.py's rule (tune=False) measures: the first starts the
# threads and fills the queue, so the window starts after it.
FIRST_SKIPPED, FIRST_MEASURED = 1, 5


class Tuning:
    """The tuner of a Loader whose ``plan`` lets it tune (``plan.bounds``), over data stored as
    ``storage`` says, its batches ``batch_bytes`` each; or with ``tune=False`` (no bounds) the
    first pass's measurement of a plan that is ``measuring``."""

    def __init__(self, plan: LoaderPlan, storage: Storage, batch_bytes: float) -> None:
        self.meter = Meter(storage.remotes)
        self.storage = storage
        self.tuner: Tuner | None = None
        self.first_pass: tuple[float, float] | None = None  # (cores used, share waited), tune=False
        if plan.bounds is not None:
            bounds = plan.bounds
            # No more batches ahead than the memory budget holds (the thread ring has room for them all).
            room = bounds.memory_bytes // batch_bytes if batch_bytes > 0 else math.inf
            most = bounds.prefetch[0] + int(room) if math.isfinite(room) else bounds.prefetch[1]
            bounds = replace(bounds, batch_bytes=batch_bytes, prefetch=(bounds.prefetch[0], max(bounds.prefetch[0], min(
                bounds.prefetch[1], most))))
            known = Known(plan.cores, bool(storage.remotes), storage.sample_bytes, storage.block_bytes)
            self.tuner = Tuner(bounds, plan.settings, known)
        elif plan.measuring:
            self.meter.skip(FIRST_SKIPPED)

    @property
    def most_prefetch(self) -> int | None:
        """The most batches the tuner may make ahead (None: not tuning)."""
        return self.tuner.bounds.prefetch[1] if self.tuner is not None else None

    def served(self, plan: LoaderPlan, images: int, fresh: bool, waited_s: float, ahead: ReadsAhead) -> LoaderPlan:
        """The loop took a batch of ``images`` after ``waited_s``: the plan from now on (a new one
        where the tuner decided), its read-ahead and object store reads set as it says."""
        self.meter.served(images, fresh, waited_s)
        if self.tuner is None:
            if plan.measuring and self.first_pass is None and (window := self.meter.window(FIRST_MEASURED, 0.0)):
                self.first_pass = (window.process_cpu_s / window.seconds, window.waited)
            return plan
        window = self.meter.window()
        if window is None:
            return plan
        before = plan.settings
        for decision in self.tuner.observe(window):
            plan = plan.tuned(decision)
            _log.info("stoker.Loader tuner: %s", decision.describe())
        if plan.settings != before:
            self.apply(plan.settings, ahead)
            # Made, or queued, the way they were; and a new pool's first batch, made beside the old
            # pool's last ones (measured here: a trial of 6 threads for 3 read ~5% slow without it).
            new_workers = plan.settings.worker_layout != before.worker_layout
            self.meter.skip(plan.settings.prefetch + 1 + new_workers)
        return plan

    def apply(self, settings: Settings, ahead: ReadsAhead) -> None:
        """What the plan's passes do not read themselves: blocks read ahead, the stores' reads."""
        ahead.set_depth(settings.readahead)
        for remote in self.storage.remotes:
            if (remote.parallel, remote.part_bytes) != (settings.reads_in_flight, settings.part_bytes):
                remote.tune(settings.reads_in_flight, settings.part_bytes)


def batch_bytes(rows: int, shape: tuple[int, ...]) -> float:
    """The bytes of a batch of ``rows`` samples in buffers of ``shape`` each."""
    return float(rows * math.prod(shape))
