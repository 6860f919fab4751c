"""Node-cached shards on the native path, and the storage settings as one value: a copy that is
in the node cache hands its descriptor to native code (``ShardDataset.image_reads``), pinned for
the block, so the Loader reads a staged cache in one native call per chunk as it reads local
disk; a copy evicted and staged again anywhere in the block is still the copy read; one
StorageSettings record and one origin connection per data set, pickled to workers as one value."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from pathlib import Path
from queue import Empty

import numpy as np
import pytest
import torch

import stoker
from stoker.errors import OptionError
from stoker.format import member_checksum, read_manifest
from stoker.storage.settings import StorageSettings
from tests.test_cache_races import others_acting
from tests.test_decode_chunk import Calls


def staged(packed: Path, cache_dir: Path, **options) -> stoker.ShardDataset:
    """A ShardDataset over ``packed`` through a node cache holding every shard."""
    dataset = stoker.ShardDataset(packed, cache_dir=cache_dir, **options)
    assert dataset.shards.cache is not None
    for shard in range(len(dataset.shards.manifest.shards)):
        assert dataset.shards.cache.fetch(shard)
    return dataset


def linked_paths(fds: np.ndarray) -> set[str]:
    """The files this process's descriptors ``fds`` name."""
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in set(fds.tolist())}


def test_image_reads_cover_a_staged_cache_from_its_copies(packed, tmp_path):
    dataset = staged(packed, tmp_path / "cache")
    folder = dataset.shards.cache.folder
    plain = stoker.ShardDataset(packed)
    everything = np.arange(len(dataset))
    with dataset.image_reads(everything) as reads, plain.image_reads(everything) as local:
        assert reads.covered.all()  # before: none (the node cache was left to the per-image path)
        assert linked_paths(reads.fds) == {str(folder / entry.name) for entry in dataset.shards.manifest.shards}
        for field in ("offsets", "sizes", "checksums", "labels"):
            assert np.array_equal(getattr(reads, field), getattr(local, field))


def test_a_shard_not_in_the_cache_is_left_to_the_usual_read_which_fetches_it(packed, tmp_path):
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=tmp_path / "cache")
    first = np.arange(int(dataset.shards.starts[1]))  # shard 0's samples
    with dataset.image_reads(first) as reads:
        assert not reads.covered.any()
    assert not dataset.shards.cache.ready(0)  # nothing fetched for a native block
    assert dataset[0] == stoker.ShardDataset(packed, decode="raw")[0]  # the per-image read fetches the shard
    with dataset.image_reads(np.arange(len(dataset))) as reads:
        assert np.array_equal(np.flatnonzero(reads.covered), first)


