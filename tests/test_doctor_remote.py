"""stoker doctor on an s3:// URL: the real moto server behind the shaped link (stoker.bench.link)
with a set delay per request. Times are asserted only as lower bounds (the delay every request
waits), never as upper bounds: the machine may be busy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import jsonschema
import pytest

from stoker.bench.link_process import start_link_process
from stoker.doctor import doctor
from stoker.doctor.figures import Figures, ObjectStore
from stoker.doctor.remote_probe import MIB, Bounds, probe_remote, propose_cache, read_size
from stoker.doctor.report import SCHEMA_PATH
from stoker.doctor.target import open_target
from stoker.doctor.verdict import diagnose

DELAY = 0.02


@pytest.fixture(scope="module")
def link(s3):
    """The moto server seen through a link that holds every request ``DELAY`` seconds."""
    with start_link_process(s3.port, delay=DELAY) as shaped:
        yield shaped


@pytest.fixture(scope="module")
def far(s3, link) -> dict:
    """Storage options that reach the moto server through the link."""
    return {**s3.options, "client_kwargs": {**s3.options["client_kwargs"], "endpoint_url": link.url}}


@pytest.fixture(scope="module")
def loose(s3, remote, photos) -> str:
    """``photos`` uploaded as loose files to s3://data/loose (beside ``remote``, in its bucket)."""
    s3.fs.put(str(photos) + "/", "data/loose", recursive=True)
    return "s3://data/loose"


def validate(report: dict) -> None:
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


def test_doctor_on_a_packed_data_set_in_an_object_store(remote, far, link, tmp_path):
    before = link.counts()["body_bytes"]
    report = doctor(remote, storage_options=far, quick=True, step_time=0.05)
    store = report.remote
    assert store is not None and store.packed and report.storage is None
    # every request waits the link's delay before its first byte
    assert len(store.first_byte_ms) >= 3 and store.first_byte_ms.min() >= DELAY * 1000
    assert store.reads_in_flight > 1  # at 20 ms a request, one read at a time leaves the link idle
    assert [level.in_flight for level in store.levels][:2] == [1, 2]
    assert store.read_bytes <= max(entry.bytes for entry in open_target(remote, 1, storage_options=far)
                                   .dataset.shards.manifest.shards)
    assert store.bytes_read <= store.bounds.max_bytes
    assert link.counts()["body_bytes"] - before >= store.bytes_read  # the probe's reads went through the link
    assert store.stage is not None and store.stage["cache_dir"] == "/dev/shm/stoker"  # 7 MB fits in RAM
    out = report.to_dict()
    validate(out)
    assert out["schema_version"] == 7 and out["target"]["remote"] and out["target"]["kind"] == "packed"
    assert out["object_store"]["proposed"]["reads_in_flight"] == store.reads_in_flight
    reasons = " ".join(report.verdict.reasons)
    assert f"{store.reads_in_flight} reads of" in reasons and "object store" in reasons
    tuner = report.verdict.tuner  # the model given the store's figures: its round trip, reads in flight, no processes
    assert tuner is not None and tuner.stages.remote and tuner.settings.processes == 0
    assert tuner.stages.storage is not None and tuner.stages.storage.first_byte_s >= DELAY
    text = report.to_text()
    assert "Object store (at most" in text and "first byte" in text and "<- proposed" in text
    assert "fetched into a local folder" in text  # the CPU probes ran on local copies, and say so


def test_cli_doctor_on_a_url_takes_the_endpoint_from_the_environment(remote, link, tmp_path):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ENDPOINT_URL": link.url, "AWS_DEFAULT_REGION": "eu-west-1"}
    html = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "stoker.cli", "doctor", remote, "--quick", "--json", "--html", str(html)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    validate(report)
    assert report["object_store"]["url"] == remote and report["object_store"]["first_byte_ms"]["p50"] >= DELAY * 1000
    page = html.read_text()
    assert "MB/s by reads in flight" in page and "first-byte latency" in page


