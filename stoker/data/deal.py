"""Dealing an epoch's chunks (the ranks' batches) from each node's own samples, as pure functions
of numpy arrays and integers.

    a node's partitions of one source, the samples consumed of each  ──node_stream──>  its stream:
        the partitions read together, each from where it was left, at a pace of its size (a source
        that repeats: each goes on with its next pass)
    each chunk's samples per source, the node of its rank, what each node has left  ──deal──>
        per chunk and source: samples from its node's stream; what that node lacks (a node's share
        is smaller by up to a shard, or it holds none of a source), from the node with the most left
    the pieces and the nodes' streams  ──gather──>  each source's samples in the order they are dealt

Every node's stream is consumed from its start, in order, so the samples consumed of each partition
are a prefix of its own sequence, whoever took them: a resume from per-partition counts goes on
exactly, on any number of nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# What a node holding a source that repeats (a Mix's "repeat") has left of it, whatever it gave: more
# than any epoch takes.
ENDLESS = 1 << 62


def stream(order_of_pass: Callable[[int], np.ndarray], size: int, first: int, count: int) -> np.ndarray:
    """Samples ``first`` to ``first + count`` of one partition's stream: its passes one after
    another (``order_of_pass(p)``: pass p's order of its ``size`` samples), so a source that runs
    out goes on with its next pass."""
    if count <= 0:
        return np.zeros(0, np.int64)
    if size <= 0:
        raise ValueError("a partition with no samples cannot give any")
    passes = range(first // size, (first + count - 1) // size + 1)
    joined = np.concatenate([np.asarray(order_of_pass(p), np.int64) for p in passes])
    skip = first - passes[0] * size
    return joined[skip : skip + count]


def node_stream(sizes: np.ndarray, counts: np.ndarray, ties: np.ndarray, repeats: bool, total: int,
                take: Callable[[int, int, int], np.ndarray]) -> np.ndarray:
    """The first ``total`` samples of a node's stream of one source: its partitions read together,
    each at a pace proportional to its size, so that partitions begun together end together and the
    node's open blocks come from all of them. ``sizes``, ``counts`` (samples consumed) and ``ties``
    (the order of equal places) are per partition the node holds; ``take(p, first, count)`` gives
    samples ``first`` to ``first + count`` of partition p's own stream (its passes one after
    another; without ``repeats``, one pass). Sample j of partition p's stream comes at
    (j + 1/2) / size_p, the same place whatever was consumed before: so every partition gives a
    prefix of its stream, and a stream resumed from its counts goes on as it would have."""
    if total <= 0:
        return np.zeros(0, np.int64)
    sizes, counts = np.asarray(sizes, np.int64), np.asarray(counts, np.int64)
    live = np.flatnonzero((sizes > 0) & (repeats | (counts < sizes)))
    size, done = sizes[live], counts[live]
    left = np.full(len(live), total) if repeats else size - done

    if not len(live) or int(left.sum()) < total:
        raise ValueError(f"a node's stream has {int(left.sum())} samples, {total} are dealt from it")
    place = _place_of(total, size, done, left)
    want = np.clip(np.floor(place * size - 0.5).astype(np.int64) - done + 1, 0, left)  # each one's samples up to it
    places = np.concatenate([(c + np.arange(n) + 0.5) / s for c, n, s in zip(done, want, size)])
    samples = np.concatenate([take(int(p), int(counts[p]), int(n)) for p, n in zip(live, want)])
    return samples[np.lexsort((np.repeat(ties[live], want), places))[:total]]


def _place_of(total: int, size: np.ndarray, done: np.ndarray, left: np.ndarray) -> float:
    """A place in a node's stream (see :func:`node_stream`) at or after its ``total``-th sample, and
    before its ``total + len(size)``-th: where the samples that come continuously, partition p's
    between (done_p + 1/2) / size_p and (done_p + left_p + 1/2) / size_p, add up to ``total``."""
    def continuous(at: np.ndarray) -> np.ndarray:
        return np.clip(at[:, None] * size - done - 0.5, 0, left).sum(axis=1)

    points = np.unique(np.concatenate([(done + 0.5) / size, (done + left + 0.5) / size]))
    reached = continuous(points)
    after = int(np.searchsorted(reached, total))  # the first point where the samples add up to total
    before = points[after - 1] if after else points[0]
    active = (before * size >= done + 0.5) & (before * size < done + left + 0.5)
    place = before + (total - (reached[after - 1] if after else 0)) / max(1, int(size[active].sum()))
    place = min(place, float(points[min(after, len(points) - 1)]))
    while int(np.clip(np.floor(place * size - 0.5).astype(np.int64) - done + 1, 0, left).sum()) < total:
        place += 1 / float(size.max())  # rounding left it short
    return place


def node_left(sizes: np.ndarray, counts: np.ndarray, node_of: np.ndarray, nodes: int, repeats: bool) -> np.ndarray:
    """What each node can give of each source (nodes, sources): the samples left of its partitions
    (``sizes``, ``counts``: sources x partitions), or :data:`ENDLESS` for a source that repeats
    where it holds any of its samples."""
    node_of = np.asarray(node_of, np.int64)
    left = np.zeros((nodes, sizes.shape[0]), np.int64)
    for i in range(sizes.shape[0]):
        if repeats:
            left[:, i] = np.where(np.bincount(node_of, sizes[i], minlength=nodes) > 0, ENDLESS, 0)
        else:
            left[:, i] = np.bincount(node_of, np.maximum(sizes[i] - counts[i], 0), minlength=nodes)
    return left


@dataclass(frozen=True)
class Pieces:
    """Where each chunk's samples come from, in the order they are taken: ``count`` samples of
    source ``source`` from node ``node``'s stream for chunk ``chunk`` (int64 arrays)."""

    chunk: np.ndarray
    source: np.ndarray
    node: np.ndarray
    count: np.ndarray


