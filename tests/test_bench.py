"""stoker bench: the measuring of a fresh process, and one small real run of the loader benchmark."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from stoker.bench.autotune_run import Spec, warm_rate
from stoker.bench.grid import Configuration, closing_line, grid_points, summarize
from stoker.bench.grid import report as grid_report
from stoker.bench.loader import Reader, Row, refuse_if_busy, report, restart_readers
from stoker.bench.measure import CommandFailed, measure
from stoker.bench.pack_rate import measure_packs, pack_report
from stoker.cli import main

# A parent that allocates 60 MB and a child that allocates 40 MB, both touched, then reports.
_TREE = """
import json, subprocess, sys, time
parent = bytearray(60 << 20)
child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(40 << 20); time.sleep(1.0)"])
sum(range(3_000_000))
child.wait()
print(json.dumps({"epoch": 0, "images": 10}))
"""


def test_measure_counts_the_whole_process_tree():
    result = measure([sys.executable, "-c", _TREE])
    assert result.reports == [{"epoch": 0, "images": 10}]
    assert result.peak_pss_bytes > 100e6  # parent and child together
    assert 0.05 < result.cpu_seconds < result.wall_seconds * 2


def test_a_failing_command_reports_its_error():
    with pytest.raises(CommandFailed, match="ZeroDivisionError"):
        measure([sys.executable, "-c", "1 / 0"])


def test_report_states_the_ratios_the_targets_use():
    def row(key, name, warm, pss):
        r = Row(Reader(key, name, "x.py"))
        r.first_epoch, r.warm_epoch, r.cpu_per_1000, r.peak_pss_mb, r.first_batch = [warm], [warm], [1.0], [pss], [0.3]
        return r

    text = report([row("stoker", "stoker.Loader", 2000, 200), row("limit", "limit: 2 threads", 2500, 100),
                   row("loose2", "DataLoader, loose files + Pillow, 2 workers", 1000, 500),
                   row("ffcv", "peer: ffcv", 1500, 300),
                   row("stoker-noext", "stoker.Loader, no region decode (simplejpeg)", 1750, 200)], cores=2)
    assert "2.00x (target >= 1.8x); peak PSS 40% of it" in text
    assert "stoker.Loader / ffcv: 1.33x" in text
    assert "stoker.Loader / limit: 80%" in text
    assert "stoker.Loader without / with its region-decode extension: 88%" in text


def test_restart_rows_rows_are_compared_with_the_limit_and_the_byte_exact_pack(photos, tmp_path):
    def row(reader, warm):
        r = Row(reader)
        r.first_epoch, r.warm_epoch, r.cpu_per_1000, r.peak_pss_mb, r.first_batch = [warm], [warm], [1.0], [300], [0.3]
        return r

    rst, rst160 = restart_readers(tmp_path)
    text = report([row(Reader("stoker", "stoker.Loader", "x.py"), 2000), row(Reader("limit", "limit: 2", "x.py"), 2500),
                   row(rst, 3000), row(rst160, 3750)], cores=2)
    assert "stoker.Loader, --restart-rows pack / limit: 1.20x (target >= 1.25x)" in text
    assert "stoker.Loader, --restart-rows pack / the same on the byte-exact pack: 1.50x (target >= 1.15x)" in text
    assert "stoker.Loader, 160 px, --restart-rows pack / limit: 1.50x (target >= 1.4x)" in text
    packs = measure_packs(photos, tmp_path / "packs", workers=2, repeat=1, cold=True)
    assert [len(p.rates) for p in packs] == [1, 1] and all(p.rates[0] > 0 for p in packs)
    assert 1.0 < packs[1].sizes[0] / packs[0].sizes[0] <= 1.02 and not (tmp_path / "packs" / "exact").exists()
    assert "pack --restart-rows / byte-exact: rate " in pack_report(packs, 2)


def test_bench_loader_runs_end_to_end_on_a_cold_cache(tmp_path, capsys):
    status = main(["bench", "loader", "--data", str(tmp_path), "--count", "48", "--batch", "16", "--repeat", "1",
                   "--only", "stoker,stoker-noext,loose0", "--cold", "--force"])
    out = capsys.readouterr().out
    assert status == 0
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    for name in ("stoker.Loader", "stoker.Loader, no region decode (simplejpeg)", "DataLoader, loose files + Pillow, 0 workers"):
        values = lines[name].split()[-5:]
        assert all(float(v) > 0 for v in values), lines[name]
    disk = lines["disk: shards read sequentially (cat)"].split()[-5:]
    assert float(disk[0]) > 0 and float(disk[1]) > 0  # its first "batch" (a shard) may round to 0.00 s
    assert "stoker.Loader / best DataLoader over loose files" in out
    assert "stoker.Loader cold first epoch: " in out


def test_the_benchmark_refuses_to_run_on_a_busy_machine():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with pytest.raises(SystemExit, match="refusing to report noise"):
            refuse_if_busy(force=False)
    finally:
        spinner.kill()
        spinner.wait()


def test_a_grid_is_every_combination_and_the_default_loader_is_judged_against_its_best_and_median():
    points = grid_points({"threads": [1, 3], "prefetch": [2, 4]}, [{"processes": 2, "threads": 1}])
    assert points == [{"threads": 1, "prefetch": 2}, {"threads": 1, "prefetch": 4}, {"threads": 3, "prefetch": 2},
                      {"threads": 3, "prefetch": 4}, {"processes": 2, "threads": 1}]

    def configuration(name, settings, *warm, first=0.3, ran_with="3 threads, prefetch 2", decisions=0):
        runs = [{"first_batch_s": first, "warm_images_per_s": w, "ran_with": ran_with, "decisions": decisions}
                for w in warm]
        return Configuration(name, settings, runs=runs)

    grid = [configuration("slow", {"threads": 1}, 400.0, 500.0, 600.0),  # median 500
            configuration("mid", {"threads": 2}, 700.0),
            configuration("best", {"threads": 3}, 1000.0, float("nan")),  # a run with no warm batch is left out
            Configuration("broken", {"threads": 9}, error="exit status 1: OptionError: threads ...")]
    today = configuration("today", {}, 800.0, first=0.5)
    default = configuration("default", {}, 960.0, first=0.4, ran_with="2 threads, prefetch 4, ...", decisions=3)
    summary = summarize("a. fast local disk", default, today, grid)
    assert summary.best is grid[2] and summary.median_rate == 700.0
    assert summary.best_share == pytest.approx(0.96) and summary.within
    assert summary.median_gain == pytest.approx(960 / 700)
    text = "\n".join(grid_report(summary, grid))
    assert "default / best grid point (threads=3): 0.96x (target >= 0.95x)" in text
    assert "first batch: default 0.40 s, today's 0.50 s (target: no later)" in text
    assert "the default Loader ran with: 2 threads, prefetch 4, ... (3 decisions); the best grid point: threads=3 " \
           "(3 threads, prefetch 2)" in text
    assert "broken" in text and "failed: exit status 1" in text
    behind = summarize("b", configuration("default", {}, 900.0), today, grid)
    assert not behind.within
    failed = summarize("c", Configuration("default", {}, error="killed"), today, grid)
    assert not failed.within and "no comparison" in grid_report(failed, grid)[-1]
    assert closing_line([summary, behind, failed], 6) == "autotune: 1 of 6 scenarios within 5% of the grid's best"


def test_the_warm_rate_counts_the_batches_after_the_warm_up():
    ends = [(1.0, 10), (2.0, 10), (3.0, 10), (5.0, 10)]
    assert warm_rate(ends, 2.5) == pytest.approx(20 / 3.0)  # from the end of the batch at 2.0 s
    assert warm_rate(ends, 0.5) == pytest.approx(30 / 4.0)  # the first batch came later: from its end
    assert math.isnan(warm_rate(ends, 6.0))


def test_one_autotune_configuration_runs_in_a_fresh_process(packed):
    """bench/autotune.py's runner: a Loader of the given settings reads for the given seconds and
    says what it delivered and ran with, as one JSON line."""
    spec = Spec(str(packed), loader={"threads": 2, "prefetch": 1, "tune": False}, batch=8, seconds=1.0, warm_after=0.3)
    out = measure([sys.executable, "-m", "stoker.bench.autotune_run", spec.to_json()]).reports[-1]
    assert out["ran_with"] == "2 threads, prefetch 1" and out["decisions"] == 0
    assert out["images"] >= 8 and out["seconds"] >= 1.0 and out["first_batch_s"] > 0
    assert out["warm_images_per_s"] > 0
