"""Batches as rows of examples: split a batch into its leaves, keep recent batches, and draw a new
batch from rows of several of them, for example-level echoing."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

Leaf = torch.Tensor | np.ndarray


def flatten(batch: Any) -> tuple[list[Leaf], Callable[[list[Leaf]], Any]]:
    """The tensors and arrays of ``batch`` (itself one, or tuples, lists and dicts of them, nested),
    and a function that builds a batch of the same structure from new leaves."""
    if isinstance(batch, torch.Tensor | np.ndarray):
        return [batch], lambda leaves: leaves[0]
    if isinstance(batch, tuple | list):
        parts = [flatten(item) for item in batch]
        return _join(parts, lambda items: type(batch)(items) if isinstance(batch, list) else _same_tuple(batch, items))
    if isinstance(batch, dict):
        keys = list(batch)
        parts = [flatten(batch[key]) for key in keys]
        return _join(parts, lambda items: dict(zip(keys, items, strict=True)))
    raise TypeError(f"example echoing needs batches of tensors or numpy arrays (in tuples, lists or dicts), "
                    f"got {type(batch).__name__}; use mode='batch' for other batches")


def _same_tuple(template: tuple, items: list) -> tuple:
    return type(template)(*items) if hasattr(template, "_fields") else tuple(items)  # namedtuples too


def _join(parts: list, make: Callable[[list], Any]) -> tuple[list[Leaf], Callable[[list[Leaf]], Any]]:
    leaves = [leaf for part_leaves, _ in parts for leaf in part_leaves]
    sizes = [len(part_leaves) for part_leaves, _ in parts]

    def rebuild(new: list[Leaf]) -> Any:
        items, start = [], 0
        for (_, build), size in zip(parts, sizes, strict=True):
            items.append(build(new[start : start + size]))
            start += size
        return make(items)

    return leaves, rebuild


def examples_in(batch: Any) -> int:
    """Examples in ``batch``: its first dimension, or 1 for a batch that is not made of tensors or arrays."""
    try:
        return batch_size(flatten(batch)[0])
    except (TypeError, ValueError):
        return 1


def batch_size(leaves: list[Leaf]) -> int:
    """The number of examples in a batch: the first dimension, the same for every leaf."""
    sizes = {len(leaf) for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"example echoing needs every tensor of a batch to have the same first dimension, got {sorted(sizes)}")
    return sizes.pop()


class ExampleBuffer:
    """The most recent fresh batches (up to ``capacity`` examples) and how often each of their
    examples has been served; :meth:`draw` makes a batch of examples picked at random among those
    served fewer than ``limit`` times. With ``keep_below``, a batch is kept past the capacity until
    each of its examples has been served that often."""

    def __init__(self, capacity: int, rng: np.random.Generator, keep_below: int | None = None) -> None:
        self.capacity = capacity
        self.rng = rng
        self.keep_below = keep_below
        self._batches: deque[tuple[list[Leaf], Callable, np.ndarray]] = deque()
        self._size = 0

    def add(self, leaves: list[Leaf], rebuild: Callable) -> None:
        """Keep a fresh batch, whose examples have been served once; the oldest batches go when
        the buffer holds more than its capacity."""
        n = batch_size(leaves)
        self._batches.append((leaves, rebuild, np.ones(n, dtype=np.int32)))
        self._size += n
        while self._size > self.capacity and len(self._batches) > 1:
            if self.keep_below is not None and np.any(self._batches[0][2] < self.keep_below):
                break
            self._size -= len(self._batches.popleft()[2])

    def available(self, limit: int) -> int:
        """How many examples have been served fewer than ``limit`` times."""
        return sum(int(np.count_nonzero(counts < limit)) for _, _, counts in self._batches)

    def draw(self, n: int, limit: int) -> Any | None:
        """A batch of ``n`` examples served fewer than ``limit`` times (fewer when fewer are left),
        each picked at most once, counted as served once more; None when none is left."""
        where = [(b, np.flatnonzero(counts < limit)) for b, (_, _, counts) in enumerate(self._batches)]
        total = sum(len(rows) for _, rows in where)
        if total == 0:
            return None
        chosen = np.sort(self.rng.choice(total, size=min(n, total), replace=False))
        offsets = np.cumsum([0] + [len(rows) for _, rows in where])
        parts = []
        for b, rows in where:
            lo, hi = np.searchsorted(chosen, [offsets[b], offsets[b + 1]])
            if hi > lo:
                picked = rows[chosen[lo:hi] - offsets[b]]
                self._batches[b][2][picked] += 1
                parts.append((b, picked))
        # Shuffle across source batches, so an echoed batch is not sorted by when its examples arrived.
        order = self.rng.permutation(sum(len(p) for _, p in parts))
        template_leaves, rebuild, _ = self._batches[parts[0][0]]
        leaves = []
        for k in range(len(template_leaves)):
            pieces = [_take(self._batches[b][0][k], picked) for b, picked in parts]
            leaves.append(_take(_concat(pieces), order))
        return rebuild(leaves)


def _take(leaf: Leaf, rows: np.ndarray) -> Leaf:
    if isinstance(leaf, torch.Tensor):
        return leaf[torch.from_numpy(rows).to(leaf.device)]
    return leaf[rows]


def _concat(pieces: list[Leaf]) -> Leaf:
    if len(pieces) == 1:
        return pieces[0]
    tensors = [piece for piece in pieces if isinstance(piece, torch.Tensor)]  # a leaf's pieces are all of one kind
    return torch.cat(tensors) if tensors else np.concatenate(pieces)
