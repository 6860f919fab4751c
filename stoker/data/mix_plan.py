"""The order of a weighted mixture of data sets, as pure functions of numpy arrays and integers.

    weights, chunk sizes, samples each source gave so far  ──allocate──>  per chunk: each source's count
    each source's own order (its partitions' passes, one shuffle each)  ──streams──>  the next samples
        of each source from the chunk's node (epoch.py deals chunk k to rank k % W as its batch k // W)
    counts + streams  ──interleave──>  the mixed sequence, chunk after chunk (MixOrder: an EpochOrder)

The chunks are the ranks' batches as :meth:`stoker.data.epoch.RankBatches.chunks` deals them:
whole ones of the per-rank batch size, then the near-even parts of a short last global batch.
Every chunk of ``b`` samples, short ones included, is stratified: source i gets floor(w_i * b) samples, and the chunk's remainder
goes one sample each to the sources with the largest accumulated deficit (w_i * samples so far -
source i's samples so far), among those whose w_i * b is not a whole number; ties go to the source
listed first. So a chunk's count of source i differs from w_i * b by less than one sample. The
arithmetic is exact (the weights as fractions), so every rank and every restart computes the same
chunks. The deficit at any point is a function of the samples each source gave until then: a resume
from per-source counts continues the same allocation, whatever batch size the run had before.

An epoch has a stated length (:meth:`MixSpec.length`), whatever the chunks: ``epoch_size`` samples,
or with ``exhausted="end"`` fewer, ending where a source's share would reach its size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Literal

import numpy as np

from stoker.data.epoch import BlockOrder, Order, SourceBlocks, dealt_sequence
from stoker.data.order import sub_seed
from stoker.data.placement import shard_partitions

Exhausted = Literal["repeat", "end"]
EXHAUSTED = ("repeat", "end")


@dataclass(frozen=True)
class MixSpec:
    """What decides a mixture's epochs besides seed, epoch and batches: the sources' sizes, their
    weights (exact: integer numerators over their sum), the epoch's length in samples and what a
    source that runs out does (``repeat``: its next pass, shuffled anew; ``end``: the epoch ends)."""

    sizes: tuple[int, ...]
    weights: tuple[int, ...]
    epoch_size: int
    exhausted: Exhausted

    @property
    def total_weight(self) -> int:
        return sum(self.weights)

    def fractions(self) -> tuple[Fraction, ...]:
        """Each source's share of the mix, exactly."""
        return tuple(Fraction(w, self.total_weight) for w in self.weights)

    def length(self) -> int:
        """Samples per epoch, the same for any chunks: ``epoch_size``; with ``exhausted="end"`` at
        most the largest n where every source's share of n is below its size (w_i * n < size_i), so
        that no source gives more than one pass, whatever the chunks (a source's count never
        exceeds its share by a sample or more, see :func:`allocate`)."""
        if self.exhausted == "repeat":
            return self.epoch_size
        room = (-(-size * self.total_weight // w) - 1 for size, w in zip(self.sizes, self.weights))
        return min(self.epoch_size, *room)


def exact_weights(weights: Sequence[float]) -> tuple[int, ...]:
    """``weights`` (positive numbers, as given) as integer numerators of their exact ratios: the
    floats' own binary fractions over a common denominator, reduced. No rounding: 0.7 and 0.3 are
    the doubles 0.7 and 0.3, whose sum is the denominator."""
    exact = [Fraction(w) for w in weights]
    denominator = math.lcm(*(f.denominator for f in exact))
    numerators = [int(f * denominator) for f in exact]
    common = math.gcd(*numerators)
    return tuple(n // common for n in numerators)


def allocate(weights: Sequence[int], chunks: Sequence[int] | np.ndarray, consumed: Sequence[int]) -> np.ndarray:
    """Per chunk (``chunks``: their sizes), how many samples each source gives: an int64 array
    (chunks, sources), each row summing to its chunk's size.

    ``weights``: integer numerators (see :func:`exact_weights`); ``consumed``: samples each source
    gave before the first chunk (the deficits carry on from there)."""
    total = sum(weights)
    deficit = [w * sum(consumed) - total * c for w, c in zip(weights, consumed)]  # in units of 1 / total
    counts = np.empty((len(chunks), len(weights)), np.int64)
    for k, batch in enumerate(int(b) for b in chunks):
        row = [w * batch // total for w in weights]
        frac = [w * batch % total for w in weights]
        for i, f in enumerate(frac):
            deficit[i] += f
        eligible = [i for i, f in enumerate(frac) if f > 0]  # w_i * b whole: never a remainder sample
        for i in sorted(eligible, key=lambda i: (-deficit[i], i))[: batch - sum(row)]:
            row[i] += 1
            deficit[i] -= total
        counts[k] = row
    return counts


def interleave(counts: np.ndarray, streams: Sequence[np.ndarray]) -> np.ndarray:
    """The mixed sequence: chunk after chunk, each holding ``counts[k, i]`` samples of source i,
    taken in turn from ``streams[i]`` (already in the mix's index space), spread evenly through the
    chunk (the j-th of c samples of a source sits near (j + 1/2) / c of the way), never by chance."""
    chunks, sources = counts.shape
    parts, chunk_of, place, source_of = [], [], [], []
    for i in range(sources):
        c = counts[:, i]
        n = int(c.sum())
        if len(streams[i]) < n:
            raise ValueError(f"source {i} gives {len(streams[i])} samples, the chunks take {n}")
        parts.append(streams[i][:n])
        which = np.repeat(np.arange(chunks), c)
        within = np.arange(n) - np.repeat(np.cumsum(c) - c, c)
        chunk_of.append(which)
        place.append((2 * within + 1) / (2 * np.maximum(c[which], 1)))
        source_of.append(np.full(n, i))
    if not parts:
        return np.zeros(0, np.int64)
    keys = [np.concatenate(a) for a in (source_of, place, chunk_of)]
    return np.concatenate(parts)[np.lexsort(keys)]


@dataclass(frozen=True, eq=False)
class MixOrder:
    """The :class:`stoker.data.epoch.EpochOrder` of a mixture: every chunk stratified (:func:`allocate`),
    each source's samples from its own passes (its partitions' passes, see
    :func:`stoker.data.epoch.dealt_sequence`), each pass its own ``order`` over the blocks of the
    source or of its partition (``bounds``; ``windows``: blocks open, as each source allows
    ``window``; ``shard_starts``: each source's shards) with a seed per (seed, source, pass
    [, partition]). Indices are the sources' samples one after another (``offsets``); ``names``
    are the sources' (for the state's block layout)."""

    spec: MixSpec
    offsets: np.ndarray
    bounds: tuple[np.ndarray, ...]
    windows: tuple[int, ...]
    order: Order
    window: int  # as given (the windows are each source's, as its blocks allow)
    names: tuple[str, ...]
    shard_starts: tuple[np.ndarray | None, ...] | None = None

    counted = True

    def __len__(self) -> int:
        return self.spec.length()

    @property
    def sources(self) -> int:
        return len(self.spec.sizes)

    @property
    def repeats(self) -> bool:
        return self.spec.exhausted == "repeat"

    @cached_property
    def _blocks(self) -> tuple[SourceBlocks, ...]:
        starts = self.shard_starts or (None,) * self.sources
        return tuple(SourceBlocks(b, w, s) for b, w, s in zip(self.bounds, self.windows, starts))

    def blocks(self, source: int) -> SourceBlocks:
        """See :meth:`stoker.data.epoch.EpochOrder.blocks`."""
        return self._blocks[source]

    def settings(self) -> tuple[int | None, str | None]:
        """What besides seed and epoch decides the sequence, as a resume state records it (see
        :meth:`stoker.data.epoch.BlockOrder.settings`): for ``quasi_random``, ``window`` and every
        source's block layout."""
        if self.order != "quasi_random":
            return None, None
        layouts = (BlockOrder(b, self.order, w).settings()[1] for b, w in zip(self.bounds, self.windows))
        return self.window, "; ".join(f"{name}: {layout}" for name, layout in zip(self.names, layouts))

    def pass_order(self, source: int, seed: int, epoch: int, number: int, partition: int = 0,
                   partitions: int = 1, split: int = 1) -> np.ndarray:
        """Pass ``number`` of source ``source`` (of its ``partition`` of ``partitions``, 1/``split``
        of its window open) in ``epoch``: its own order of its samples, as mix indices."""
        words = (seed, source, number, partition) if partitions > 1 else (seed, source, number)
        return self._blocks[source].sequence(self.order, sub_seed(*words), epoch, partition, partitions,
                                             split) + self.offsets[source]

    def counts(self, start: int, chunks: np.ndarray, consumed: tuple[int, ...] | None) -> np.ndarray:
        """Each chunk's samples per source (chunks, sources) from ``start``, where source i has given
        ``consumed[i]`` (None: at the epoch's start)."""
        if consumed is None:
            if start:
                raise ValueError(f"a mixture's sequence from {start} needs each source's samples consumed before it")
            consumed = (0,) * self.sources
        if len(consumed) != self.sources or sum(consumed) != start:
            raise ValueError(f"consumed={consumed} does not count {start} samples of {self.sources} sources")
        counts = allocate(self.spec.weights, chunks, consumed)
        if self.spec.exhausted == "end":
            over = [i for i, size in enumerate(self.spec.sizes) if consumed[i] + int(counts[:, i].sum()) > size]
            if over:  # never, by the epoch's length (MixSpec.length): a sample read twice would go unseen otherwise
                raise ValueError(f"sources {over} would give more than one pass in an epoch that ends when one runs out")
        return counts

    def arrange(self, counts: np.ndarray, streams: list[np.ndarray]) -> np.ndarray:
        """See :meth:`stoker.data.epoch.EpochOrder.arrange`: each source spread through each chunk."""
        return interleave(counts, streams)

    def sequence(self, seed: int, epoch: int, start: int, chunks: np.ndarray,
                 consumed: tuple[int, ...] | None) -> np.ndarray:
        """The mix indices of ``epoch`` from ``start`` read on one node in ``chunks``, where each
        source has given ``consumed`` (see :func:`stoker.data.epoch.dealt_sequence`)."""
        return dealt_sequence(self, seed, epoch, start, chunks, consumed)

    def part_of(self, indices: np.ndarray, partitions: int) -> np.ndarray:
        """See :meth:`stoker.data.epoch.EpochOrder.part_of`."""
        indices = np.asarray(indices, np.int64)
        source = self.source_of(indices)
        part = np.zeros(len(indices), np.int64)
        for i, blocks in enumerate(self._blocks):
            mine = source == i
            part[mine] = shard_partitions(blocks.shard_samples(), partitions)[blocks.shard_of(indices[mine] - self.offsets[i])]
        return source * partitions + part

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        """The source number of each mix index."""
        return np.searchsorted(self.offsets, np.asarray(indices, np.int64), side="right") - 1
