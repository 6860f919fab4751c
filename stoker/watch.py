"""stoker.watch: watch a training loop: per step, how long it waited for data and how long the step itself took.

    for images, labels in stoker.watch(loader, every=100, log=print):
        ...   # every 100 steps: "stoker.watch: steps 101-200: data wait 37.2% (...), 2 stalls > 100 ms ..."

``wait`` is the time inside ``next()`` of the wrapped iterator (for the first batch of a pass,
``iter()`` too: a DataLoader starts its workers there); ``step`` is the time from handing the batch
over until the loop asks for the next one. Per step only three floats are stored, in numpy arrays
of one log window (24 bytes x ``every``); closed windows fold into running totals, so memory stays
bounded however long the run. The full per-step record goes to the optional ``timeline`` file.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import numpy as np

from stoker.echo.examples import examples_in
from stoker.state import COUNT, SECONDS, StateError, Stateful, checked, load_state_of, read_state, record, set_epoch_of, state_of

T = TypeVar("T")

_ROW = {
    ".csv": "{},{:.6f},{:.6f},{:.6f}\n",
    ".jsonl": '{{"step": {}, "start": {:.6f}, "wait_s": {:.6f}, "step_s": {:.6f}}}\n',
}
_HEADER = {".csv": "step,start,wait_s,step_s\n", ".jsonl": ""}


@dataclass(frozen=True)
class WatchSummary:
    """Totals over the steps watched so far; ``data_wait_fraction`` is wait / (wait + step)."""

    steps: int
    wait_s: float
    step_s: float
    data_wait_fraction: float
    batches_per_s: float
    stalls: int
    max_wait_s: float


# The totals a state holds that the others are computed from, in _summary's order, and their ranges.
_SAVED_TOTALS = ("steps", "wait_s", "step_s", "stalls", "max_wait_s")
_TOTAL_RANGES = {"steps": COUNT, "wait_s": SECONDS, "step_s": SECONDS, "stalls": COUNT, "max_wait_s": SECONDS}


def _summary(steps: int, wait_s: float, step_s: float, stalls: int, max_wait_s: float) -> WatchSummary:
    total = wait_s + step_s
    return WatchSummary(steps, wait_s, step_s, wait_s / total if total else 0.0, steps / total if total else 0.0,
                        stalls, max_wait_s)


def _plus(a: WatchSummary, b: WatchSummary) -> WatchSummary:
    return _summary(a.steps + b.steps, a.wait_s + b.wait_s, a.step_s + b.step_s, a.stalls + b.stalls,
                    max(a.max_wait_s, b.max_wait_s))


class Watched(Generic[T]):
    """An iterable that yields ``loader``'s batches unchanged and times each step; see :func:`watch`.

    Steps are numbered from 1 and keep counting over repeated passes (epochs), as do the totals
    and the log windows. One pass at a time: iterating the same object in two loops at once mixes
    their steps.
    """

    def __init__(self, loader: Iterable[T], every: int, stall: float, timeline: Path | None,
                 log: Callable[[str], None]) -> None:
        self.loader = loader
        self._every, self._stall, self._log = every, stall, log
        self._timeline = timeline
        self._file: IO[str] | None = None
        self._created = False  # the timeline file exists (later passes append to it)
        self._t0 = time.perf_counter()
        # The current window: steps _first .. _first + _n - 1; rows [:_written] are in the file already.
        self._start, self._wait, self._step = (np.zeros(every) for _ in range(3))
        self._first, self._n, self._written = 1, 0, 0
        self._done = _summary(0, 0.0, 0.0, 0, 0.0)  # every closed window, folded
        # Examples handed over in this pass: a DataLoader's sampler needs them for its state.
        self._count_examples = not isinstance(loader, Stateful)
        self._examples_in_pass = 0

    def __len__(self) -> int:
        """The wrapped loader's length (TypeError if it has none)."""
        if not isinstance(self.loader, Sized):
            raise TypeError(f"object of type {type(self.loader).__name__!r} has no len()")
        return len(self.loader)

    def __iter__(self) -> Iterator[T]:
        return self._run()

    def set_epoch(self, epoch: int) -> None:
        """Passed on to the wrapped loader (or a DataLoader's sampler)."""
        set_epoch_of(self.loader, epoch)
        self._examples_in_pass = 0

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state (for a DataLoader, its sampler's after the batches handed
        over), and the totals so far, so that a resumed run goes on counting steps."""
        return record("Watched", loader=state_of(self.loader, self._examples_in_pass), totals=asdict(self.summary()))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the wrapped loader, and the step count and totals, from a :meth:`state_dict`.
        Another part's state, or totals out of range, are refused (StateError) before anything is
        loaded; a state saved by the previous format (no record tag) is taken, checked. The derived
        totals (fraction, rate) are computed again from the counts and times."""
        saved = read_state(state, "Watched", ("loader", "totals"), version_1=True)
        totals = saved["totals"]
        if not isinstance(totals, dict) or any(name not in totals for name in _SAVED_TOTALS):
            raise StateError(f"stoker.watch cannot load this state: totals={totals!r} must hold {', '.join(_SAVED_TOTALS)}")
        done = _summary(*(checked("Watched", f"totals.{name}", totals[name], _TOTAL_RANGES[name]) for name in _SAVED_TOTALS))
        load_state_of(self.loader, saved["loader"])
        self._done = done
        self._first, self._n, self._written = self._done.steps + 1, 0, 0
        self._examples_in_pass = 0

    def summary(self) -> WatchSummary:
        """Totals over every step so far, the current unfinished window included."""
        return _plus(self._done, self._window(self._n))

    def _run(self) -> Iterator[T]:
        """One pass. The step of the last batch ends when the loop asks again, breaks or raises."""
        clock = time.perf_counter
        asked = clock()
        self._examples_in_pass = 0
        try:
            for batch in self.loader:
                if self._count_examples:
                    self._examples_in_pass += examples_in(batch)
                handed = clock()
                try:
                    yield batch
                finally:  # resumed, or closed by break / an exception in the loop / garbage collection
                    self._record(asked, handed, clock())
                asked = clock()  # after recording, so a window's logging and writing is not counted as a wait
        finally:
            self._write()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _record(self, asked: float, handed: float, back: float) -> None:
        i = self._n
        self._start[i] = asked - self._t0
        self._wait[i] = handed - asked
        self._step[i] = back - handed
        self._n = i + 1
        if self._n == self._every:
            self._close_window()

    def _window(self, n: int) -> WatchSummary:
        wait = self._wait[:n]
        return _summary(n, float(wait.sum()), float(self._step[:n].sum()), int(np.count_nonzero(wait > self._stall)),
                        float(wait.max()) if n else 0.0)

    def _close_window(self) -> None:
        """Log the full window, fold it into the totals, write its rows, start the next one."""
        n, first = self._n, self._first
        s = self._window(n)
        ms = 1e3 / n
        self._log(f"stoker.watch: steps {first}-{first + n - 1}: data wait {100 * s.data_wait_fraction:.1f}% "
                  f"({s.wait_s * ms:.1f} ms/step of {(s.wait_s + s.step_s) * ms:.1f}), {s.batches_per_s:.1f} batches/s, "
                  f"{s.stalls} stall{'' if s.stalls == 1 else 's'} > {self._stall * 1e3:g} ms "
                  f"(max {s.max_wait_s * 1e3:.0f} ms at step {first + int(self._wait[:n].argmax())})"
                  + (f"; {text}" if (text := self._note()) else ""))
        self._done = _plus(self._done, s)
        self._write()
        self._first, self._n, self._written = first + n, 0, 0

    def _note(self) -> str:
        """The wrapped loader's own line (echoes, skipped samples), if it has one."""
        note = getattr(self.loader, "watch_note", None)
        return note() if note is not None else ""

    def _write(self) -> None:
        """Append the window's rows not yet in the timeline file, and flush them."""
        if self._timeline is None or self._written == self._n:
            return
        if self._file is None:
            self._file = open(self._timeline, "a" if self._created else "w", encoding="utf-8")
            if not self._created:
                self._file.write(_HEADER[self._timeline.suffix])
            self._created = True
        lo, hi = self._written, self._n
        row = _ROW[self._timeline.suffix]
        columns = zip(self._start[lo:hi].tolist(), self._wait[lo:hi].tolist(), self._step[lo:hi].tolist())
        self._file.write("".join(row.format(self._first + lo + k, *r) for k, r in enumerate(columns)))
        self._file.flush()
        self._written = hi


def watch(loader: Iterable[T], every: int = 100, *, stall: float = 0.1, timeline: str | os.PathLike | None = None,
          log: Callable[[str], None] | None = None) -> Watched[T]:
    """Wrap ``loader`` so a training loop reports how much of its time goes to waiting for data.

    Every ``every`` steps one line goes to ``log`` (default: logger "stoker.watch" at INFO; pass
    ``print`` to see it without configuring logging): the share of time spent waiting, ms per
    step, batches/s, and the waits longer than ``stall`` seconds, plus the wrapped loader's own
    ``watch_note()`` when it has one (:func:`stoker.echo` reports its echoes so, stoker.Loader its
    tuner's decisions). ``timeline`` (.csv or .jsonl)
    receives one row per step: step, start (s since this call), wait_s, step_s; it is
    flushed every window and completed when the loop ends, breaks or raises.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if stall < 0:
        raise ValueError(f"stall must be >= 0 seconds, got {stall}")
    path = None
    if timeline is not None:
        path = Path(timeline)
        if path.suffix not in _ROW:
            raise ValueError(f"timeline {str(path)!r}: expected a path ending in .csv or .jsonl")
    return Watched(loader, every, stall, path, log or logging.getLogger("stoker.watch").info)
