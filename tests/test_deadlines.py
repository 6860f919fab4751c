"""One deadline per read that the backend cannot outlive: with every request to the store
black-holed (the connection accepted, never answered) and ``read_timeout=2``, a RemoteError naming
the object arrives within a few read timeouts, whatever the backend's own timeouts (the test
server's options give botocore a 10 s read timeout) and retries, for ShardDataset's ranged reads,
node-cache downloads (parts, or one streamed GET) and the manifest and index fetches. A transfer
that is slow but moving is not cut: the deadline counts from the last bytes that arrived."""

from __future__ import annotations

import threading
import time

import pytest

import stoker
from stoker.bench.link import Faults, ShapedLink
from stoker.errors import RemoteError
from stoker.storage.remote import RemoteData
from tests.test_remote_faults import through

READ_TIMEOUT = 2.0
BOUND = 5 * READ_TIMEOUT  # generous: the error comes after ~2 s on an idle machine


@pytest.fixture
def link(s3):
    with ShapedLink(s3.port, seed=5) as shaped:
        yield shaped


def raised_within(seconds: float, action) -> BaseException:
    """What ``action()`` raised, failing the test if it returned or took longer than ``seconds``
    (it runs in a daemon thread, so a hang fails the test instead of stalling the suite)."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_raised(action)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"no result within {seconds} s"
    assert outcome[0] is not None, "no error"
    return outcome[0]


def _raised(action) -> BaseException | None:
    try:
        action()
    except BaseException as e:  # noqa: BLE001 -- handed to the test
        return e
    return None


@pytest.mark.parametrize("reader", ["ranged", "cache-parts", "cache-one-stream"])
def test_a_black_holed_store_is_named_within_the_read_timeout(s3, remote, link, tmp_path, reader):
    options = {"ranged": {}, "cache-parts": {"cache_dir": tmp_path / "c"},
               "cache-one-stream": {"cache_dir": tmp_path / "c", "reads_in_flight": 1}}[reader]
    there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link), read_timeout=READ_TIMEOUT,
                                **options)
    link.set_faults(Faults(black_hole=1.0))
    error = raised_within(BOUND, lambda: there[0])
    assert isinstance(error, RemoteError), error
    assert "s3://data/packed/shard-000000.tar" in str(error) and "nothing arrived" in str(error)


def test_a_black_holed_store_is_named_when_the_manifest_and_indexes_are_fetched(s3, remote, packed, link):
    options = through(s3, link)
    link.set_faults(Faults(black_hole=1.0))
    error = raised_within(BOUND, lambda: stoker.ShardDataset(remote, storage_options=options, read_timeout=READ_TIMEOUT))
    assert isinstance(error, RemoteError) and "s3://data/packed/stoker.json" in str(error), error
    indexes = [entry.index for entry in stoker.ShardDataset(packed).shards.manifest.shards]
    there = RemoteData(remote, options, read_timeout=READ_TIMEOUT)
    error = raised_within(BOUND, lambda: there.read_many(indexes))  # how metadata() fetches the indexes
    assert isinstance(error, RemoteError) and f"s3://data/packed/{indexes[0]}" in str(error), error


def test_a_slow_transfer_that_keeps_moving_outlives_the_read_timeout(s3, remote, packed, link):
    """A shard of ~600 KB held to 120 KB/s after the link's 256 KiB burst: over 3 s, longer than
    a read timeout of 2 s, with 64 KiB arriving every ~0.5 s. The link bounds the time from below
    only: a busy machine makes it longer, and it still moves."""
    name = stoker.ShardDataset(packed).shards.manifest.shards[0].name
    size = (packed / name).stat().st_size
    with ShapedLink(s3.port, stream_rate=120e3) as slow:
        data = RemoteData(remote, through(s3, slow), read_timeout=READ_TIMEOUT)
        started = time.monotonic()
        assert data.read_range(name, 0, size) == (packed / name).read_bytes()
        assert time.monotonic() - started > READ_TIMEOUT
        assert slow.counts()["requests"] == 1


@pytest.mark.parametrize("fetch", ["read", "read_many"])
def test_a_slow_metadata_fetch_that_keeps_moving_outlives_the_read_timeout(s3, remote, packed, fetch):
    """Whole files, as the manifest and the indexes are fetched, each answer held to a rate that
    makes it last twice the deadline (5 s: no gap that long on a busy machine), the deadline moving
    with the bytes as a ranged read's does."""
    entries = stoker.ShardDataset(packed).shards.manifest.shards[:2]
    names, read_timeout = [entry.name for entry in entries], 5.0
    with ShapedLink(s3.port, stream_rate=min(entry.bytes for entry in entries) / (2 * read_timeout)) as slow:
        data = RemoteData(remote, through(s3, slow), read_timeout=read_timeout)
        started = time.monotonic()
        if fetch == "read":
            names = names[:1]
            assert data.read(names[0]) == (packed / names[0]).read_bytes()
        else:
            assert data.read_many(names) == {name: (packed / name).read_bytes() for name in names}
        assert time.monotonic() - started > read_timeout
        assert len(slow.ranges("GET")) == len(names)  # each fetched once: none abandoned and asked again
