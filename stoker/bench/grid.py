"""bench/autotune.py's arithmetic, pure: the grid of fixed settings a scenario searches, each
configuration's runs and medians, and how the default (tuning) Loader compares with the grid's best
and median point and with today's fixed rule."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The targets of issue 43: the default Loader's warm rate against the grid's best and median point.
BEST_SHARE = 0.95
MEDIAN_GAIN = 1.3


def grid_points(axes: Mapping[str, Sequence[Any]], extra: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (name -> values), then the ``extra`` points (settings that do
    not combine with every other, such as worker processes)."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*axes.values())] + [dict(p) for p in extra]


def describe(settings: Mapping[str, Any]) -> str:
    """'threads=3 prefetch=2' (or 'defaults' for none)."""
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"


@dataclass
class Configuration:
    """One Loader configuration of a scenario and its runs' figures (each run: the JSON line of
    stoker.bench.autotune_run); ``tuning``: the Loader tunes itself (else ``tune=False`` with
    ``settings``); ``error`` when a run failed."""

    name: str
    settings: dict[str, Any]
    tuning: bool = False
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def median(self, key: str) -> float:
        values = [run[key] for run in self.runs if not math.isnan(run[key])]
        return statistics.median(values) if values else float("nan")

    @property
    def ran_with(self) -> str:
        """What the Loader ran with at the end of its last run (and its tuner's decisions, if any)."""
        if not self.runs:
            return ""
        last = self.runs[-1]
        return last["ran_with"] + (f" ({last['decisions']} decisions)" if last["decisions"] else "")


@dataclass(frozen=True)
class Summary:
    """A scenario's outcome: the default Loader against the grid's best and median point and today's rule."""

    title: str
    default: Configuration
    today: Configuration
    best: Configuration | None
    median_rate: float

    @property
    def best_share(self) -> float:
        """The default Loader's warm rate over the best grid point's."""
        return self.default.median("warm_images_per_s") / self.best.median("warm_images_per_s") if self.best else math.nan

    @property
    def median_gain(self) -> float:
        """The default Loader's warm rate over the median grid point's."""
        return self.default.median("warm_images_per_s") / self.median_rate

    @property
    def within(self) -> bool:
        """Whether the default Loader came within 5% of the grid's best (False where either failed)."""
        return self.best_share >= BEST_SHARE


def summarize(title: str, default: Configuration, today: Configuration, grid: Sequence[Configuration]) -> Summary:
    """The best and median of the grid points that ran, by median warm rate."""
    measured = [c for c in grid if not c.error and not math.isnan(c.median("warm_images_per_s"))]
    rates = [c.median("warm_images_per_s") for c in measured]
    best = max(measured, key=lambda c: c.median("warm_images_per_s"), default=None)
    return Summary(title, default, today, best, statistics.median(rates) if rates else math.nan)


def report(summary: Summary, grid: Sequence[Configuration]) -> list[str]:
    """A scenario's table (every configuration's first batch and warm rate) and its ratios."""
    lines = [summary.title, f"  {'configuration':44} {'1st batch s':>11} {'warm img/s':>10}  ran with"]
    for c in (summary.default, summary.today, *grid):
        if c.error:
            lines.append(f"  {c.name[:44]:44} failed: {c.error.strip().splitlines()[-1][:120]}")
            continue
        lines.append(f"  {c.name[:44]:44} {c.median('first_batch_s'):11.2f} {c.median('warm_images_per_s'):10,.0f}  "
                     f"{c.ran_with}")
    best = summary.best
    if best is None or summary.default.error:
        return [*lines, "  no comparison: the default Loader or every grid point failed"]
    s = summary
    return [*lines,
            f"  default / best grid point ({describe(best.settings)}): {s.best_share:.2f}x (target >= {BEST_SHARE}x)",
            f"  default / median grid point ({s.median_rate:,.0f} img/s): {s.median_gain:.2f}x (target >= {MEDIAN_GAIN}x)",
            f"  first batch: default {s.default.median('first_batch_s'):.2f} s, today's {s.today.median('first_batch_s'):.2f} s"
            " (target: no later)",
            f"  the default Loader ran with: {s.default.ran_with}; the best grid point: {describe(best.settings)} "
            f"({best.ran_with})"]


def closing_line(summaries: Sequence[Summary], scenarios: int) -> str:
    """The one line ``--quick`` ends with."""
    return f"autotune: {sum(s.within for s in summaries)} of {scenarios} scenarios within 5% of the grid's best"
