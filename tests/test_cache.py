"""The node cache (``cache_dir=``, ``cache_limit=``) and its stager, over a local folder and over
a real S3-compatible server (moto, on localhost, in its own process): byte-exact reads through
ShardDataset, DataLoader workers and stoker.Loader; the limit held while running; one fetch per
shard across processes; damaged copies fetched again; a stopped server; a killed fetcher."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from dataclasses import replace
from queue import Empty

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.data.readahead import open_blocks
from stoker.errors import RemoteError
from stoker.format import file_checksum, read_manifest
from stoker.storage.cache import ShardCache
from stoker.storage.locks import exclusive, is_locked
from stoker.storage.settings import StorageSettings
from tests.s3server import S3Server


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Metadata folders under this test's tmp_path, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def as_list(batch):
    return list(batch)


def shard_bytes(packed) -> list[int]:
    return [entry.bytes for entry in read_manifest(packed).shards]


def cached_copies(cache_dir) -> dict[str, bytes]:
    """The complete shard copies in a cache folder, by name."""
    return {p.name: p.read_bytes() for p in cache_dir.glob("*/shard-*.tar")}


def read_with_sampler(dataset, context="fork", seed=0):
    """Items in the order a QuasiRandomSampler gives, through a DataLoader with 2 workers, and that order."""
    sampler = stoker.QuasiRandomSampler(dataset, seed=seed, window=2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                                         multiprocessing_context=context, collate_fn=as_list)
    order = sampler.order().tolist()
    return [item for batch in loader for item in batch], order


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_local_data_through_a_cache_is_byte_exact_and_the_cache_fills(packed, tmp_path, context):
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=tmp_path / "cache")
    items, order = read_with_sampler(dataset, context)
    plain = stoker.ShardDataset(packed, decode="raw")
    assert items == [plain[i] for i in order]
    assert cached_copies(tmp_path / "cache") == {p.name: p.read_bytes() for p in packed.glob("*.tar")}
    again, order = read_with_sampler(dataset, context, seed=1)
    assert again == [plain[i] for i in order]


def test_a_shard_no_stager_of_the_node_reads_is_read_in_place(packed, tmp_path):
    """Another node's shard, read for a few samples at an epoch's end, is not fetched whole: with a
    stager living on the node whole copies are made only of the shards some stager will read."""
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=tmp_path / "cache")
    cache, plain = dataset.shards.cache, stoker.ShardDataset(packed, decode="raw")
    first_of = [int(start) for start in dataset.shards.starts[:-1]]
    assert cache.wanted_whole(1)  # no stager: a reader fetches what it reads (a random order fills the cache)
    needs = cache.needs(np.array([0]), np.array([0]), np.array([5]))  # a stager of the node reads shard 0 only
    try:
        assert cache.wanted_whole(0) and not cache.wanted_whole(1)
        assert dataset[first_of[1]] == plain[first_of[1]] and dataset[first_of[0]] == plain[first_of[0]]
        assert set(cached_copies(tmp_path / "cache")) == {read_manifest(packed).shards[0].name}
    finally:
        needs.close()
    assert cache.wanted_whole(1)


def test_remote_data_through_a_cache_fetches_each_shard_once(s3, remote, packed, tmp_path):
    shards = len(shard_bytes(packed))
    before = s3.gets(".tar")
    dataset = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options, cache_dir=tmp_path / "cache")
    items, order = read_with_sampler(dataset)
    plain = stoker.ShardDataset(packed, decode="raw")
    assert items == [plain[i] for i in order]
    assert s3.gets(".tar") - before == shards  # whole shards, once each, no range reads
    read_with_sampler(dataset, seed=1)
    assert s3.gets(".tar") - before == shards  # the second epoch reads only the cache


@pytest.mark.parametrize("processes", [0, 2])
def test_loader_over_remote_data_with_a_cache(s3, remote, packed, tmp_path, processes):
    there = stoker.Loader(stoker.ShardDataset(remote, storage_options=s3.options, cache_dir=tmp_path / "cache"),
                          16, seed=3, threads=2, processes=processes, mp_context="fork")
    here = stoker.Loader(stoker.ShardDataset(packed), 16, seed=3, threads=2)
    for _ in range(2):
        for (a, la), (b, lb) in zip(there, here, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)
    assert cached_copies(tmp_path / "cache") == {p.name: p.read_bytes() for p in packed.glob("*.tar")}


def watch_usage(folder, stop, peaks):
    """Record the bytes of shard copies and partial copies in the cache folder, as often as
    possible, until ``stop``."""
    while not stop.is_set():
        total = 0
        for path in [*folder.glob("shard-*"), *folder.glob(".partial-*")]:
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        peaks.append(total)


def deleted_copies_open(folder) -> list[str]:
    """This process's open descriptors of files under ``folder`` that were deleted (evicted)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return [link for link in links if link.startswith(str(folder)) and link.endswith("(deleted)")]


