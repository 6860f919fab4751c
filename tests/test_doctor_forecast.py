"""stoker doctor's forecast of the Loader that tunes itself: stoker.tune's pipeline model given the
doctor's figures says the rate a default Loader would reach and what its tuner would choose. Pure:
given figures, no files, no timing."""

from __future__ import annotations

import json

import jsonschema
import pytest

from stoker.doctor.figures import Figures, LoaderRun, ObjectStore
from stoker.doctor.forecast import forecast
from stoker.doctor.report import SCHEMA_PATH, DoctorReport
from stoker.doctor.verdict import diagnose

# 8 cores; stoker.Loader on the sample pack made 3,000 img/s on 9 threads that kept 8 cores busy.
LOADER = LoaderRun(rate=3000.0, threads=9, cores_used=8.0)


def figures(**changes) -> Figures:
    base = dict(source="/data/train", loose=False, cores=8, batch_size=256, size=224, step_time=None,
                storage_rate=20_000.0, storage_concurrency=8, sequential_rate=20_000.0, decode_per_core=600.0,
                jpeg_share=1.0, transform_per_core=900.0, loader_rate=2500.0, loader_workers=8, megapixels=0.19,
                dataset_bytes=140e9, available_ram_bytes=64e9, mean_bytes=110e3, stoker_loader=3000.0,
                storage_latency_s=0.005, loader_run=LOADER)
    return Figures(**{**base, **changes})


def store(first_byte_ms: float, one_request_mb_per_s: float, link_mb_per_s: float) -> ObjectStore:
    """An object store's figures, its most MB/s given as img/s of 110 KB images."""
    return ObjectStore(rate=link_mb_per_s * 1e6 / 110e3, in_flight=16, read_bytes=8 << 20, first_byte_ms=first_byte_ms,
                       one_request_mb_per_s=one_request_mb_per_s, cache=None)


def verdict_schema() -> dict:
    schema = json.loads(SCHEMA_PATH.read_text())
    return {"$defs": schema["$defs"], **schema["properties"]["verdict"]}


def test_a_cpu_bound_loader_is_forecast_at_its_cores_rate_on_no_more_threads_than_cores():
    """375 img/s per CPU second on 8 free cores: 3,000 img/s, the cores the limit; the tuner takes
    the fewest threads that give it (8), not today's 9."""
    ahead = forecast(figures())
    assert ahead is not None
    assert ahead.prediction.rate == pytest.approx(3000.0)
    assert ahead.prediction.bottleneck == "cpu"
    assert (ahead.settings.threads, ahead.settings.processes) == (8, 0)
    assert ahead.stages.per_core == pytest.approx(375.0)
    assert ahead.alone is None  # no other process took the cores
    verdict = diagnose(figures())
    assert verdict.tuner == ahead
    jsonschema.validate(verdict.to_dict(), verdict_schema())
    assert verdict.to_dict()["tuner"]["settings"]["threads"] == 8


def test_a_loader_held_by_the_gil_is_forecast_in_worker_processes():
    """Threads that kept 2 of 8 cores busy on data in memory were held by the GIL at 1,000 img/s:
    the tuner moves to worker processes, each with a GIL of its own, and beats that rate."""
    held = forecast(figures(loader_run=LoaderRun(rate=1000.0, threads=9, cores_used=2.0)))
    assert held is not None
    assert held.stages.gil_rate == 1000.0 and "at most 1,000 img/s" in held.measured["gil"]
    assert held.settings.processes >= 2
    assert held.prediction.rate > 1000.0
    free = forecast(figures())
    assert free is not None and free.stages.gil_rate == float("inf")


def test_the_training_loop_that_takes_less_gets_the_fewest_threads_that_serve_it():
    """At 1,280 img/s (256 per 200 ms step) 4 threads serve the loop: the tuner takes no more."""
    slow = forecast(figures(step_time=0.2))
    assert slow is not None
    assert slow.prediction.bottleneck == "none" and slow.prediction.rate == pytest.approx(1280.0)
    assert slow.settings.threads == 4  # 4 x 375 = 1,500 >= 1,280; 3 x 375 = 1,125 is not


def test_cores_other_processes_took_are_left_to_them_and_the_machine_alone_said_apart():
    shared = forecast(figures(loader_run=LoaderRun(rate=1875.0, threads=9, cores_used=5.0, other_cores=3.0)))
    assert shared is not None
    assert shared.prediction.rate == pytest.approx(1875.0)  # 5 free cores x 375
    assert shared.settings.threads == 5
    assert shared.alone is not None
    settings, alone = shared.alone
    assert alone.rate == pytest.approx(3000.0) and settings.threads == 8
    text = "\n".join(shared.lines())
    assert "alone on the 8 cores (others took 3.0" in text and "~3,000 img/s" in text


def test_a_slow_disk_is_the_limit_whatever_the_threads():
    """The disk gives 1,000 img/s read front to back, a third of what the cores make: the forecast
    says the disk is the limit, whatever the tuner does with the threads."""
    disk = forecast(figures(sequential_rate=1000.0, storage_rate=1000.0))
    assert disk is not None
    assert disk.prediction.bottleneck == "storage" and disk.prediction.rate == pytest.approx(1000.0, rel=0.02)
    assert disk.prediction.rates["cpu"] > 2 * disk.prediction.rate
    assert "first byte after 5.0 ms" in disk.measured["storage"]


def test_an_object_store_gets_reads_in_flight_by_its_round_trip_and_its_rate_per_connection():
    """At 20 ms a request: where one connection is held to 25 MB/s the tuner keeps many reads in
    flight; where one request fills the link (300 MB/s) it needs fewer. No worker processes: each
    would fetch the blocks its samples need again."""
    capped = forecast(figures(object_store=store(20.0, 25.0, 200.0), sequential_rate=None))
    uncapped = forecast(figures(object_store=store(20.0, 300.0, 300.0), sequential_rate=None))
    assert capped is not None and uncapped is not None
    assert capped.stages.remote and capped.settings.processes == 0
    assert capped.settings.reads_in_flight > uncapped.settings.reads_in_flight
    assert capped.prediction.bottleneck == "object store"
    assert capped.prediction.rate == pytest.approx(200e6 / 110e3, rel=0.03)  # the store's most, 1,818 img/s
    assert "first byte after 20 ms, one request 25 MB/s" in capped.measured["storage"]


def test_loose_files_are_forecast_packed_and_without_a_loader_run_nothing_is_forecast():
    loose = forecast(figures(loose=True))
    assert loose is not None and loose.packed
    assert "stoker.Loader on the data packed, left to tune itself: ~3,000 img/s" in "\n".join(loose.lines())
    assert forecast(figures(loader_run=None)) is None  # a user's Dataset, or a transform the Loader cannot take
    verdict = diagnose(figures(loader_run=None, step_time=0.05))
    assert verdict.tuner is None
    jsonschema.validate(verdict.to_dict(), verdict_schema())


def test_the_terminal_report_says_what_the_tuner_would_choose():
    verdict = diagnose(figures(step_time=0.05, storage_rate=150.0, sequential_rate=150.0))
    report = DoctorReport({"description": "/data/train", "kind": "packed", "num_samples": 1000, "estimated": False,
                           "sample_size": 120}, {"batch_size": 256, "step_time": 0.05}, None, None, [], [], verdict, 1.0)
    text = report.to_text()
    section = text[text.index("The Loader's tuner"):text.index("Remedies")]
    assert "its tuner would choose: " in section and "limited by storage" in section
    assert "stoker.Loader on the sample pack, 3,000 img/s on 8.0 cores" in section
