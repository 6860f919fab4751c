"""The order of a weighted mixture of data sets, as pure functions of numpy arrays and integers.

    weights, batch size b, samples each source gave so far  ──allocate──>  per chunk of b: each source's count
    each source's own order (its passes, one shuffle each)  ──streams──>   the next samples of each source
    counts + streams  ──interleave──>  the mixed sequence, chunk after chunk; chunk k is rank k % W's batch k // W

Every chunk of ``b`` is stratified: source i gets floor(w_i * b) samples, and the chunk's remainder
goes one sample each to the sources with the largest accumulated deficit (w_i * samples so far -
source i's samples so far), among those whose w_i * b is not a whole number; ties go to the source
listed first. So a chunk's count of source i differs from w_i * b by less than one sample. The
arithmetic is exact (the weights as fractions), so every rank and every restart computes the same
chunks. The deficit at any point is a function of the samples each source gave until then: a resume
from per-source counts continues the same allocation, whatever batch size the run had before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

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


def exact_weights(weights: Sequence[float]) -> tuple[int, ...]:
    """``weights`` (positive numbers, as given) as integer numerators of their exact ratios: the
    floats' own binary fractions over a common denominator, reduced. No rounding: 0.7 and 0.3 are
    the doubles 0.7 and 0.3, whose sum is the denominator."""
    exact = [Fraction(w) for w in weights]
    denominator = math.lcm(*(f.denominator for f in exact))
    numerators = [int(f * denominator) for f in exact]
    common = math.gcd(*numerators)
    return tuple(n // common for n in numerators)


def allocate(weights: Sequence[int], batch: int, chunks: int, consumed: Sequence[int],
             room: Sequence[int] | None = None) -> np.ndarray:
    """Per chunk of ``batch`` samples, how many each source gives: an int64 array (chunks, sources).

    ``weights``: integer numerators (see :func:`exact_weights`); ``consumed``: samples each source
    gave before the first chunk (the deficits carry on from there). With ``room`` (samples each
    source has left), the chunks stop before the first one that would take more than a source has:
    fewer rows than ``chunks``."""
    total = sum(weights)
    base = [w * batch // total for w in weights]
    frac = [w * batch % total for w in weights]
    remainder = batch - sum(base)
    eligible = [i for i, f in enumerate(frac) if f > 0]  # w_i * b whole: never a remainder sample
    start = sum(consumed)
    deficit = [w * start - total * c for w, c in zip(weights, consumed)]  # in units of 1 / total
    left = list(room) if room is not None else None
    counts = np.empty((max(0, chunks), len(weights)), np.int64)
    for k in range(max(0, chunks)):
        for i, f in enumerate(frac):
            deficit[i] += f
        extra = sorted(eligible, key=lambda i: (-deficit[i], i))[:remainder]
        row = list(base)
        for i in extra:
            row[i] += 1
            deficit[i] -= total
        if left is not None:
            if any(n > r for n, r in zip(row, left)):
                return counts[:k]
            left = [r - n for r, n in zip(left, row)]
        counts[k] = row
    return counts


def stream(order_of_pass: Callable[[int], np.ndarray], size: int, first: int, count: int) -> np.ndarray:
    """Samples ``first`` to ``first + count`` of one source's stream: its passes one after another
    (``order_of_pass(p)``: pass p's order of its ``size`` samples), so a source that runs out goes
    on with its next pass."""
    if count <= 0:
        return np.zeros(0, np.int64)
    if size <= 0:
        raise ValueError("a source with no samples cannot give any")
    passes = range(first // size, (first + count - 1) // size + 1)
    joined = np.concatenate([np.asarray(order_of_pass(p), np.int64) for p in passes])
    skip = first - passes[0] * size
    return joined[skip : skip + count]


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


def epoch_chunks(spec: MixSpec, start: int, batch: int, world_size: int, drop_last: bool) -> int:
    """Chunks of ``batch`` the epoch has from sample ``start`` on (before ``end``'s exhaustion), in
    whole rounds of one chunk per rank: the rest of ``epoch_size`` rounded up (the sources' streams
    go on, so every batch is whole and stratified) or, with ``drop_last`` or ``exhausted="end"``, down."""
    left = max(0, spec.epoch_size - start)
    per_round = batch * world_size
    rounds = left // per_round if drop_last or spec.exhausted == "end" else -(-left // per_round)
    return rounds * world_size


def plan_counts(spec: MixSpec, batch: int, world_size: int, drop_last: bool, consumed: Sequence[int]) -> np.ndarray:
    """The rest of the epoch's chunks, as per-source counts (chunks, sources), from the point where
    source i has given ``consumed[i]`` samples: every chunk :func:`epoch_chunks` allows; with
    ``exhausted="end"`` only the whole rounds before a source would run out of its first pass."""
    chunks = epoch_chunks(spec, sum(consumed), batch, world_size, drop_last)
    if spec.exhausted == "repeat":
        return allocate(spec.weights, batch, chunks, consumed)
    room = [size - c for size, c in zip(spec.sizes, consumed)]
    counts = allocate(spec.weights, batch, chunks, consumed, room)
    return counts[: len(counts) // world_size * world_size]


def rank_batches(sequence: np.ndarray, batch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s samples of a sequence cut into chunks of ``batch``: chunks rank, rank + W, ...
    (the sequence holds whole rounds of ``world_size`` chunks)."""
    return sequence.reshape(-1, batch)[rank::world_size].reshape(-1)