def test_evicted_copies_do_not_stay_open(packed, tmp_path):
    sizes = shard_bytes(packed)
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=tmp_path / "cache", cache_limit=4 * max(sizes) + 100)
    loader = stoker.Loader(stoker.ShardDataset(packed, cache_dir=tmp_path / "cache", cache_limit=4 * max(sizes) + 100),
                           8, threads=2)
    for _ in loader:
        pass
    folder = loader.dataset.shards.cache.folder
    time.sleep(1.1)
    loader.dataset.shards.reader(0)  # any read sweeps the open copies at most once a second
    assert deleted_copies_open(folder) == []
    assert dataset.shards.cache.limit == loader.dataset.shards.cache.limit


def test_the_default_limit_is_fixed_when_the_folder_is_made(packed, tmp_path):
    shards, settings = read_manifest(packed).shards, StorageSettings(cache_dir=tmp_path / "cache")
    first = ShardCache(packed, shards, settings)
    (tmp_path / "cache" / "filler").write_bytes(b"\0" * (1 << 20))  # free space changes
    again = ShardCache(packed, shards, settings)
    assert again.limit == first.limit and not again.holds_part  # and the order ignores it
    small = ShardCache(packed, shards, replace(settings, cache_limit=1000))
    assert small.holds_part


def read_with_a_file_size_limit(packed, cache_dir, queue):
    """A process whose files may not grow past 100 KB: every copy into the cache fails to write."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=cache_dir)
    queue.put([dataset[i] for i in range(len(dataset))])


def test_a_cache_that_cannot_be_written_falls_back_to_the_source(packed, tmp_path, caplog):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    reader = context.Process(target=read_with_a_file_size_limit, args=(packed, tmp_path / "cache", queue))
    reader.start()
    items = queue.get(timeout=60)
    reader.join(30)
    plain = stoker.ShardDataset(packed, decode="raw")
    assert items == [plain[i] for i in range(len(plain))]
    assert not list((tmp_path / "cache").glob("*/shard-*.tar"))


def test_a_full_disk_under_the_cache_falls_back_to_the_source(s3, remote, packed, small_disk, caplog, monkeypatch):
    """Object-store shards downloaded in parts (64 KiB here) onto a tmpfs that fills up part-way:
    each sample still comes, from the source; the warning names the copy and the reason, and no
    partial copy is left."""
    monkeypatch.setattr("stoker.storage.remote.DOWNLOAD_PART", 64 << 10)
    (small_disk / "filler").write_bytes(bytes(2_600_000))  # of 3 MB: less room left than a shard's 600 KB
    dataset = stoker.ShardDataset(remote, decode="raw", storage_options=s3.options, cache_dir=small_disk / "cache",
                                  cache_limit=1 << 30)
    plain = stoker.ShardDataset(packed, decode="raw")
    assert [dataset[i] for i in range(len(dataset))] == [plain[i] for i in range(len(plain))]
    assert "cannot write the copy (No space left on device)" in caplog.text and ".partial-shard-" in caplog.text
    assert not list((small_disk / "cache").rglob(".partial-*"))


@pytest.mark.parametrize("reader", ["loader", "dataloader"])
def test_a_limit_smaller_than_the_data_set_is_never_exceeded(s3, remote, packed, tmp_path, reader):
    sizes = shard_bytes(packed)
    limit = 4 * max(sizes) + 100  # room for 4 of the shards
    assert limit < sum(sizes) / 2
    dataset = stoker.ShardDataset(remote, decode="raw" if reader == "dataloader" else "pil",
                                  storage_options=s3.options, cache_dir=tmp_path / "cache", cache_limit=limit)
    folder = dataset.shards.cache.folder
    before = s3.gets(".tar")
    stop, peaks = threading.Event(), []
    watcher = threading.Thread(target=watch_usage, args=(folder, stop, peaks))
    watcher.start()
    try:
        if reader == "loader":
            loader = stoker.Loader(dataset, 8, seed=2, threads=2)
            got = sorted(label for _, labels in loader for label in labels.tolist())
            assert got == sorted(stoker.ShardDataset(packed).targets.tolist())
        else:
            items, order = read_with_sampler(dataset)
            plain = stoker.ShardDataset(packed, decode="raw")
            assert items == [plain[i] for i in order]
    finally:
        stop.set()
        watcher.join()
    assert len(peaks) > 10 and max(peaks) <= limit
    assert max(peaks) > 2 * max(sizes)  # the cache was used, not bypassed
    assert s3.gets(".tar") - before >= len(sizes)  # shards left and came back in time
    assert open_blocks(dataset.shards, 16) == 2  # whole shards shuffled, two open: half of the limit


def read_all_in_a_process(url, options, cache_dir, xdg, queue):
    os.environ["XDG_CACHE_HOME"] = xdg
    dataset = stoker.ShardDataset(url, decode="raw", storage_options=options, cache_dir=cache_dir)
    queue.put([dataset[i] for i in range(len(dataset))])


def test_two_processes_sharing_a_cache_fetch_each_shard_once(s3, remote, packed, tmp_path):
    before = s3.gets(".tar")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    readers = [context.Process(target=read_all_in_a_process,
                               args=(remote, s3.options, tmp_path / "cache", os.environ["XDG_CACHE_HOME"], queue))
               for _ in range(2)]
    for process in readers:
        process.start()
    results = []
    while len(results) < len(readers):
        try:
            results.append(queue.get(timeout=1))
        except Empty:
            assert all(p.is_alive() for p in readers), "a reader process failed"
    for process in readers:
        process.join(timeout=30)
    plain = stoker.ShardDataset(packed, decode="raw")
    expected = [plain[i] for i in range(len(plain))]
    assert results == [expected, expected]
    assert s3.gets(".tar") - before == len(shard_bytes(packed))


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_damaged_cached_copy_is_fetched_again(s3, remote, packed, tmp_path, where):
    source = packed if where == "local" else remote
    options = s3.options if where == "remote" else None
    dataset = stoker.ShardDataset(source, decode="raw", storage_options=options, cache_dir=tmp_path / "cache")
    read_with_sampler(dataset)
    victim = sorted((tmp_path / "cache").glob("*/shard-*.tar"))[1]
    with open(victim, "r+b") as f:  # one bit flipped in place, as a failing disk or a stray write would
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x10]))
    before = s3.gets(f"/data/packed/{victim.name}")
    fresh = stoker.ShardDataset(source, decode="raw", storage_options=options, cache_dir=tmp_path / "cache")
    plain = stoker.ShardDataset(packed, decode="raw")
    assert [fresh[i] for i in range(len(fresh))] == [plain[i] for i in range(len(plain))]
    assert victim.read_bytes() == (packed / victim.name).read_bytes()
    if where == "remote":
        assert s3.gets(f"/data/packed/{victim.name}") == before + 1


def hold_a_fetch_and_wait(cache, shard, ready):
    """Stand-in for a process killed while fetching: it holds the shard's lock and left a partial."""
    with exclusive(cache.folder / ".locks" / cache.shards[shard].name):
        (cache.folder / f".partial-{cache.shards[shard].name}").write_bytes(b"\0" * 1000)
        ready.set()
        time.sleep(600)


