"""Overhead of stoker.watch at 10 ms steps: the same loop bare, wrapped, and wrapped with a timeline file.

Each run iterates a trivial generator for --steps steps; the loop body busy-waits exactly --step-ms
from its own start, so a run lasts steps x step-ms plus whatever the iteration adds. Runs alternate
bare, watch, watch+timeline, bare, ... (A-B-A-B), medians of --repeat. Target: overhead < 1%.
Run by hand, no GPU needed:

    .venv/bin/python bench/watch.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from stoker.watch import watch

from _common import header, med, median_runs


def batches(n: int) -> Iterator[int]:
    """The trivial generator being watched: no data work at all, so only watch's cost shows."""
    yield from range(n)


def timed_loop(make: Callable[[], Iterable[int]], step_s: float) -> float:
    """Seconds for one pass over ``make()`` whose body busy-waits ``step_s`` per batch."""
    clock = time.perf_counter
    start = clock()
    for _ in make():
        end = clock() + step_s
        while clock() < end:
            pass
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--every", type=int, default=100, help="watch's log window")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    header(f"stoker.watch overhead: {args.steps} steps of {args.step_ms:g} ms, medians of {args.repeat}")
    step_s = args.step_ms / 1e3
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        timeline = Path(tmp) / "timeline.csv"
        runs = {
            "bare": lambda: timed_loop(lambda: batches(args.steps), step_s),
            "watch": lambda: timed_loop(lambda: watch(batches(args.steps), args.every, log=lines.append), step_s),
            "watch+timeline": lambda: timed_loop(
                lambda: watch(batches(args.steps), args.every, timeline=timeline, log=lines.append), step_s),
        }
        results = median_runs(runs, args.repeat)
        rows = len(timeline.read_text().splitlines()) - 1
    bare = med(results["bare"])
    print(f"{'run':<16}{'median s':>10}{'overhead':>12}   runs (s)")
    for name, times in results.items():
        overhead = (med(times) / bare - 1) * 100
        print(f"{name:<16}{med(times):>10.4f}{overhead:>+11.3f}%   {' '.join(f'{t:.4f}' for t in times)}")
    worst = max((med(t) / bare - 1) * 100 for t in results.values())
    print(f"overhead: {worst:+.3f}% (worst of watch, watch+timeline); target < 1%: {'met' if worst < 1 else 'NOT met'}")
    print(f"worst added per step: {(max(med(t) for t in results.values()) - bare) / args.steps * 1e6:+.2f} us; "
          f"log lines per run: {len(lines) // args.repeat // 2}; timeline rows: {rows}")
    print(f"last log line: {lines[-1]}")


if __name__ == "__main__":
    main()
