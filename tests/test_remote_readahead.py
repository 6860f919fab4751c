"""What is read ahead from an object store, and where: a pass left early takes back the blocks it
queued and not yet fetched; blocks are fetched ahead only into the process that reads the samples
(the Loader's own threads), never into a process whose samples are read elsewhere (a Loader's
worker processes, a QuasiRandomSampler's DataLoader workers); and a Loader left to choose keeps
its threads on such data."""

from __future__ import annotations

import time

import numpy as np
import pytest

import stoker
from stoker.bench.link import ShapedLink
from stoker.data.readable import fetches_per_process
from stoker.data.readahead import Lookahead, block_bounds_of
from tests.test_remote_faults import through

BLOCK = 64 << 10
RATE = 1_000_000  # bytes/s: the whole small data set takes seconds, a batch's blocks well under one


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def body_bytes_once_idle(link: ShapedLink) -> int:
    """The link's body bytes once nothing has passed for a second (the reads in flight have ended)."""
    before, deadline = -1, time.monotonic() + 60
    while time.monotonic() < deadline:
        now = link.counts()["body_bytes"]
        if now == before:
            return now
        before = now
        time.sleep(1.0)
    raise AssertionError("the link never went idle")


def test_a_pass_left_early_takes_back_its_reads_ahead(s3, remote, packed):
    """Every block of the epoch is read ahead at once (a window over all of them); the loop takes one
    batch and leaves. What was queued and not begun is never fetched: the link carries the first
    batch's blocks and those in flight, not the data set."""
    total = sum(entry.bytes for entry in stoker.ShardDataset(packed).shards.manifest.shards)
    with ShapedLink(s3.port, rate=RATE) as link:
        there = stoker.ShardDataset(remote, storage_options=through(s3, link), block_bytes=BLOCK)
        loader = stoker.Loader(there, 8, seed=1, threads=1, window=10_000)
        batches = iter(loader)
        next(batches)
        batches.close()  # as a `break` does
        fetched = body_bytes_once_idle(link)
    assert fetched < total // 2, (fetched, total)  # all of it, were the queued blocks fetched


def _lookahead(dataset: stoker.ShardDataset, reads_here: bool) -> Lookahead:
    order = np.arange(len(dataset))
    return Lookahead(dataset.shards, block_bounds_of(dataset.shards), order, 4, reads_here=reads_here)


def test_blocks_are_fetched_ahead_only_where_the_samples_are_read(s3, remote, packed, tmp_path):
    there = stoker.ShardDataset(remote, storage_options=s3.options)
    assert _lookahead(there, reads_here=True).blocks is not None
    assert _lookahead(there, reads_here=False).blocks is None  # fetched into this process, read by no one
    here = stoker.ShardDataset(packed)
    assert _lookahead(here, reads_here=False).blocks is not None  # a kernel hint fills the shared page cache
    cached = stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=tmp_path / "node")
    assert _lookahead(cached, reads_here=False).stager is not None  # the node cache serves every process
    assert fetches_per_process(there) and not fetches_per_process(here) and not fetches_per_process(cached)
    assert fetches_per_process(stoker.Mix({"here": here, "there": there}, weights={"here": 0.5, "there": 0.5}))


def test_a_sampler_fetches_nothing_ahead_for_dataloader_workers(s3, remote, packed):
    """The sampler's process does not read the samples (DataLoader workers do): walking its order
    fetches no shard bytes. (A copy of its own: no other test's reads are counted.)"""
    s3.fs.put(str(packed) + "/", "data/sampled", recursive=True)
    there = stoker.ShardDataset("s3://data/sampled", storage_options=s3.options, block_bytes=BLOCK)
    before = s3.gets("/data/sampled/shard-")  # the indexes, fetched with the manifest
    order = list(stoker.QuasiRandomSampler(there, seed=3))
    assert sorted(order) == list(range(len(there)))
    time.sleep(0.5)  # what a read ahead would have queued has had time to start
    assert s3.gets("/data/sampled/shard-") == before