def test_a_killed_fetcher_leaves_nothing_that_blocks_the_next_run(packed, tmp_path):
    cache = ShardCache(packed, read_manifest(packed).shards, StorageSettings(cache_dir=tmp_path / "cache"))
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    fetcher = context.Process(target=hold_a_fetch_and_wait, args=(cache, 0, ready))
    fetcher.start()
    assert ready.wait(30)
    assert is_locked(cache.folder / ".locks" / cache.shards[0].name)
    os.kill(fetcher.pid, signal.SIGKILL)
    fetcher.join()
    dataset = stoker.ShardDataset(packed, decode="raw", cache_dir=tmp_path / "cache")
    assert not list(dataset.shards.cache.folder.glob(".partial-*"))
    plain = stoker.ShardDataset(packed, decode="raw")
    assert [dataset[i] for i in range(len(dataset))] == [plain[i] for i in range(len(plain))]
    assert file_checksum(cache.path(0)) == cache.shards[0].checksum


@pytest.mark.parametrize("cache", [True, False])
def test_a_server_stopped_mid_epoch_gives_retries_then_a_clear_error(packed, tmp_path, caplog, cache):
    """Transport errors are never damaged data: with on_error="skip" nothing is skipped past them."""
    server = S3Server(tmp_path / "requests.log")
    server.fs.mkdir("data")
    server.fs.put(str(packed) + "/", "data/packed", recursive=True)
    dataset = stoker.ShardDataset("s3://data/packed", decode="raw", storage_options=server.options, on_error="skip",
                                  cache_dir=tmp_path / "cache" if cache else None, read_timeout=5.0)
    assert dataset[0]
    server.stop()
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://data/packed/shard-\d+\.tar( \(bytes \d+-\d+\))?: failed after \d+ attempts"):
        dataset[len(dataset) - 1]
    assert time.monotonic() - start < 60
    assert "retrying" in caplog.text and dataset.skipped == 0


