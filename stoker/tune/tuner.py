"""The Loader's online tuner: decisions from what a running Loader measures, made with the model.

    a window at the kept settings ─estimate─> stages and the stage that held the batches back
        ─model─> the cheapest setting of that stage's knobs predicted to serve MARGIN more
        ─> try it (a Decision) ─> the batches queued before it pass ─> a window at it:
           MARGIN more served: kept, the new baseline; else undone and not tried again
    nothing predicted to gain MARGIN: settled, until the conditions change (other processes take
    or give back cores, the loop's pace or the rate moves DRIFT for two windows); then, from the
    next window (all of it under the new conditions), it looks again, first backing off to one
    worker more than the cores the others leave: kept where it serves no less than MARGIN below
    what it replaced (the cores others took are theirs: a cgroup's share), else undone (the
    kernel shares the cores by threads: fewer of ours got less of them, and more may get more, up
    to MOST_THREADS_PER_CORE, tried like any other change)

Every change is kept only if measured better than what it replaced (a back-off: no worse), no
setting is tried twice under the same conditions, and each kept one serves MARGIN more than the
last: so the tuner settles after a few trials and cannot oscillate on noise smaller than MARGIN.
Pure: windows in, decisions out; the Loader measures and applies them (stoker/loader/tuning.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from stoker.tune.estimate import Known, Limit, Window, estimate
from stoker.tune.model import CLOSE_ENOUGH, Stages, other_demand, predict, storage_options, worker_options
from stoker.tune.settings import Bounds, Settings

# A change is kept only when it serves this much more than what it replaced (hysteresis).
MARGIN = 0.05
# Worker processes take seconds to start and memory to hold: tried only for this much more.
PROCESS_MARGIN = 0.15
# Other processes count as taking the cores past this many cores' worth (doctor/contention.py's
# threshold); a change of this much between two windows makes them incomparable.
SHARED_CORES = 0.25
CORES_MOVED = 0.4
# A settled Loader looks again when the rate moves this much from its baseline, two windows running.
DRIFT = 0.25

Action = Literal["try", "keep", "undo", "back off", "settle"]


@dataclass(frozen=True)
class Decision:
    """What the tuner decided after a window: ``action``, the ``settings`` that run from now on
    (``before``: those that ran), and ``why``: the measurement behind it and the model's reason."""

    action: Action
    settings: Settings
    before: Settings
    why: str

    def describe(self) -> str:
        """One line: the action, what changed and why."""
        change = _changes(self.before, self.settings)
        return f"{self.action}{': ' + change if change else ''} ({self.why})"