def test_a_folder_of_loose_images_in_an_object_store_is_read_whole_within_the_bounds(loose, far, photos):
    target = open_target(loose, 40, storage_options=far)
    assert target.kind == "folder" and target.remote and target.sample_size == 40
    assert target.num_samples == sum(1 for p in photos.rglob("*.jpg"))
    largest = max(target.sizes)
    # room for one read, then not for the next level's two: the byte bound, not the growth, ends it
    bounds = Bounds(first_byte_requests=4, stream_requests=0, max_bytes=2 * largest, seconds=600.0)  # never the time
    store = probe_remote(target, bounds)
    assert not store.packed and store.first_byte_ms.min() >= DELAY * 1000 and len(store.first_byte_ms) == 4
    assert store.stop == "bytes" and any("bound (" in note for note in store.notes)
    assert [(level.in_flight, level.requests) for level in store.levels] == [(1, 1)]
    assert 0 < store.bytes_read <= bounds.max_bytes
    assert target.reader()(0) == (photos / target.paths[0].split("/data/loose/", 1)[1]).read_bytes()


def test_a_missing_url_is_a_clear_error(far):
    from stoker.errors import StokerError

    with pytest.raises(StokerError, match="s3://data/nothing.*no packed data set"):
        open_target("s3://data/nothing", 10, storage_options=far)


def test_read_size_spends_most_of_a_request_streaming():
    # 20 ms to the first byte at 100 MB/s: 8 MB streams 80 ms, 80% of the request
    assert read_size(0.02, 100.0, 1 << 30) == 8 * MIB
    assert read_size(0.0005, 100.0, 1 << 30) == MIB  # a near store: the smallest read
    assert read_size(0.2, 1000.0, 1 << 30) == 64 * MIB  # the largest read, however far
    assert read_size(0.02, 100.0, 600_000) == 600_000  # never more than an object


def test_the_cache_goes_where_the_data_set_fits():
    assert propose_cache(1e9, 8e9, None) == {"cache_dir": "/dev/shm/stoker", "cache_limit": None, "fits": True}
    assert propose_cache(10e9, 8e9, "/ssd")["cache_dir"] == "/ssd/stoker-cache"
    assert propose_cache(10e9, 8e9, None) == {"cache_dir": "/dev/shm/stoker", "cache_limit": 4_000_000_000, "fits": False}


FIGURES = Figures(source="s3://data/packed", loose=False, cores=8, batch_size=256, size=224, step_time=0.1,
                  storage_rate=300.0, storage_concurrency=1, sequential_rate=None, decode_per_core=1000.0,
                  jpeg_share=1.0, transform_per_core=3000.0, loader_rate=4000.0, loader_workers=8, megapixels=0.2,
                  dataset_bytes=1e9, available_ram_bytes=16e9, mean_bytes=100e3, stoker_loader=5000.0,
                  object_store=ObjectStore(2500.0, 16, 8 * MIB, 21.0, 30.0,
                                           {"cache_dir": "/dev/shm/stoker", "cache_limit": None, "fits": True}))


def test_the_verdict_names_the_object_store_and_its_reads_in_flight():
    verdict = diagnose(FIGURES)
    assert verdict.bottleneck == "object store"
    first = verdict.remedies[0]
    assert first.name == "read through the node cache with 16 reads of 8 MiB in flight"
    assert first.predicted_images_per_s == 2500.0  # the object store at 16 in flight, under the Loader's 5,000
    assert "cache_dir='/dev/shm/stoker'" in first.how and f"block_bytes={8 * MIB}" in first.how
    assert "reads_in_flight=16" in first.how  # what the node cache then runs: 16 parts of each shard at once
    assert "later epochs read the node cache" in first.why


def test_a_fast_enough_object_store_is_not_the_bottleneck():
    verdict = diagnose(replace(FIGURES, storage_rate=4500.0))
    assert verdict.bottleneck != "object store"