def deal(counts: np.ndarray, chunk_node: np.ndarray, left: np.ndarray) -> Pieces:
    """Which nodes' streams give each chunk its samples: ``counts`` (chunks x sources) of chunk k
    from node ``chunk_node[k]``'s streams while it has them (``left``: nodes x sources); what a node
    lacks comes from the node with the most left of that source (the lowest on ties). Chunks run
    from their own nodes until one lacks something; only the chunks after that are dealt one by one."""
    taken = _cumsum_by(counts, chunk_node)
    short = (taken > left[chunk_node]).any(axis=1)
    first_short = int(np.argmax(short)) if short.any() else len(counts)
    chunk, source = np.nonzero(counts[:first_short])
    pieces: list[tuple[np.ndarray, ...]] = [(chunk, source, chunk_node[chunk], counts[chunk, source])]
    if first_short < len(counts):
        left = np.where(left == ENDLESS, ENDLESS, left - _totals(counts[:first_short], chunk_node[:first_short], len(left)))
        pieces.append(_deal_each(counts, chunk_node, left, first_short))
    return Pieces(*(np.concatenate([np.asarray(p[j], np.int64) for p in pieces]) for j in range(4)))


def gather(pieces: Pieces, source: int, streams: dict[int, np.ndarray]) -> np.ndarray:
    """Source ``source``'s samples in the order ``pieces`` deals them, from ``streams`` (node ->
    the start of its stream of that source)."""
    mine = pieces.source == source
    nodes, counts = pieces.node[mine], pieces.count[mine]
    if not len(counts):
        return np.zeros(0, np.int64)
    held = sorted(streams)
    flat = np.concatenate([streams[n] for n in held])
    base = np.concatenate([[0], np.cumsum([len(streams[n]) for n in held])])[np.searchsorted(held, nodes)]
    within = _cumsum_by(counts[:, None], nodes)[:, 0] - counts  # where each piece starts in its node's stream
    starts = base + within
    ends = np.cumsum(counts)
    return flat[np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]))]


def _deal_each(counts: np.ndarray, chunk_node: np.ndarray, left: np.ndarray, first: int) -> tuple[np.ndarray, ...]:
    """:func:`deal` from chunk ``first`` on, one chunk at a time (where nodes run short), until at
    most one node has anything left of each source (then all of the rest comes from it)."""
    have = left.tolist()  # nodes x sources, as Python ints: a loop over chunks
    nodes, sources = range(len(have)), range(counts.shape[1])
    out: list[tuple[int, int, int, int]] = []
    emptied = True  # a node ran out of a source since the last look
    for k in range(first, len(counts)):
        if emptied and all(sum(have[n][i] > 0 for n in nodes) <= 1 for i in sources):
            return _from_holders(counts, have, k, out)
        emptied, own = False, int(chunk_node[k])
        for i in np.flatnonzero(counts[k]).tolist():
            need = int(counts[k, i])
            while need:
                giver = own if have[own][i] else max(nodes, key=lambda n: (have[n][i], -n))
                give = min(need, have[giver][i])
                if not give:
                    raise ValueError(f"no node has samples of source {i} left for chunk {k}")
                out.append((k, i, giver, give))
                if have[giver][i] != ENDLESS:  # a repeating source's holders stay alike: no history decides
                    have[giver][i] -= give
                need -= give
                emptied |= not have[giver][i]
    return _columns(out)


def _from_holders(counts: np.ndarray, have: list[list[int]], first: int,
                  out: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """``out``, then the pieces of chunks ``first`` on, where at most one node has anything left of
    each source: every sample of a source from the node that holds it."""
    chunk, source = np.nonzero(counts[first:])
    holder = np.array([max(range(len(have)), key=lambda n: have[n][i]) for i in range(counts.shape[1])], np.int64)
    given = counts[first + chunk, source]
    for i in range(counts.shape[1]):
        if int(given[source == i].sum()) > have[holder[i]][i]:
            raise ValueError(f"no node has samples of source {i} left for the chunks from {first} on")
    return tuple(np.concatenate([a, b]) for a, b in zip(_columns(out), (first + chunk, source, holder[source], given)))


def _columns(rows: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """Rows of four integers as four int64 arrays."""
    return tuple(np.array(column, np.int64) for column in zip(*rows)) if rows else tuple(np.zeros(0, np.int64)
                                                                                          for _ in range(4))


def _cumsum_by(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Running totals of ``values`` (rows) within each group of ``group``, in row order."""
    if not len(values):
        return values.copy()
    order = np.argsort(group, kind="stable")
    ordered = values[order]
    running = np.cumsum(ordered, axis=0)
    starts = np.r_[True, group[order][1:] != group[order][:-1]]
    before = (running - ordered)[starts][np.cumsum(starts) - 1]  # the total before each row's group
    out = np.empty_like(running)
    out[order] = running - before
    return out


def _totals(counts: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
    """``counts`` (rows x sources) summed per group (groups x sources)."""
    totals = np.zeros((groups, counts.shape[1]), np.int64)
    np.add.at(totals, group, counts)
    return totals
