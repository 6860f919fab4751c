"""The default stoker.Loader, which tunes itself while it runs, against a grid search of the fixed
settings in the same run, in six scenarios on this machine (issue 43):

    a  fast local disk (page cache warm)
    b  a spinning disk: ../shared/hdd-profile (150 IOPS, 150 MiB/s), the shards evicted before each run
    c  an S3 server (moto) through ShapedLink at 20 ms per request, uncapped
    d  the same, each response held to --stream-mbit (a store's per-connection rate)
    e  the standard train Compose as the Loader's transform (CPU bound; torchvision: --tv-python)
    f  fast local disk, another process spinning on one core from half-way through each run

Each Loader configuration (the default Loader; today's fixed rule, ``tune=False``; each grid point,
``tune=False`` with its threads / processes / prefetch / reads in flight) runs in a fresh process
(stoker.bench.autotune_run), configurations interleaved round by round, every other round in
reverse order, after one untimed run (no configuration always runs first). Per scenario: the default
Loader's warm rate (img/s after the first seconds of a run) against the best grid point (target >=
0.95x) and the median one (target >= 1.3x), its first batch against today's (no later), and the
settings it ran with beside the best point's. The data (sample photos packed into 16 MiB shards,
moto's cost per ranged GET grows with the object) is made once under --data.

    .venv/bin/python bench/autotune.py [--only a,c] [--repeat 3]   # 4,000 photos, runs of 14 s: ~45 min
    .venv/bin/python bench/autotune.py --quick     # 1,000 photos, runs of 4 s, one round: ~5 min

``--quick`` ends with one line: ``autotune: K of 6 scenarios within 5% of the grid's best``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stoker.bench.autotune_run import Spec
from stoker.bench.grid import Configuration, Summary, closing_line, describe, grid_points, report, summarize
from stoker.bench.link_process import start_link_process
from stoker.bench.measure import CommandFailed, measure
from stoker.ranges import BENCH_REPEAT, BENCH_STREAM_MBIT
from stoker.storage import evict

from _common import header, packed_photos

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.s3server import S3Server  # noqa: E402 -- the tests' moto server, started the same way

SHARD_BYTES = 16 << 20
CORES = len(os.sched_getaffinity(0))
# Options of the ShardDataset; every other setting is the Loader's.
DATASET_OPTIONS = {"reads_in_flight"}
# What every configuration but the default Loader adds: the Loader's fixed settings, no tuning.
FIXED = {"tune": False}


@dataclass(frozen=True)
class Scenario:
    """One scenario: where the data is, what runs on it, and the grid of fixed settings (``quick``: the short form's)."""

    key: str
    title: str
    axes: dict[str, list[Any]]
    quick: dict[str, list[Any]]
    extra: list[dict[str, Any]] = field(default_factory=list)
    remote: dict[str, float] | None = None  # the link's shaping: delay, stream_rate
    hdd: bool = False
    pipeline: str | None = None
    busy: bool = False


def scenarios(stream_mbit: float) -> list[Scenario]:
    """The six scenarios, their grids sized to this machine's cores."""
    threads = [1, CORES, CORES + 1, 2 * CORES + 2]
    few = [1, CORES + 1, 2 * CORES + 2]
    in_flight = {"reads_in_flight": [1, 2, 4, 8, 16, 32]}
    return [
        Scenario("a", "a. fast local disk, page cache warm", {"threads": threads, "prefetch": [1, 4]}, {"threads": few},
                 [{"processes": CORES, "threads": 1}]),
        Scenario("b", "b. spinning disk (hdd-profile: 150 IOPS, 150 MiB/s), shards evicted before each run",
                 {"threads": few, "prefetch": [2, 8]},
                 {"threads": [1, CORES + 1], "prefetch": [2, 8]}, hdd=True),
        Scenario("c", "c. S3 (moto) through ShapedLink at 20 ms per request, uncapped", in_flight,
                 {"reads_in_flight": [1, 4, 16]}, remote={"delay": 0.02}),
        Scenario("d", f"d. the same, each response held to {stream_mbit:,.0f} Mbit/s", in_flight,
                 {"reads_in_flight": [1, 4, 16]}, remote={"delay": 0.02, "stream_rate": stream_mbit * 1e6 / 8}),
        Scenario("e", "e. the standard train Compose as the Loader's transform (CPU bound)", {"threads": threads},
                 {"threads": few}, [{"processes": CORES, "threads": 1}], pipeline="train"),
        Scenario("f", "f. fast local disk, another process taking one core half-way through each run",
                 {"threads": threads}, {"threads": [1, CORES, CORES + 1]}, busy=True)]


@dataclass(frozen=True)
class Bed:
    """What the runs share: the shards on disk, the S3 server holding them, the Pythons, the timings."""

    shards: Path
    server: S3Server | None
    python: str
    tv_python: str
    hdd_profile: Path
    seconds: float
    warm_after: float
    work: Path


def spec_for(bed: Bed, scenario: Scenario, configuration: Configuration, url: str | None) -> Spec:
    """The run of ``configuration`` in ``scenario``."""
    settings = configuration.settings
    dataset = {k: v for k, v in settings.items() if k in DATASET_OPTIONS}
    loader = {k: v for k, v in settings.items() if k not in DATASET_OPTIONS} | ({} if configuration.tuning else FIXED)
    spec = Spec(str(bed.shards), loader=loader, dataset=dataset, pipeline=scenario.pipeline, seconds=bed.seconds,
                warm_after=bed.warm_after)
    if url is not None and bed.server is not None:
        client = {**bed.server.options["client_kwargs"], "endpoint_url": url}
        spec = replace(spec, data="s3://data/ds", storage_options={**bed.server.options, "client_kwargs": client})
    if scenario.busy:  # measured from when the other process starts, a little after it settles
        spec = replace(spec, hog_at=bed.seconds / 2, warm_after=bed.seconds / 2 + (bed.seconds - bed.warm_after) / 4)
    return spec


def child_env(bed: Bed) -> dict[str, str]:
    """The runs' environment: this tree's stoker first; the object store's metadata fetched anew by each run."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "XDG_CACHE_HOME": str(bed.work / "xdg")}


def prime(bed: Bed, scenario: Scenario) -> None:
    """Import what a run imports, once and untimed: the first process of a Python reads its files
    cold, which would count against whichever configuration runs first."""
    modules = "stoker.bench.autotune_run, stoker.loader" + (", stoker.bench.pipelines" if scenario.pipeline else "")
    subprocess.run([python_of(bed, scenario), "-c", f"import {modules}"], check=True, env=child_env(bed))


def python_of(bed: Bed, scenario: Scenario) -> str:
    return bed.tv_python if scenario.pipeline else bed.python


def run_once(bed: Bed, scenario: Scenario, spec: Spec) -> dict[str, Any]:
    """One configuration in a fresh process: its JSON line."""
    command = [python_of(bed, scenario), "-m", "stoker.bench.autotune_run", spec.to_json()]
    env = child_env(bed)
    shutil.rmtree(bed.work / "xdg", ignore_errors=True)
    if scenario.hdd:
        evict(bed.shards.iterdir())
        command = [str(bed.hdd_profile), "--warm", "--", *command]  # --warm: only the shards were evicted
    elif scenario.remote is None:
        for path in bed.shards.iterdir():
            path.read_bytes()  # page cache warm
    return measure(command, timeout=bed.seconds * 10 + 120, env=env).reports[-1]


@contextmanager
def s3_holding(shards: Path, work: Path) -> Iterator[S3Server]:
    """A moto S3 server holding the shards at s3://data/ds."""
    server = S3Server(work / "requests.log")
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        yield server
    finally:
        server.stop()


@contextmanager
def link_for(bed: Bed, scenario: Scenario) -> Iterator[str | None]:
    """The shaped link in front of the S3 server for a remote scenario (its URL), else None."""
    if scenario.remote is None or bed.server is None:
        yield None
        return
    link = start_link_process(bed.server.port, **scenario.remote)
    try:
        yield link.url
    finally:
        link.close()


def run_scenario(bed: Bed, scenario: Scenario, quick: bool, repeat: int) -> tuple[Summary, list[Configuration]]:
    """The default Loader, today's rule and every grid point, ``repeat`` rounds interleaved, every
    other round in reverse order, so that no configuration always runs first in a round (where a
    run pays whatever the machine does between rounds), after one untimed run of today's rule."""
    default = Configuration("default Loader (tuning)", {}, tuning=True)
    today = Configuration("today's fixed rule (tune=False)", {})
    points = grid_points(scenario.quick if quick else scenario.axes, () if quick else scenario.extra)
    grid = [Configuration(f"grid: {describe(p)}", p) for p in points]
    prime(bed, scenario)
    with link_for(bed, scenario) as url:
        # untimed: the first run against a fresh link and store (connections, moto's first answers)
        # would count against whichever configuration runs first (measured: 1.34 s to the first batch
        # against 0.89 s in --quick's scenario c, the default's rate 0.78x against 1.03x)
        run_once(bed, scenario, spec_for(bed, scenario, today, url))
        for round_ in range(repeat):
            order = [default, today, *grid]
            for c in order if round_ % 2 == 0 else order[::-1]:
                if c.error:
                    continue
                try:
                    c.runs.append(run_once(bed, scenario, spec_for(bed, scenario, c, url)))
                except (CommandFailed, OSError, IndexError) as e:
                    c.error = str(e) or type(e).__name__
                print(f"{scenario.key} round {round_ + 1}/{repeat} {c.name}: "
                      + (f"failed: {c.error.strip().splitlines()[-1][:200]}" if c.error else
                         f"{c.runs[-1]['warm_images_per_s']:,.0f} img/s warm"), file=sys.stderr, flush=True)
    return summarize(scenario.title, default, today, grid), grid


def hdd_refusal(hdd_profile: Path) -> str | None:
    """Why the HDD scenario cannot run here (None: it can): hdd-profile missing, or not usable."""
    if not hdd_profile.is_file():
        return f"{hdd_profile} not found (pass --hdd-profile)"
    done = subprocess.run([str(hdd_profile), "--warm", "--", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 photos, runs of 4 s, one round, smaller grids")
    parser.add_argument("--data", type=Path, default=Path("bench-data/autotune"))
    parser.add_argument("--only", default="abcdef", help="scenarios to run, e.g. 'a,c'")
    parser.add_argument("--repeat", type=BENCH_REPEAT.argument(), default=None, help="rounds (default 3; --quick: 1)")
    parser.add_argument("--stream-mbit", type=BENCH_STREAM_MBIT.argument(), default=400.0,
                        help="scenario d's per-response rate")
    parser.add_argument("--hdd-profile", type=Path, default=ROOT.parent / "shared" / "hdd-profile")
    parser.add_argument("--tv-python", default=str(ROOT / ".venv-tv" / "bin" / "python"),
                        help="a Python with torchvision, for scenario e")
    args = parser.parse_args()
    if not args.only.strip(",") or set(args.only) - set("abcdef,"):
        parser.error(f"--only: scenarios are letters a to f, e.g. 'a,c'; got {args.only!r}")
    header("autotune: the default Loader against a grid of fixed settings" + (" (--quick)" if args.quick else ""))
    count, seconds, warm_after = (1000, 4.0, 2.0) if args.quick else (4000, 14.0, 6.0)
    repeat = args.repeat or (1 if args.quick else 3)
    data = args.data / "quick" if args.quick else args.data
    chosen = [s for s in scenarios(args.stream_mbit) if s.key in args.only]
    shards = packed_photos(data, count, SHARD_BYTES)
    print(f"data: {count:,} sample photos in {len(list(shards.glob('*.tar')))} shards of {SHARD_BYTES >> 20} MiB; "
          f"runs of {seconds:.0f} s (warm: after {warm_after:.0f} s), {repeat} round(s), {CORES} cores")
    refusal = hdd_refusal(args.hdd_profile) if any(s.hdd for s in chosen) else None
    summaries: list[Summary] = []
    with tempfile.TemporaryDirectory(prefix="stoker-autotune-") as work:
        with s3_holding(shards, Path(work)) if any(s.remote for s in chosen) else nullcontext() as server:
            bed = Bed(shards, server, sys.executable, args.tv_python, args.hdd_profile, seconds, warm_after, Path(work))
            for scenario in chosen:
                print()
                if scenario.hdd and refusal:
                    print(f"{scenario.title}\n  not run: {refusal}")
                    continue
                if scenario.pipeline and not Path(args.tv_python).is_file():
                    print(f"{scenario.title}\n  not run: no Python with torchvision at {args.tv_python} (--tv-python)")
                    continue
                summary, grid = run_scenario(bed, scenario, args.quick, repeat)
                summaries.append(summary)
                print("\n".join(report(summary, grid)), flush=True)
    print()
    print(closing_line(summaries, len(chosen)))


if __name__ == "__main__":
    main()
