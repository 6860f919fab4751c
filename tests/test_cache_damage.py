"""An object damaged at the source, read through the node cache (``cache_dir=``): a real
S3-compatible server (moto, on localhost) holding real shards with a bit flipped or the end cut
off. Fetched once more, then a CorruptDataError naming the object, the sample and what is wrong,
and ``on_error`` decides; never minutes of retries ending in a RemoteError. The stager, DataLoader
workers and the Loader's threads all hear of it from the cache, which fetches it twice per node."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.data.readahead import Lookahead, block_bounds_of
from stoker.errors import CorruptDataError
from stoker.format import read_manifest
from stoker.storage.stage import stage

VICTIM = 2  # the shard whose object is damaged


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Metadata folders under this test's tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def damaged_copy(s3, packed, prefix: str, kind: str, file: str = "name") -> tuple[str, str]:
    """``packed`` uploaded to s3://data/``prefix`` with shard VICTIM's object (its ``file``: "name"
    for the shard, "index" for its index) damaged: one bit flipped, or the second half cut off.
    The data set's URL and the damaged object's name."""
    s3.fs.put(str(packed) + "/", f"data/{prefix}", recursive=True)
    name = getattr(read_manifest(packed).shards[VICTIM], file)
    data = bytearray((packed / name).read_bytes())
    if kind == "flipped":
        data[len(data) // 2] ^= 0x10
    else:
        del data[len(data) // 2 :]
    s3.fs.pipe(f"data/{prefix}/{name}", bytes(data))
    return f"s3://data/{prefix}", name


def victim_samples(dataset) -> range:
    starts = dataset.shards.starts
    return range(int(starts[VICTIM]), int(starts[VICTIM + 1]))


def fetches(s3, url: str, name: str) -> int:
    """GET requests so far of object ``name`` of the data set at ``url``."""
    return s3.gets(f"/{url.removeprefix('s3://')}/{name}")


def as_list(batch):
    return list(batch)


@pytest.mark.parametrize("kind", ["flipped", "truncated"])
def test_a_damaged_object_is_fetched_once_more_then_named(s3, remote, packed, tmp_path, kind):
    url, name = damaged_copy(s3, packed, tmp_path.name, kind)
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    victims = victim_samples(dataset)
    entry = dataset.shards.manifest.shards[VICTIM]
    with pytest.raises(CorruptDataError) as raised:
        dataset[victims[0]]
    assert raised.value.shard == f"{url}/{name}" and raised.value.key == dataset.key(victims[0])
    got = entry.bytes if kind == "flipped" else entry.bytes // 2
    assert f"expected {entry.bytes} bytes with checksum {entry.checksum}, got {got} bytes" in raised.value.reason
    assert fetches(s3, url, name) == 2  # one fetch again, no retrying for the rest of a window
    with pytest.raises(CorruptDataError, match="damaged at the source"):
        dataset[victims[-1]]
    again = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    with pytest.raises(CorruptDataError, match="damaged at the source"):
        again[victims[1]]  # as another process on the node: told by the cache, without a fetch
    assert fetches(s3, url, name) == 2
    plain = stoker.ShardDataset(packed, decode="raw")
    assert dataset[victims[-1] + 1] == plain[victims[-1] + 1]  # the other shards read as ever


def test_dataloader_workers_skip_the_damaged_shard_and_read_the_rest(s3, remote, packed, tmp_path):
    url, name = damaged_copy(s3, packed, tmp_path.name, "flipped")
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache",
                                  on_error="skip")
    sampler = stoker.QuasiRandomSampler(dataset, seed=0, window=2)  # stages ahead, in this process
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                                         multiprocessing_context="fork", collate_fn=as_list)
    items = [item for batch in loader for item in batch]
    plain = stoker.ShardDataset(packed, decode="raw")
    victims = victim_samples(dataset)
    # ShardDataset's skip: the next readable sample, the first one after the damaged shard
    assert items == [plain[victims[-1] + 1] if i in victims else plain[i] for i in sampler.order().tolist()]
    assert fetches(s3, url, name) == 2  # by whichever came first (stager or worker); the others were told
    cached = {p.name for p in (tmp_path / "cache").glob("*/shard-*.tar")}
    assert cached == {entry.name for entry in dataset.shards.manifest.shards} - {name}


def test_the_loader_skips_the_damaged_shard_naming_it_once(s3, remote, packed, tmp_path, caplog):
    url, name = damaged_copy(s3, packed, tmp_path.name, "truncated")
    dataset = stoker.ShardDataset(url, storage_options=s3.options, cache_dir=tmp_path / "cache", on_error="skip")
    caplog.set_level(logging.WARNING)
    loader = stoker.Loader(dataset, 8, seed=1, threads=2)
    delivered = sum(len(labels) for _, labels in loader)
    victims = victim_samples(dataset)
    assert delivered == len(dataset) and loader.skipped == len(victims)
    skipping = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping damaged sample")]
    assert len(skipping) == 1  # one warning for the shard (stoker/data/skips.py), not one per sample
    assert any(f"{url}/{name}, sample {dataset.key(i)!r}: the object does not match the manifest" in skipping[0]
               for i in victims)
    assert fetches(s3, url, name) == 2
    raising = stoker.Loader(stoker.ShardDataset(url, storage_options=s3.options, cache_dir=tmp_path / "cache"),
                            8, seed=1, threads=2)
    with pytest.raises(CorruptDataError, match=f"{url}/{name}, sample .*damaged at the source"):
        for _ in raising:
            pass


def test_the_stager_passes_over_a_damaged_shard_and_its_readers_hear_of_it(s3, remote, packed, tmp_path):
    url, name = damaged_copy(s3, packed, tmp_path.name, "flipped")
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    cache = dataset.shards.cache
    others = [shard for shard in range(len(cache.shards)) if shard != VICTIM]
    order = np.arange(len(dataset))
    ahead = Lookahead(dataset.shards, block_bounds_of(dataset.shards), order, window=1)
    ahead.advance(0)
    try:
        deadline = time.monotonic() + 120
        while not all(cache.ready(shard) for shard in others):  # the shards after the damaged one too
            assert time.monotonic() < deadline, "the stager stopped at the damaged shard"
            time.sleep(0.05)
    finally:
        ahead.close()
    assert fetches(s3, url, name) == 2
    with pytest.raises(CorruptDataError, match=f"{url}/{name}, sample .*damaged at the source"):
        dataset[victim_samples(dataset)[0]]
    assert fetches(s3, url, name) == 2  # the reader was told by the cache, with no fetch of its own


def test_an_object_repaired_at_the_source_is_read_again(s3, remote, packed, tmp_path):
    url, name = damaged_copy(s3, packed, tmp_path.name, "flipped")
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    first = victim_samples(dataset)[0]
    with pytest.raises(CorruptDataError):
        dataset[first]
    s3.fs.pipe(f"data/{tmp_path.name}/{name}", (packed / name).read_bytes())
    fresh = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    assert fresh[first] == stoker.ShardDataset(packed, decode="raw")[first]
    assert fetches(s3, url, name) == 3


def test_a_damaged_index_object_is_named(s3, remote, packed, tmp_path):
    url, name = damaged_copy(s3, packed, tmp_path.name, "flipped", file="index")
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache",
                                  on_error="skip")
    victims = victim_samples(dataset)
    plain = stoker.ShardDataset(packed, decode="raw")
    assert dataset[victims[0]] == plain[victims[-1] + 1] and dataset.skipped == 1  # one item replaced
    raising = stoker.ShardDataset(url, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    with pytest.raises(CorruptDataError, match=f"{url}/{name}: index checksum does not match the manifest"):
        raising[victims[0]]


def test_stage_names_an_object_damaged_at_the_source(s3, remote, packed, tmp_path):
    url, name = damaged_copy(s3, packed, tmp_path.name, "truncated")
    with pytest.raises(CorruptDataError, match=f"{url}/{name}: the object does not match the manifest"):
        stage(url, tmp_path / "local", progress=False, storage_options=s3.options)
    assert fetches(s3, url, name) == 2


def test_a_copy_damaged_in_the_cache_is_fetched_again_not_blamed_on_the_source(s3, remote, packed, tmp_path):
    dataset = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    plain = stoker.ShardDataset(packed, decode="raw")
    victims = victim_samples(dataset)
    assert dataset[victims[0]] == plain[victims[0]]
    copy = dataset.shards.cache.path(VICTIM)
    os.truncate(copy, copy.stat().st_size // 2)  # the local disk's damage, not the object's
    fresh = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    assert [fresh[i] for i in victims] == [plain[i] for i in victims]
    assert copy.read_bytes() == (packed / copy.name).read_bytes()
    assert not list((dataset.shards.cache.folder / ".damaged").iterdir())
