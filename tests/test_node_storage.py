"""The storage side of training on several nodes, in one process where it can be: where a process
sits (torchrun's environment) and the nodes' staggered first requests; the node cache chosen for
a URL read by one of several ranks, and said by explain(); room made from what the node's
stagers, every rank's, need last; a stager that never fetches a shard its reader is past; a
rank's blocks read ahead from an object store let go once its part of them was read; and one
fetch of a block that several threads want at once. The whole simulated job: test_nodes.py."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import stoker
from stoker.bench.link import ShapedLink
from stoker.errors import OptionError
from stoker.format import read_manifest
from stoker.storage.cache import ShardCache
from stoker.storage.node import MAX_STAGGER, NodePlace, this_node
from stoker.storage.remote import cache_root
from stoker.storage.settings import StorageSettings
from stoker.storage.stager import Stager
from tests.test_remote_faults import through


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Metadata and chosen node caches under this test's tmp_path; one process alone unless a test says otherwise."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "LOCAL_RANK", "RANK"):
        monkeypatch.delenv(name, raising=False)


def test_a_process_knows_its_node_from_torchruns_environment(monkeypatch):
    assert this_node() == NodePlace(1, 1, 0, 0) and this_node().stagger() == 0.0
    for name, value in {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    assert this_node() == NodePlace(16, 8, 1, 3) and this_node().nodes == 2
    monkeypatch.setenv("LOCAL_RANK", "three")
    with pytest.raises(OptionError, match="LOCAL_RANK='three' must be an integer"):
        this_node()


def test_the_nodes_first_requests_are_spread_and_bounded():
    for nodes in (2, 8, 64, 512):
        waits = sorted(NodePlace(nodes, 1, node).stagger() for node in range(nodes))
        assert waits[0] == 0.0 and waits[-1] < MAX_STAGGER
        assert len(set(waits)) == nodes  # no two nodes at the same moment
        assert np.allclose(np.diff(waits), waits[1])  # evenly apart
    assert NodePlace(2, 1, 1).stagger() < 0.1  # two nodes wait next to nothing


def test_a_url_read_by_one_of_several_ranks_gets_a_node_cache_and_explain_says_so(s3, remote, monkeypatch):
    alone = stoker.ShardDataset(remote, storage_options=s3.options)
    assert alone.shards.cache is None and "read in place by range" in alone.shards.describe_storage()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ranked = stoker.ShardDataset(remote, storage_options=s3.options)
    assert ranked.shards.cache is not None and ranked.shards.settings.cache_chosen
    assert ranked.shards.cache.folder.parent == cache_root() / "shards"
    explained = stoker.Loader(ranked, 4, seed=0, rank=0, world_size=4).explain()
    assert f"through the node cache in {ranked.shards.cache.folder}" in explained and "chosen: 4 ranks" in explained
    given = stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=cache_root() / "mine")
    assert not given.shards.settings.cache_chosen and "chosen" not in given.shards.describe_storage()


def limited_cache(packed, tmp_path, limit: int | None = None) -> ShardCache:
    """A cache of ``packed``'s shards within ``limit`` bytes (default: its largest shard)."""
    entries = read_manifest(packed).shards
    limit = limit or max(entry.bytes for entry in entries)
    return ShardCache(packed, entries, StorageSettings(cache_dir=tmp_path / "cache", cache_limit=limit))


