"""Placement: which node reads which shards, as pure functions of integers and numpy arrays.

    the shards' sample counts, P  ──shard_partitions──>  P partitions of whole shards, balanced by
                                                         samples (fixed for the run: no seed, no epoch)
    P, N nodes, the placement before  ──place──>         the node of each partition: a node keeps what
                                                         it held, up to its share; the rest goes to the
                                                         nodes with the most room
    placement, node  ──node_shards──>                    the shards a node reads (and its cache holds)

A partition holds whole shards, so a node cache stages each shard on one node only. The number of
partitions is fixed for a run (a resume state records it, and which node held each): the default
is the node count times a small factor with many divisors, so that a run resumed on fewer nodes
(or on a divisor of the count) deals them out evenly. One node holds everything (one partition by
default: the order of an unplaced run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class PlacementWarning(UserWarning):
    """Nodes read each other's shards more than a placement needs: the partitions do not deal
    evenly over the nodes, or the nodes could not be told apart."""


# Partitions per node by default, the first whose product with the node count the shards allow:
# 12 nodes' worth divide evenly over 1, 2, 3, 4, 6 and 12 times fewer nodes, and over 2 and 3 times more.
FACTORS = (12, 6, 4, 3, 2, 1)


def shard_partitions(shard_samples: np.ndarray, partitions: int) -> np.ndarray:
    """The partition of each shard: whole shards, balanced by sample count. Shards are taken
    largest first (ties by number), ``partitions`` at a time, the largest of each round going to
    the partition holding the fewest samples so far; equal shards go round robin (shard s to
    partition s % P), so that each partition spans the whole data set, whatever order it was
    packed in. Partition sizes differ by about one shard at most."""
    samples = np.asarray(shard_samples, np.int64)
    by_size = np.lexsort((np.arange(len(samples)), -samples))
    load = np.zeros(partitions, np.int64)
    part = np.empty(len(samples), np.int64)
    for first in range(0, len(samples), partitions):
        shards = by_size[first : first + partitions]
        emptiest = np.argsort(load, kind="stable")[: len(shards)]
        part[shards] = emptiest
        load[emptiest] += samples[shards]
    return part


def default_partitions(shards: int, nodes: int) -> int:
    """Partitions of a run that starts on ``nodes`` nodes over ``shards`` shards: one on one node
    (the order of an unplaced run), else ``nodes`` times the first of :data:`FACTORS` the shards
    allow, or one shard each when there are fewer shards than nodes."""
    if nodes == 1:
        return 1
    return next((nodes * f for f in FACTORS if nodes * f <= shards), max(1, shards))


def place(partitions: int, nodes: int, previous: np.ndarray | None = None) -> np.ndarray:
    """The node of each partition on ``nodes`` nodes: each holds ``partitions // nodes`` or one
    more. ``previous``: the node of each partition before (another node count, say); each node
    that is still there keeps what it held, up to its share (lowest partitions first), and the
    partitions of nodes gone, or over a node's share, go one at a time (lowest first) to the node
    with the most room (the lowest on ties), so as few as possible move. Without ``previous``:
    partition p on node p % nodes."""
    if previous is None:
        return np.arange(partitions, dtype=np.int64) % nodes
    held = np.asarray(previous, np.int64).copy()
    held[held >= nodes] = -1
    counts = np.bincount(held[held >= 0], minlength=nodes)
    share = np.full(nodes, partitions // nodes, np.int64)
    # The larger shares go to the nodes that hold the most already: fewer partitions move.
    share[np.lexsort((np.arange(nodes), -counts))[: partitions % nodes]] += 1
    for node in np.flatnonzero(counts > share):
        held[np.flatnonzero(held == node)[share[node] :]] = -1
    room = share - np.bincount(held[held >= 0], minlength=nodes)
    for p in np.flatnonzero(held < 0):
        most = int(np.argmax(room))
        held[p] = most
        room[most] -= 1
    return held


def node_shards(shard_samples: np.ndarray, partitions: int, node_of: np.ndarray, node: int) -> np.ndarray:
    """The shards node ``node`` reads when partition p is on node ``node_of[p]`` (sorted)."""
    return np.flatnonzero(np.asarray(node_of)[shard_partitions(shard_samples, partitions)] == node)


def even_node_counts(partitions: int) -> list[int]:
    """The node counts that deal ``partitions`` evenly (its divisors)."""
    return [n for n in range(1, partitions + 1) if partitions % n == 0]


@dataclass(frozen=True)
class Placement:
    """The node of each partition (``node_of``) on ``nodes`` nodes; ``split``: the partitions a node
    held when the run was placed, which it reads together, each with that fraction of the order's
    window open (so a node keeps about ``window`` blocks open); and where the placement came from
    (for explain()): ``before``, the node of each partition in the state it was placed from (on
    ``before_nodes`` nodes), or None."""

    nodes: int
    node_of: tuple[int, ...]
    split: int = 1
    before: tuple[int, ...] | None = None
    before_nodes: int = 1

    @classmethod
    def of(cls, partitions: int, nodes: int, before: tuple[int, ...] | None = None, before_nodes: int = 1,
           split: int | None = None) -> Placement:
        """``partitions`` placed on ``nodes`` nodes (see :func:`place`), from ``before`` where given;
        ``split`` as a state recorded it, else the partitions each node holds now."""
        previous = None if before is None else np.array(before, np.int64)
        split = max(1, partitions // nodes) if split is None else split
        return cls(nodes, tuple(int(n) for n in place(partitions, nodes, previous)), split, before, before_nodes)

    @property
    def partitions(self) -> int:
        return len(self.node_of)

    def held_by(self, node: int) -> np.ndarray:
        """The partitions of node ``node``."""
        return np.flatnonzero(np.array(self.node_of) == node)

    def describe(self, node: int) -> str:
        """Node ``node``'s partitions in words, and why it holds them."""
        mine = self.held_by(node)
        listed = _ranges(mine) if len(mine) else "none"
        if self.before is None:
            why = "partition p on node p % nodes" if len(mine) else "fewer partitions than nodes"
            return f"node {node}: partitions {listed} ({why})"
        before = np.array(self.before)
        kept = int((before[mine] == node).sum())
        moved = [f"{int((before[mine] == n).sum())} from node {n}{' (gone)' if n >= self.nodes else ''}"
                 for n in np.unique(before[mine]) if n != node]
        reasons = [f"kept {kept}", *moved] if kept or moved else ["fewer partitions than nodes"]
        return f"node {node}: partitions {listed} ({', '.join(reasons)})"


def _ranges(values: np.ndarray) -> str:
    """Sorted integers as runs: ``0-3, 8, 12-15``."""
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    runs = np.split(values, breaks)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)