def test_bad_credentials_for_a_reader_are_a_clear_error(packed, tmp_path):
    server = S3Server(tmp_path / "requests.log", auth=True)
    try:
        server.fs.mkdir("data")
        server.fs.put(str(packed) + "/", "data/packed", recursive=True)
        assert stoker.ShardDataset("s3://data/packed", storage_options=server.options)
        wrong = {**server.options, "key": "AKIAWRONGWRONGWRONG1", "secret": "wrong"}
        with pytest.raises(RemoteError, match=r"s3://data/packed/stoker.json: access denied"):
            stoker.ShardDataset("s3://data/packed", storage_options=wrong, cache_dir=tmp_path / "cache")
    finally:
        server.stop()


def run_then_sleep(running) -> None:
    running.set()
    time.sleep(600)


@pytest.mark.parametrize("inherit", [False, True])
def test_a_forked_child_keeps_a_lock_only_when_asked(tmp_path, inherit):
    """A DataLoader worker forked while the stager holds a shard's lock must not hold it for its whole
    life; a pack's worker processes must (they keep the destination locked until the last is gone)."""
    path = tmp_path / "lock"
    context = multiprocessing.get_context("fork")
    running = context.Event()
    with exclusive(path, inherit=inherit):
        child = context.Process(target=run_then_sleep, args=(running,))
        child.start()
    try:
        assert running.wait(120)  # its fork hooks, which close what it must not keep, have run
        assert is_locked(path) == inherit
    finally:
        child.kill()
        child.join()