def test_room_is_made_from_what_the_nodes_stagers_need_last(packed, tmp_path):
    """Two ranks' stagers on record: rank A reads shard 0 then shard 2 (at 20), rank B shard 1 then
    shard 3 (at 30); room for three of them. A's stager evicts B's shard 3 for its shard 2: the
    node needs it last, whoever staged it. B's stager then finds every copy needed before its
    shard 3 (0 and 1 are being read) and waits, until A is past shard 0."""
    sizes = [entry.bytes for entry in read_manifest(packed).shards[:4]]
    cache = limited_cache(packed, tmp_path, sum(sizes) - min(sizes))  # any three fit, never four
    a = cache.needs(np.array([0, 2]), np.array([0, 20]), np.array([9, 29]))
    b = cache.needs(np.array([1, 3]), np.array([0, 30]), np.array([9, 39]))
    assert all(cache.fetch(shard, staging=True) for shard in (0, 1, 3))
    assert cache.fetch(2, staging=True) and not cache.ready(3)
    a.advance(5, 8)
    b.advance(5, 8)
    assert not cache.fetch(3, staging=True)  # shards 0 and 1 are read now, shard 2 from 12 ahead: all before 22
    a.advance(10, 16)  # A is past shard 0
    assert cache.fetch(3, staging=True) and not cache.ready(0) and cache.ready(1) and cache.ready(2)
    b.close()
    a.close()
    assert list((cache.folder / ".needs").iterdir()) == []


def _register_and_die(packed, tmp_path) -> None:
    cache = limited_cache(packed, tmp_path)
    cache.needs(np.array([0]), np.array([0]), np.array([100]))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_stagers_record_protects_nothing(packed, tmp_path):
    cache = limited_cache(packed, tmp_path)
    assert cache.fetch(0, staging=True)
    child = multiprocessing.get_context("spawn").Process(target=_register_and_die, args=(packed, tmp_path))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL and len(list((cache.folder / ".needs").iterdir())) == 3
    live = cache.needs(np.array([1]), np.array([0]), np.array([10]))
    assert cache.fetch(1, staging=True) and not cache.ready(0)  # the dead stager's shard 0 made room
    assert sorted(p.name for p in (cache.folder / ".needs").iterdir()) == sorted(
        live.path.with_suffix(s).name for s in (".at", ".lock", ".plan"))
    live.close()


def test_a_stager_never_fetches_a_shard_its_reader_is_past(s3, remote, packed, tmp_path):
    dataset = stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=tmp_path / "cache")
    shards = np.arange(4)
    stager = Stager(dataset.shards.cache, shards, shards * 10, shards * 10 + 9, ahead=1)
    stager.advance(25)  # past shards 0 and 1, inside shard 2
    deadline = time.monotonic() + 60
    while not dataset.shards.cache.ready(3) and time.monotonic() < deadline:
        time.sleep(0.05)
    stager.close()
    assert [dataset.shards.cache.ready(s) for s in range(4)] == [False, False, True, True]


def test_a_rank_lets_go_of_the_blocks_it_read_ahead(s3, remote, packed):
    """Rank 0 of 2 reads its half of every block; each block read ahead is let go once that half
    is read, so at the end of the pass none is held (all of them were, until the epoch ended)."""
    there = stoker.ShardDataset(remote, storage_options=s3.options, block_bytes=256 << 10)
    loader = stoker.Loader(there, 4, seed=1, threads=1, rank=0, world_size=2, crop=stoker.CropSpec(size=(16, 16)))
    held = []
    for _ in loader:
        held.append(sum(len(there.shards.open_reader(s).source._spans)
                        for s in range(len(there.shards.manifest.shards)) if there.shards.open_reader(s)))
    assert max(held) > 0 and held[-1] == 0, held


def test_a_block_several_threads_want_at_once_is_fetched_once(s3, remote, packed):
    """Without hints a second read inside a block fetches the block; two threads reading two more of
    its samples while that fetch is on its way (0.5 s a request) wait for it instead of each fetching it."""
    with ShapedLink(s3.port, delay=0.5) as link:
        there = stoker.ShardDataset(remote, decode="raw", storage_options=through(s3, link))
        here = stoker.ShardDataset(packed, decode="raw")
        there[0]  # the first read in shard 0's first block: the member only
        before = len(link.ranges("GET"))
        start = threading.Barrier(3)
        got: dict[int, object] = {}

        def read(i: int) -> None:
            start.wait()
            got[i] = there[i]

        threads = [threading.Thread(target=read, args=(i,)) for i in (1, 2, 3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert got == {i: here[i] for i in (1, 2, 3)}
        assert len(link.ranges("GET")) - before == 1, link.ranges("GET")[before:]
