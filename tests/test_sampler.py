"""QuasiRandomSampler and the pure order functions behind it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.data.order import block_bounds, classes_per_batch, quasi_random_order, rank_positions
from stoker.data.readahead import BlockReadahead
from stoker.errors import OptionError
from stoker.storage import evict, willneed
from stoker.storage.pagecache import _readahead_cap


def test_block_bounds_never_cross_shards_or_blocks():
    shard = np.array([0, 0, 0, 0, 1, 1, 1])
    start = np.array([0, 5, 12, 21, 0, 3, 30])
    assert block_bounds(shard, start, 10).tolist() == [0, 2, 3, 4, 6, 7]
    assert block_bounds(np.zeros(0, np.int64), np.zeros(0, np.int64), 10).tolist() == [0]


def block_sizes(n_blocks: int, rng) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(rng.integers(1, 40, n_blocks))])


@pytest.mark.parametrize("window", [1, 3, 16])
def test_each_epoch_is_a_permutation_that_opens_window_blocks_at_a_time(window):
    bounds = block_sizes(50, np.random.default_rng(0))
    n = int(bounds[-1])
    block_of = np.repeat(np.arange(50), np.diff(bounds))
    order = quasi_random_order(bounds, window, seed=1, epoch=0)
    assert sorted(order.tolist()) == list(range(n))
    # Walk the order: a block, once left behind (all its samples consumed), is never read again,
    # and at most `window` blocks are open (started but not finished) at any time.
    remaining = np.diff(bounds).copy()
    open_blocks = set()
    for sample in order:
        block = block_of[sample]
        open_blocks.add(block)
        remaining[block] -= 1
        assert len(open_blocks) <= window
        if remaining[block] == 0:
            open_blocks.remove(block)


def test_an_epoch_opens_2_4_8_blocks_first_then_its_window():
    """The ramp: the first groups of a share hold 2, 4, 8 blocks, so the first batch of an epoch
    needs two blocks from a cold disk, not the whole window; without it, the window at once."""
    bounds = np.arange(0, 64 * 10 + 1, 10)  # 64 blocks of 10 samples
    block_of = np.repeat(np.arange(64), 10)
    for ramp, sizes in ((True, [2, 4, 8, 16, 16, 16, 2]), (False, [16, 16, 16, 16])):
        order = quasi_random_order(bounds, 16, seed=3, epoch=0, ramp=ramp)
        groups, at = [], 0
        for size in sizes:  # the blocks of each group fill its positions, and no others
            blocks = block_of[order[at : at + 10 * size]]
            groups.append(len(set(blocks.tolist())))
            at += 10 * size
        assert groups == sizes and at == len(order)


def test_orders_depend_on_seed_and_epoch_only():
    bounds = block_sizes(30, np.random.default_rng(1))
    a = quasi_random_order(bounds, 4, seed=5, epoch=2)
    assert np.array_equal(a, quasi_random_order(bounds, 4, seed=5, epoch=2))
    assert not np.array_equal(a, quasi_random_order(bounds, 4, seed=5, epoch=3))
    assert not np.array_equal(a, quasi_random_order(bounds, 4, seed=6, epoch=2))


@pytest.mark.parametrize("n, world, batch", [(100, 1, 1), (100, 3, 1), (101, 4, 1), (7, 8, 1), (100, 3, 4),
                                             (101, 4, 8), (7, 2, 16), (96, 3, 8)])
def test_rank_positions_deal_every_position_once_in_contiguous_global_batches(n, world, batch):
    parts = [rank_positions(n, world, r, batch) for r in range(world)]
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(n))  # nothing repeated, nothing left out
    assert max(map(len, parts)) - min(map(len, parts)) <= batch  # at most one step apart
    steps = [np.array_split(part, range(batch, len(part), batch)) if len(part) else [] for part in parts]
    for step in range(max(map(len, steps))):
        chunks = [s[step] for s in steps if step < len(s)]
        sizes = [len(c) for c in chunks]
        assert max(sizes) - min(sizes) <= 1  # the short last global batch: near-even
        together = np.concatenate(chunks)  # ranks in order: one contiguous slice of the sequence
        assert np.array_equal(together, np.arange(together[0], together[0] + len(together)))


def test_sampler_on_a_real_data_set(packed):
    dataset = stoker.ShardDataset(packed, decode="raw", block_bytes=256 << 10)
    sampler = stoker.QuasiRandomSampler(dataset, window=2, seed=0)
    assert len(sampler.bounds) - 1 > len(dataset.shards.manifest.shards)  # several blocks per shard
    first = list(sampler)
    assert sorted(first) == list(range(len(dataset))) and len(sampler) == len(dataset)
    sampler.set_epoch(1)
    assert list(sampler) != first
    shares = [list(stoker.QuasiRandomSampler(dataset, seed=0, num_replicas=3, rank=r)) for r in range(3)]
    assert len({len(s) for s in shares}) == 1 and set().union(*shares) == set(range(len(dataset)))
    with pytest.raises(OptionError, match=r"rank=3: must be an integer from 0 to 2 \(num_replicas=3\)"):
        stoker.QuasiRandomSampler(dataset, num_replicas=3, rank=3)


def test_mixing_against_a_full_shuffle():
    labels = np.repeat(np.arange(100), 200)  # packed in class order: the hard case
    bounds = np.arange(0, len(labels) + 1, 50)  # blocks of 50 samples
    full = classes_per_batch(labels[np.random.default_rng(0).permutation(len(labels))], 64)
    quasi = classes_per_batch(labels[quasi_random_order(bounds, 16, 0, 0)], 64)
    sequential = classes_per_batch(labels, 64)
    assert sequential < 2.1 < quasi < full
    assert quasi > 0.25 * full  # 16 open blocks give ~12 classes per batch of 64 against ~48
    shuffled_pack = np.random.default_rng(1).permutation(labels)
    assert classes_per_batch(shuffled_pack[quasi_random_order(bounds, 16, 0, 0)], 64) > 0.95 * full


def resident_bytes(path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip() or 0)


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_readahead_brings_the_next_blocks_into_the_page_cache(packed):
    dataset = stoker.ShardDataset(packed, decode="raw", block_bytes=128 << 10)
    sampler = stoker.QuasiRandomSampler(dataset, window=1, seed=2)
    order = sampler.order()
    files = [packed / s.name for s in dataset.shards.manifest.shards]
    evict(files)
    if any(resident_bytes(f) for f in files):
        pytest.skip("this file system keeps pages that posix_fadvise(DONTNEED) should drop (tmpfs?)")
    readahead = BlockReadahead(dataset.shards, sampler.bounds, order, window=1)
    readahead.ahead = 1  # only the block of order[0] is needed within 1 sample
    readahead.advance(0)
    shard, _ = dataset.shards.locate(int(order[0]))
    block = np.searchsorted(sampler.bounds, order[0], side="right") - 1
    shard_start = int(dataset.shards.starts[shard])
    start, end = dataset.shards.index(shard).span(int(sampler.bounds[block]) - shard_start,
                                                  int(sampler.bounds[block + 1]) - 1 - shard_start)
    wait_until = time.monotonic() + 120  # the disk's pace, whatever it is: only pages never read fail
    while resident_bytes(files[shard]) < (end - start) * 0.9 and time.monotonic() < wait_until:
        time.sleep(0.05)
    assert resident_bytes(files[shard]) >= (end - start) * 0.9
    assert sum(resident_bytes(f) for i, f in enumerate(files) if i != shard) == 0


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
def test_willneed_reads_a_range_larger_than_the_kernel_reads_per_call(tmp_path):
    cap = _readahead_cap(os.stat(tmp_path).st_dev)
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(3 * cap + 12345))
    evict([path])
    if resident_bytes(path):
        pytest.skip("this file system keeps pages that posix_fadvise(DONTNEED) should drop (tmpfs?)")
    fd = os.open(path, os.O_RDONLY)
    try:
        willneed(fd, 0, path.stat().st_size)  # one posix_fadvise call would read only the first `cap` bytes
        deadline = time.monotonic() + 120
        while resident_bytes(path) < path.stat().st_size and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.close(fd)
    assert resident_bytes(path) >= path.stat().st_size


def test_sampler_resumes_twice_in_an_epoch_through_dataloader_workers(packed):
    dataset = stoker.ShardDataset(packed, decode="raw")
    whole = list(stoker.QuasiRandomSampler(dataset, seed=5))
    sampler = stoker.QuasiRandomSampler(dataset, seed=5)
    sampler.load_state_dict(stoker.QuasiRandomSampler(dataset, seed=5).state_dict(samples_done=40))
    assert len(sampler) == len(whole) - 40
    loader = torch.utils.data.DataLoader(range(len(dataset)), batch_size=10, sampler=sampler, num_workers=2)
    seen = []
    for step, batch in enumerate(loader, 1):
        seen += batch.tolist()
        if step == 3:
            state = sampler.state_dict(samples_done=step * 10)  # the workers have fetched further ahead
            break
    assert seen == whole[40:70] and state["samples_done"] == 70
    again = stoker.QuasiRandomSampler(dataset, seed=5)
    again.load_state_dict(state)
    again.set_epoch(0)  # the training loop's call for the epoch it resumes keeps the position
    assert list(again) == whole[70:] and len(again) == len(whole), "after a finished pass, len is the whole share"
    again.set_epoch(1)
    assert len(list(again)) == len(whole)
    assert again.state_dict(samples_done=len(whole) + 5)["samples_done"] == len(whole)  # a last, partial batch
    with pytest.raises(ValueError, match="samples_done=97 is outside the epoch of 96 samples"):
        again.load_state_dict({**state, "samples_done": len(whole) + 1})
