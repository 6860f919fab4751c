"""Reading a packed data set from the real moto server through a shaped, faulty link of ours
(stoker.bench.link): resets, 503s, 500s and cut bodies ridden out with every sample byte-exact, an
outage ridden out, a store gone for good named within the read timeout, cut reads resumed from
their last good byte, and damage at the source never delivered."""

from __future__ import annotations

import logging

import pytest
import torch

import stoker
from stoker.bench.link import Faults, ShapedLink
from stoker.errors import CorruptDataError, RemoteError
from stoker.storage import remote as remote_module
from stoker.storage.remote import RemoteData


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Metadata folders under this test's tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def link(s3):
    with ShapedLink(s3.port, delay=0.002, seed=7) as shaped:
        yield shaped


def through(s3, link) -> dict:
    """The server's storage options with requests sent through ``link``."""
    return {**s3.options, "client_kwargs": {**s3.options["client_kwargs"], "endpoint_url": link.url}}


def test_an_epoch_through_resets_503s_500s_and_cut_bodies_is_byte_exact(s3, remote, packed, link):
    # 20% of requests faulted (5% of each kind), more than the 1%: this small data set
    # makes few requests, and every kind must come up
    there = stoker.ShardDataset(remote, storage_options=through(s3, link))
    link.set_faults(Faults(reset=0.05, slow_down=0.05, error=0.05, cut=0.05))
    link.inject("reset", "cut", "slow_down", "error")  # the first reads; then drawn at random
    here = stoker.ShardDataset(packed)
    batches = list(zip(stoker.Loader(there, 16, seed=5, threads=2), stoker.Loader(here, 16, seed=5, threads=2),
                       strict=True))
    for (a, la), (b, lb) in batches:
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert sum(len(la) for (_, la), _ in batches) == len(here)
    counts = link.counts()
    assert min(counts[kind] for kind in ("reset", "slow_down", "error", "cut")) >= 1, counts


def test_raw_samples_in_sampler_order_through_faults_arrive_once_each_and_exact(s3, remote, packed, link):
    there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link))
    link.set_faults(Faults(reset=0.1, cut=0.1))
    here = stoker.ShardDataset(packed, decode="raw")
    order = list(stoker.QuasiRandomSampler(there, seed=2))
    assert sorted(order) == list(range(len(here)))
    assert [there[i] for i in order] == [here[i] for i in order]
    assert link.counts()["reset"] + link.counts()["cut"] >= 1


def test_reading_carries_on_after_the_store_is_down_for_10_seconds(s3, remote, packed, link):
    there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link), block_bytes=256 << 10)
    here = stoker.ShardDataset(packed, decode="raw")
    sampler = stoker.QuasiRandomSampler(there, seed=4, window=1)  # little read ahead: reads wait on the store
    got, order = [], []
    for n, i in enumerate(sampler):
        if n == len(here) // 3:
            requests = link.counts()["requests"]
            link.down(10.0)
        got.append(there[i])
        order.append(i)
    assert link.counts()["requests"] > requests  # reads needed the store after it went down
    assert sorted(order) == list(range(len(here)))
    assert got == [here[i] for i in order]


def test_a_store_gone_for_good_is_named_within_the_read_timeout(s3, remote, link):
    there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link), read_timeout=1.5)
    link.stop()
    with pytest.raises(RemoteError, match=r"s3://data/packed/shard-\d+\.tar \(bytes \d+-\d+\): failed after "
                                          r"\d+ attempts in \d+\.\d s"):
        there[0]


def test_a_cut_read_resumes_from_its_last_good_byte(s3, remote, packed, link):
    name = stoker.ShardDataset(packed).shards.manifest.shards[0].name
    size = (packed / name).stat().st_size
    data = RemoteData(remote, through(s3, link))
    link.inject("cut")
    assert data.read_range(name, 0, size) == (packed / name).read_bytes()
    counts = link.counts()
    assert counts["cut"] == 1 and counts["requests"] == 2
    assert counts["body_bytes"] == size  # the second request asked only for what the first did not bring