class Tuner:
    """Decides the Loader's settings from windows of its measurements (see the module's
    docstring): within ``bounds``, from ``start``, with what ``known`` says of the machine and the
    data. :meth:`observe` takes each window measured at :attr:`settings`."""

    def __init__(self, bounds: Bounds, start: Settings, known: Known) -> None:
        self.bounds, self.known = bounds, known
        self.settings = self.kept = start
        self.baseline: Window | None = None  # a window at the kept settings
        self.closed: set[str] = set()  # knobs a trial undone under the current conditions changed
        self.settled = False
        self.backing_off = False  # the setting on trial has fewer workers, for other processes' sake
        self._drifted = 0  # windows running whose rate moved DRIFT from the baseline

    def observe(self, window: Window) -> list[Decision]:
        """The decisions after ``window``, measured at :attr:`settings` (none, or one or two: a
        trial kept or undone, then the next one tried or the tuner settled)."""
        if window.seconds <= 0 or window.images == 0:
            return []
        base = self.baseline
        if self.settings != self.kept:
            return self._judge(window)
        if base is None:
            self.baseline = window
            return self._back_off(window) or self._next(window)
        if self._changed(base, window):
            # The window that shows the change began before it: the next one, all of it under the
            # new conditions, is the baseline the trials are judged against.
            self.baseline, self.closed, self.settled = None, set(), False
            self.known = replace(self.known, shared_by_thread=True)
        return []

    def _judge(self, window: Window) -> list[Decision]:
        """Keep the setting on trial when ``window`` served MARGIN more than the baseline; else undo it."""
        base, trial = self.baseline, self.settings
        assert base is not None
        if self._others_moved(base, self.kept, window, trial):
            self.settings, self.baseline, self.backing_off = self.kept, None, False  # measured again as kept
            return [Decision("undo", self.kept, trial, f"other processes took {base.other_cores:.1f} cores, then "
                                                       f"{window.other_cores:.1f}: not comparable; {window.describe()}")]
        self._learn(base, window, trial)
        before, polite = self.kept, self.backing_off
        self.backing_off = False
        if window.rate >= (1 + (-MARGIN if polite else MARGIN)) * base.rate:
            self.kept, self.baseline = trial, window
            if polite:  # fewer threads as fast: the others hold their cores whatever we run
                self.known = replace(self.known, shared_by_thread=False)
            kept = Decision("keep", trial, before, f"{window.rate:,.0f} img/s served against {base.rate:,.0f}: "
                                                  f"{window.describe()}")
            return [kept, *self._next(window)]
        changed = _knobs_changed(self.kept, trial)
        self.closed |= changed | (WORKERS if changed & WORKERS else set())  # threads and processes go together
        self.settings = self.kept
        short = f"{MARGIN:.0%} less" if polite else f"not {MARGIN:.0%} more"
        undone = Decision("undo", self.kept, trial, f"{window.rate:,.0f} img/s served against {base.rate:,.0f}, "
                                                    f"{short}: {window.describe()}")
        return [undone, *self._next(base)]

    def _next(self, window: Window) -> list[Decision]:
        """Try the setting the model predicts best for the stage ``window`` shows holding the
        batches back (echo last: only where no other setting gains); settle where none is
        predicted to serve MARGIN more."""
        stages, limit = estimate(window, self.kept, self.known)
        now = predict(stages, self.kept).rate
        more = replace(self.kept, prefetch=self.kept.prefetch + 1)
        # Worker processes make their batches in a ring of prefetch + 2 made when they start: a batch
        # more ahead would start them again, so only threads get one.
        if limit == "queue" and not self.kept.processes and self.bounds.allows(more) and "prefetch" not in self.closed:
            self.settings = more  # not in the model: a batch more made ahead, measured like any other change
            return [Decision("try", more, self.kept, f"{_reason(limit)}: {window.describe()}")]
        for options in self._options(stages, limit):
            open_ = [o for o in options if self.bounds.allows(o) and not _knobs_changed(self.kept, o) & self.closed]
            option = _cheapest_best(open_, stages)
            gain = PROCESS_MARGIN if option is not None and option.processes != self.kept.processes else MARGIN
            if option is not None and (rate := predict(stages, option).rate) >= (1 + gain) * now:
                self.settings = option
                return [Decision("try", option, self.kept, f"{_reason(limit)}; the model predicts {rate:,.0f} img/s "
                                                           f"against {now:,.0f}: {window.describe()}")]
        if self.settled:
            return []
        self.settled = True
        return [Decision("settle", self.kept, self.kept, f"{_reason(limit)}; nothing within the bounds is predicted to "
                                                         f"serve {MARGIN:.0%} more: {window.describe()}")]

    def _options(self, stages: Stages, limit: Limit) -> list[list[Settings]]:
        """The settings worth a trial for ``limit``, in groups tried in turn (cheapest first
        within each): the limiting stage's knobs, then echo where the loop takes more than is made."""
        kept, bounds = self.kept, self.bounds
        groups = {"none": [], "queue": [], "cpu": worker_options(bounds, kept), "gil": worker_options(bounds, kept),
                  "storage": storage_options(bounds, kept), "object store": storage_options(bounds, kept)}
        echo = [replace(kept, echo=k) for k in range(kept.echo + 1, bounds.echo[1] + 1)]
        return [groups[limit], echo if limit != "none" else []]

    def _learn(self, base: Window, window: Window, trial: Settings) -> None:
        """What a storage trial shows of the storage: reads in flight that moved no more found its
        limit; requests of another size, how fast one streams."""
        kept, known = self.kept, self.known
        before, after = base.read_bytes or base.disk_bytes, window.read_bytes or window.disk_bytes
        if not (before and after):
            return
        rate_before, rate_after = before / base.seconds, after / window.seconds
        more_in_flight = trial.reads_in_flight > kept.reads_in_flight or trial.readahead > kept.readahead
        if more_in_flight and rate_after < (1 + MARGIN) * rate_before:
            self.known = replace(known, link_bytes_per_s=max(rate_before, rate_after))
        if trial.part_bytes != kept.part_bytes and base.requests and window.requests:
            (p1, t1), (p2, t2) = ((r.read_bytes / r.requests, r.read_s / r.requests) for r in (base, window))
            if abs(p2 - p1) > 0 and (t2 - t1) / (p2 - p1) > 0:
                self.known = replace(self.known, stream_bytes_per_s=(p2 - p1) / (t2 - t1))

    def _changed(self, base: Window, window: Window) -> bool:
        """Whether the conditions moved since the baseline: other processes' cores, or the rate
        DRIFT for two windows running (the loop's pace, the data's)."""
        if self._others_moved(base, self.kept, window, self.kept):
            self._drifted = 0
            return True
        self._drifted = self._drifted + 1 if abs(window.rate - base.rate) > DRIFT * base.rate else 0
        if self._drifted >= 2:
            self._drifted = 0
            return True
        return False

    def _others_moved(self, base: Window, base_settings: Settings, window: Window, settings: Settings) -> bool:
        """Whether other processes took CORES_MOVED more or fewer cores in ``window`` (at
        ``settings``) than in ``base``, both by what they took and by what they would run (a
        trial of more threads takes cores from others whose demand is the same: still comparable)."""
        def demand(w: Window, s: Settings) -> float:
            return other_demand(self.known.cores, s.workers, w.process_cpu_s / w.seconds, w.other_cores)

        return min(abs(window.other_cores - base.other_cores),
                   abs(demand(window, settings) - demand(base, base_settings))) > CORES_MOVED

    def _back_off(self, window: Window) -> list[Decision]:
        """Where other processes take cores, try no more workers than one more than the cores they
        leave (kept if the rate holds: see the module's docstring)."""
        if window.other_cores <= SHARED_CORES:
            return []
        kept, low = self.kept, self.bounds.threads[0]
        most = math.ceil(max(0.0, self.known.cores - window.other_cores)) + 1
        if kept.workers <= most:
            return []
        if kept.processes:
            fewer = replace(kept, processes=max(self.bounds.processes[0], 2, math.ceil(most / kept.threads)))
        else:
            fewer = replace(kept, threads=max(low, most))
        if fewer == kept or not self.bounds.allows(fewer) or _knobs_changed(kept, fewer) & self.closed:
            return []
        self.settings, self.backing_off = fewer, True
        return [Decision("back off", fewer, kept, f"other processes took {window.other_cores:.1f} of "
                                                  f"{self.known.cores} cores: {window.describe()}")]


