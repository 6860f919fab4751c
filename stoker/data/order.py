"""Sample orders as pure functions of numpy arrays: blocks, quasi-random shuffles, ranks' positions.

Everything here is deterministic in its inputs (seed and epoch come in as arguments), so each
rank computes the same global order without talking to the others.
"""

from __future__ import annotations

import numpy as np


def block_bounds(shard_of_sample: np.ndarray, sample_start: np.ndarray, block_bytes: int) -> np.ndarray:
    """Split samples into blocks of consecutive samples within one shard, about ``block_bytes`` each.

    A sample belongs to block ``start // block_bytes`` of its shard. Returns positions
    ``bounds`` with block i holding samples ``bounds[i]:bounds[i + 1]``.
    """
    n = len(sample_start)
    if n == 0:
        return np.zeros(1, np.int64)
    block = sample_start.astype(np.int64) // block_bytes
    change = (np.diff(shard_of_sample) != 0) | (np.diff(block) != 0)
    return np.concatenate([[0], np.flatnonzero(change) + 1, [n]]).astype(np.int64)


def quasi_random_order(bounds: np.ndarray, window: int, seed: int, epoch: int, *, ramp: bool = True) -> np.ndarray:
    """The global order of an epoch, the same for any number of ranks: the blocks shuffled, then
    the samples shuffled within groups of ``window`` consecutive blocks of that shuffle.

    Each block is consumed while its group is open and never again, so readers see ``window``
    blocks at a time instead of the whole data set. With ``ramp`` the first groups hold 2, 4, 8,
    ... blocks up to ``window``: the first batch of an epoch then needs two blocks from a cold disk
    instead of ``window``, and later ones find theirs read ahead.
    """
    rng = np.random.default_rng([seed, epoch])
    sizes = np.diff(bounds)
    visit = rng.permutation(len(sizes))
    visit_sizes = sizes[visit]
    n = int(sizes.sum())
    first = np.cumsum(visit_sizes) - visit_sizes
    samples = np.repeat(bounds[visit], visit_sizes) + (np.arange(n) - np.repeat(first, visit_sizes))
    visit_of = np.repeat(np.arange(len(visit)), visit_sizes)  # each position's place in the block visit
    keys = rng.random(n)
    return samples[np.lexsort((keys, window_groups(visit_of, window, ramp)))]


def window_groups(runs: np.ndarray, window: int, ramp: bool) -> np.ndarray:
    """The group of each position, given the number of the block run it is in (0, 0, 1, 1, 1, 2, ...):
    ``window`` runs per group, the first groups 2, 4, 8, ... runs when ``ramp``."""
    window = max(1, window)
    sizes: list[int] = []
    while ramp and 2 << len(sizes) < window:
        sizes.append(2 << len(sizes))
    ramp_runs = sum(sizes)
    ramp_group = np.searchsorted(np.cumsum(sizes), runs, side="right")
    return np.where(runs < ramp_runs, ramp_group, len(sizes) + (runs - ramp_runs) // window)


def block_schedule(bounds: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blocks ``order`` touches, sorted by where each is first needed, and those positions."""
    block_of = np.searchsorted(bounds, order, side="right") - 1
    blocks, first = np.unique(block_of, return_index=True)
    by_first = np.argsort(first, kind="stable")
    return blocks[by_first], first[by_first]


def shard_schedule(starts: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shards ``order`` reads (``starts``: first global sample of each shard, then the total),
    sorted by where each is first needed, with those positions and where each is last needed."""
    shard_of = np.searchsorted(starts, order, side="right") - 1
    shards, first = np.unique(shard_of, return_index=True)
    last = len(order) - 1 - np.unique(shard_of[::-1], return_index=True)[1]
    by_first = np.argsort(first, kind="stable")
    return shards[by_first], first[by_first], last[by_first]


def sub_seed(*words: int) -> int:
    """A seed drawn from ``words`` (a seed and the numbers of a part: a source, a pass, a
    partition), independent of every other such draw, below 2**63."""
    return int(np.random.SeedSequence(list(words)).generate_state(1, np.uint64)[0] >> 1)


def rank_positions(length: int, world_size: int, rank: int, batch_size: int) -> np.ndarray:
    """Rank ``rank``'s positions in a sequence of ``length`` samples dealt to ``world_size`` ranks in
    chunks of ``batch_size``: chunk k goes to rank k % world_size as its batch k // world_size, so
    each global batch (one chunk per rank) is a contiguous slice of the sequence. A last global
    batch of fewer than ``world_size * batch_size`` samples is split near-evenly over the ranks
    (in order, sizes differing by at most one; with fewer samples than ranks the last ranks get
    none); nothing is repeated or dropped."""
    per_global = world_size * batch_size
    full, left = divmod(length, per_global)
    chunk_starts = np.arange(full, dtype=np.int64) * per_global + rank * batch_size
    positions = (chunk_starts[:, None] + np.arange(batch_size, dtype=np.int64)).ravel()
    if left:
        base, extra = divmod(left, world_size)
        first = full * per_global + rank * base + min(rank, extra)
        positions = np.concatenate([positions, np.arange(first, first + base + (rank < extra), dtype=np.int64)])
    return positions


def classes_per_batch(labels_in_order: np.ndarray, batch_size: int) -> float:
    """Mean number of distinct labels per batch: a simple measure of how well an order mixes classes."""
    n = len(labels_in_order) // batch_size * batch_size
    if n == 0:
        return float(len(np.unique(labels_in_order)))
    batches = np.sort(labels_in_order[:n].reshape(-1, batch_size), axis=1)
    return float(((np.diff(batches, axis=1) != 0).sum(axis=1) + 1).mean())