@pytest.mark.parametrize("parallel", [1, 16])
@pytest.mark.parametrize("fault", ["cut", "reset"])
def test_a_whole_shard_download_cut_short_resumes(s3, remote, packed, link, tmp_path, fault, parallel):
    """The node cache's and `stoker stage`'s download of a whole shard (ranged parts, here one; or
    with one read in flight, s3fs's get_file): what arrived before the fault is kept, and the second
    request asks for the rest (after a cut exactly the rest; a reset drops the bytes in flight)."""
    entry = stoker.ShardDataset(packed).shards.manifest.shards[0]
    data = RemoteData(remote, through(s3, link), parallel=parallel)  # 1: one streamed GET; 16: parts
    link.inject(fault)
    committed = []
    data.download(entry.name, entry.bytes, entry.checksum, tmp_path / "partial",
                  lambda copy: committed.append(copy.read_bytes()))
    assert committed == [(packed / entry.name).read_bytes()]
    assert not (tmp_path / "partial").exists()
    counts = link.counts()
    first, second = link.ranges("GET")  # parts: after one HEAD, for the object's length
    kept = int(second.removeprefix("bytes=").split("-")[0])
    assert counts[fault] == 1 and first in ("", f"bytes=0-{entry.bytes - 1}") and 0 < kept < entry.bytes, (first, second)
    if fault == "cut":
        assert counts["body_bytes"] == entry.bytes


def test_a_whole_shard_downloads_in_parallel_parts_through_faults(s3, remote, packed, link, tmp_path, monkeypatch):
    """With parts of 64 KiB a shard of ~600 KB comes in ~10 ranged GETs at once (several
    connections), resets and cut bodies among them, and the copy is byte-exact."""
    monkeypatch.setattr(remote_module, "DOWNLOAD_PART", 64 << 10)
    entry = stoker.ShardDataset(packed).shards.manifest.shards[0]
    data = RemoteData(remote, through(s3, link))
    link.set_faults(Faults(reset=0.15, cut=0.15))
    copies = []
    data.download(entry.name, entry.bytes, entry.checksum, tmp_path / "partial",
                  lambda copy: copies.append(copy.read_bytes()))
    assert copies == [(packed / entry.name).read_bytes()]
    parts = -(-entry.bytes // (64 << 10))
    counts = link.counts()
    assert len(link.ranges("GET")) >= parts and counts["reset"] + counts["cut"] >= 1, counts
    assert counts["connections"] > 2  # the HEAD's, and parts in flight together


def test_a_reset_read_is_read_again(s3, remote, packed, link):
    """(Bytes in flight when a reset arrives are dropped by the receiving kernel, so how many come
    again depends on timing: only the outcome is checked.)"""
    name = stoker.ShardDataset(packed).shards.manifest.shards[0].name
    data = RemoteData(remote, through(s3, link))
    link.inject("reset")
    assert data.read_range(name, 100, 300_000) == (packed / name).read_bytes()[100:300_000]
    assert link.counts()["reset"] == 1 and link.counts()["requests"] == 2


def test_damage_at_the_source_is_never_delivered_and_skips_are_named(s3, remote, packed, link, caplog):
    shards = stoker.ShardDataset(packed).shards
    entry, index = shards.manifest.shards[1], shards.index(1)
    member = index.sample_members(0)[0]
    damaged = bytearray((packed / entry.name).read_bytes())
    damaged[int(member["offset"]) + 100] ^= 0xFF
    s3.fs.pipe("data/damaged/" + entry.name, bytes(damaged))
    for other in s3.fs.ls("data/packed"):
        if not other.endswith(entry.name):
            s3.fs.copy(other, "data/damaged/" + other.rsplit("/", 1)[1])
    options = through(s3, link)
    strict = stoker.ShardDataset("s3://data/damaged", decode="raw", storage_options=options)
    with pytest.raises(CorruptDataError, match="damaged at the source"):
        strict[int(shards.starts[1])]
    lenient = stoker.ShardDataset("s3://data/damaged", decode="raw", storage_options=options, on_error="skip")
    here = stoker.ShardDataset(packed, decode="raw")
    with caplog.at_level(logging.WARNING, logger="stoker.data.dataset"):
        got = lenient[int(shards.starts[1])]
    assert got == here[int(shards.starts[1]) + 1] and lenient.skipped == 1
    assert index.key(0) in caplog.text and entry.name in caplog.text