def _cheapest_best(options: list[Settings], stages: Stages) -> Settings | None:
    """The first of ``options`` (cheapest first) predicted within CLOSE_ENOUGH of the best of them."""
    rates = [predict(stages, option).rate for option in options]
    best = max(rates, default=0.0)
    return next((option for option, rate in zip(options, rates) if rate >= (1 - CLOSE_ENOUGH) * best), None)


def _reason(limit: Limit) -> str:
    return {"none": "the input keeps up with the loop", "queue": "the workers waited for batches to be queued",
            "cpu": "the cores limit", "gil": "one process's threads limit (the GIL), the cores are free",
            "storage": "reads from the disk limit", "object store": "the object store's reads in flight limit"}[limit]


WORKERS = {"threads", "processes"}
_KNOBS = ("threads", "processes", "prefetch", "readahead", "reads_in_flight", "part_bytes", "echo")


def _knobs_changed(before: Settings, after: Settings) -> set[str]:
    """The names of the knobs ``after`` sets otherwise than ``before``."""
    return {name for name in _KNOBS if getattr(before, name) != getattr(after, name)}


def _changes(before: Settings, after: Settings) -> str:
    """'threads 3 -> 2, prefetch 2 -> 3' (empty when nothing changed)."""
    return ", ".join(f"{name} {getattr(before, name)} -> {getattr(after, name)}" for name in _KNOBS
                     if getattr(before, name) != getattr(after, name))