@pytest.mark.parametrize("processes", [0, 2])
def test_the_loader_reads_a_staged_cache_natively_and_as_it_reads_local_disk(packed, tmp_path, monkeypatch, processes):
    calls = Calls(monkeypatch)  # decode_chunk itself runs; its count of samples made is read
    cached = stoker.Loader(staged(packed, tmp_path / "cache"), 16, seed=3, threads=2, processes=processes,
                           mp_context="fork")
    here = stoker.Loader(stoker.ShardDataset(packed), 16, seed=3, threads=2)
    batches = [(images.clone(), labels.clone()) for images, labels in cached]
    if processes == 0:  # worker processes count in their own copies of the spy
        assert calls.made == len(cached.dataset)  # every sample in one native call per chunk, none per image
    for (a, la), (b, lb) in zip(batches, here, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def pinned_reads_with_others(packed: Path, folder: Path, limit: int, evict_at: int | None, restage_at: int | None,
                             pinned: bool) -> list[str]:
    """Samples 0-2 (shard 0) through ``image_reads``, read by pread through the block's
    descriptors as native code reads them, with :func:`others_acting` evicting and restaging the
    copy at the given OS calls (the block's preads among them); the OS calls seen."""
    plain = stoker.ShardDataset(packed, decode="raw")
    indices = np.arange(3)
    with others_acting(packed, folder, limit, evict_at, restage_at, pinned) as (dataset, others):
        with dataset.image_reads(indices) as reads:
            got = [os.pread(int(fd), int(size), int(offset)) if covered else None
                   for fd, offset, size, covered in zip(reads.fds, reads.offsets, reads.sizes, reads.covered)]
    for i, data in zip(indices.tolist(), got):
        if data is None:  # not pinned (evicted before the block began): the usual read gives it
            assert dataset[i] == plain[i], (evict_at, restage_at, others.calls)
        else:
            assert (data, int(reads.labels[i])) == plain[i], (evict_at, restage_at, others.calls)
            assert member_checksum(data) == int(reads.checksums[i])
    if evict_at is not None and "pread" in others.calls and evict_at >= others.calls.index("pread"):
        assert reads.covered.all()  # pinned before the eviction: the block reads the copy it pinned
    return others.calls


@pytest.mark.parametrize("pinned", [False, True], ids=["first-pin", "copy-open"])
def test_a_copy_evicted_and_staged_again_anywhere_in_a_native_block_is_read_intact(packed, tmp_path, pinned):
    shards = stoker.ShardDataset(packed).shards.manifest.shards
    limit = max(shards[0].bytes, shards[1].bytes)  # one of shards 0 and 1, never both
    calls = pinned_reads_with_others(packed, tmp_path / "dry", limit, None, None, pinned)
    assert calls.count("pread") == 3
    for evict_at in range(len(calls)):
        for restage_at in [*range(evict_at + 1, len(calls)), None]:
            pinned_reads_with_others(packed, tmp_path / f"{evict_at}-{restage_at}", limit, evict_at, restage_at, pinned)


def test_the_storage_settings_travel_as_one_value_with_one_origin(s3, remote, tmp_path):
    dataset = stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=tmp_path / "node", reads_in_flight=3,
                                  read_timeout=float("inf"), cache_ahead=2)
    blob = pickle.dumps(dataset)
    assert blob.count(b"StorageSettings") == 1 and blob.count(s3.options["client_kwargs"]["endpoint_url"].encode()) == 1
    for shards in (dataset.shards, pickle.loads(blob).shards):  # as a spawned worker gets it
        assert shards.settings == StorageSettings(storage_options=s3.options, read_timeout=float("inf"),
                                                  reads_in_flight=3, cache_dir=tmp_path / "node", cache_ahead=2)
        assert shards.cache.origin is shards.remote  # one thread pool and file system for reads and downloads
        assert shards.remote.parallel == 3 and shards.remote.read_timeout == float("inf")


def read_in_a_child(data, name: str, queue) -> None:
    queue.put(data.prefetch(name, 0, 100).result(timeout=20))


def test_a_worker_forked_while_the_origin_queues_a_read_can_read_through_it(packed):
    """The origin is shared by a parent's stager (its downloads queue parts on the origin's pool)
    and, after a fork, by the DataLoader workers: a worker forked while a parent thread queues a
    read must not wait for ever on the pool's lock that thread held at the fork."""
    data = StorageSettings().origin(str(packed))
    name = read_manifest(packed).shards[0].name
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with data._pool_lock:  # where a stager thread is at the moment of the fork
        child = context.Process(target=read_in_a_child, args=(data, name, queue))
        child.start()
    try:
        assert queue.get(timeout=20) == (packed / name).read_bytes()[:100]
    except Empty:
        pytest.fail("the forked worker waited on the parent's lock")
    finally:
        child.kill()
        child.join()


@pytest.mark.parametrize("options, says", [
    ({"read_timeout": 0}, "read_timeout=0: must be a number above 0 (seconds) or inf"),
    ({"read_timeout": float("nan")}, "read_timeout=nan"), ({"read_timeout": -float("inf")}, "read_timeout=-inf"),
    ({"read_timeout": "60"}, "read_timeout='60'"), ({"reads_in_flight": 0}, "reads_in_flight=0"),
    ({"cache_ahead": -1}, "cache_ahead=-1"), ({"cache_limit": 0}, "cache_limit=0"),
])
def test_storage_settings_are_checked_through_ranges(packed, options, says):
    with pytest.raises(OptionError, match=f"^{says}".replace("(", r"\(").replace(")", r"\)")):
        stoker.ShardDataset(packed, **options)
