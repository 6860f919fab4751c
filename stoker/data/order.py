"""Sample orders as pure functions of numpy arrays: blocks, quasi-random shuffles, rank shares.

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


def quasi_random_order(bounds: np.ndarray, window: int, seed: int, epoch: int, *, rank: int = 0, world_size: int = 1,
                       drop_last: bool = False, ramp: bool = True) -> np.ndarray:
    """Rank ``rank``'s share of an epoch: the blocks shuffled, cut into equal rank shares (see
    :func:`rank_share`), then each share's samples shuffled within groups of ``window`` consecutive
    blocks.

    Each block is consumed while its group is open and never again, so a reader sees ``window``
    blocks at a time instead of the whole data set. With ``ramp`` the first groups of each share
    hold 2, 4, 8, ... blocks up to ``window``: the first batch of an epoch then needs two blocks
    from a cold disk instead of ``window``, and later ones find theirs read ahead.
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
    share, share_visit, share_keys = (rank_share(a, rank, world_size, drop_last) for a in (samples, visit_of, keys))
    runs = np.concatenate([[0], np.cumsum(np.diff(share_visit) != 0)]) if len(share) else share_visit
    return share[np.lexsort((share_keys, window_groups(runs, window, ramp)))]


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


def rank_share(order: np.ndarray, rank: int, world: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of ``order``; every rank gets the same length.

    With ``drop_last`` the tail that does not divide evenly is dropped; otherwise the order is
    padded by repeating its start, as torch's DistributedSampler does.
    """
    n = len(order)
    per_rank = n // world if drop_last else -(-n // world)
    total = per_rank * world
    if total > n:
        order = np.resize(order, total)
    return order[rank * per_rank : (rank + 1) * per_rank]


def classes_per_batch(labels_in_order: np.ndarray, batch_size: int) -> float:
    """Mean number of distinct labels per batch: a simple measure of how well an order mixes classes."""
    n = len(labels_in_order) // batch_size * batch_size
    if n == 0:
        return float(len(np.unique(labels_in_order)))
    batches = np.sort(labels_in_order[:n].reshape(-1, batch_size), axis=1)
    return float(((np.diff(batches, axis=1) != 0).sum(axis=1) + 1).mean())
