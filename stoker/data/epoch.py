"""The epoch plan: which samples of an epoch each rank reads in a pass, dealt from its node's own.

    the epoch's chunks: the ranks' batches in turn (chunk k: rank k % world_size's batch k // world_size)
    each source's partitions (whole shards; stoker/data/placement.py), each its own sequence per epoch
    chunk k  <──  the next samples of its rank's node's partitions, one after another (stoker/data/deal.py);
                  what that node lacks (at the epoch's end: its share is smaller by up to a shard),
                  from the node with the most left
    a rank's chunks  ──>  what its pass reads, and what is read or staged ahead (never before ``start``)

``start`` is the number of samples of the epoch consumed across all ranks (a resume point: rank
0's state says it, since ranks step together), and a state also counts each partition's samples
consumed (:attr:`EpochPlan.tally`). Each partition is consumed from the start of its own sequence,
in order, whoever reads it, so whatever the world size and the node count were at each step, the
samples consumed are a prefix of each partition's sequence: a pass may resume on another number
of ranks or nodes, or with another batch size, and the epoch still delivers each of its samples
exactly once. The last global batch, when shorter than ``world_size * batch_size``, is split
near-evenly over the ranks (sizes differ by at most one; with fewer samples left than ranks, the
last ranks end the epoch one step early); with ``drop_last`` it is dropped, so every rank makes
the same number of steps.

With one partition (the default on one node) every chunk takes the next samples of one global
sequence, the same for any number of ranks: every global batch is a contiguous slice of it.
stoker.Loader and QuasiRandomSampler both read their epochs from here. An :class:`EpochOrder` is
what decides the sequences: :class:`BlockOrder` over one data set's blocks; a mixture of data sets
(:class:`stoker.data.mix_plan.MixOrder`) stratifies each chunk, including the short ones at the
epoch's end, so its sequence from ``start`` also depends on the chunks the rest is dealt in and on
each source's samples consumed before ``start``. Everything here is a pure function of its
arguments (stoker/data/world.py asks torch.distributed who the ranks are).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Protocol

import numpy as np

from stoker.data.deal import deal, gather, node_left, node_stream, stream
from stoker.data.order import quasi_random_order, rank_positions, sub_seed
from stoker.data.placement import Placement, shard_partitions
from stoker.ranges import ORDER

Order = Literal["quasi_random", "random", "sequential"]
ORDERS: tuple[Order, ...] = ORDER.values


class EpochOrder(Protocol):
    """What decides the sequence of each epoch, a pure function of its arguments: the same for any
    number of ranks on one node, so that a resume on another world size continues it exactly.
    Its samples come from ``sources`` (one data set: one), each split into partitions of whole
    shards (see :mod:`stoker.data.placement`), each partition with its own sequence per pass."""

    @property
    def order(self) -> Order:
        """How each partition's pass is ordered: ``quasi_random``, ``random`` or ``sequential``."""

    @property
    def window(self) -> int:
        """Blocks open at a time, as given."""

    def __len__(self) -> int:
        """Samples per epoch."""

    @property
    def sources(self) -> int:
        """How many data sets it reads (one, or a mixture's sources)."""

    @property
    def counted(self) -> bool:
        """Whether a state counts the samples consumed of each source even with one partition (a mixture)."""

    @property
    def repeats(self) -> bool:
        """Whether a source that runs out within an epoch goes on with its next pass."""

    def blocks(self, source: int) -> SourceBlocks:
        """Source ``source``'s blocks and shards."""

    def pass_order(self, source: int, seed: int, epoch: int, number: int, partition: int = 0,
                   partitions: int = 1, split: int = 1) -> np.ndarray:
        """Pass ``number`` of ``partition`` (of ``partitions``) of source ``source`` in ``epoch``: its
        samples in order, as the reader's indices, a 1/``split`` of the source's window open (see
        :meth:`SourceBlocks.sequence`)."""

    def part_of(self, indices: np.ndarray, partitions: int) -> np.ndarray:
        """The partition of each sample, numbered source after source (``source * partitions + p``)."""

    def counts(self, start: int, chunks: np.ndarray, consumed: tuple[int, ...] | None) -> np.ndarray:
        """Each chunk's samples per source (chunks x sources), from ``start`` where each source has
        given ``consumed``."""

    def arrange(self, counts: np.ndarray, streams: list[np.ndarray]) -> np.ndarray:
        """The chunks' samples in order, given each chunk's count per source and each source's
        samples in the order they are dealt."""

    def settings(self) -> tuple[int | None, str | None]:
        """What besides seed and epoch decides the sequence, as a resume state records it: for
        ``quasi_random``, ``window`` and the block layout; else (None, None)."""


def epoch_sequence(bounds: np.ndarray, order: Order, window: int, seed: int, epoch: int) -> np.ndarray:
    """The global order of ``epoch`` over the samples of blocks ``bounds`` (see
    :func:`stoker.data.order.block_bounds`): ``quasi_random`` shuffles blocks and reads ``window``
    at a time (see :func:`stoker.data.order.quasi_random_order`), ``random`` is a full
    permutation, ``sequential`` the stored order."""
    n = int(bounds[-1])
    if order == "quasi_random":
        return quasi_random_order(bounds, window, seed, epoch)
    if order == "random":
        return np.random.default_rng([seed, epoch]).permutation(n)
    return np.arange(n, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class SourceBlocks:
    """One data set's blocks (``bounds``), ``window`` of them open, and its shards (``starts``: the
    first sample of each, then the total; None: one shard): what its partitions are made of."""

    bounds: np.ndarray
    window: int
    starts: np.ndarray | None
    _partitions: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def shard_samples(self) -> np.ndarray:
        """Samples per shard."""
        return np.diff(self.starts) if self.starts is not None else np.array([int(self.bounds[-1])], np.int64)

    def block_partitions(self, partitions: int) -> np.ndarray:
        """The partition of each block (its shard's; see :func:`stoker.data.placement.shard_partitions`)."""
        if partitions not in self._partitions:
            shard = self.shard_of(self.bounds[:-1])
            self._partitions[partitions] = shard_partitions(self.shard_samples(), partitions)[shard]
        return self._partitions[partitions]

    def shard_of(self, indices: np.ndarray) -> np.ndarray:
        """The shard of each sample."""
        if self.starts is None:
            return np.zeros(len(indices), np.int64)
        return np.searchsorted(self.starts, indices, side="right") - 1

    def partition_sizes(self, partitions: int) -> np.ndarray:
        """Samples per partition."""
        return np.bincount(self.block_partitions(partitions), np.diff(self.bounds), minlength=partitions).astype(np.int64)

    def sequence(self, order: Order, seed: int, epoch: int, partition: int, partitions: int,
                 split: int = 1) -> np.ndarray:
        """:func:`epoch_sequence` over the blocks of ``partition`` (of ``partitions``), its samples,
        with 1/``split`` of ``window`` open (a node reads ``split`` partitions together: see
        :class:`stoker.data.placement.Placement`)."""
        window = -(-self.window // split)
        if partitions == 1:
            return epoch_sequence(self.bounds, order, window, seed, epoch)
        blocks = np.flatnonzero(self.block_partitions(partitions) == partition)
        firsts = self.bounds[blocks]
        local = np.concatenate([[0], np.cumsum(self.bounds[blocks + 1] - firsts)]).astype(np.int64)
        within = epoch_sequence(local, order, window, seed, epoch)
        block = np.searchsorted(local, within, side="right") - 1
        return firsts[block] + (within - local[block])


@dataclass(frozen=True, eq=False)
class BlockOrder:
    """The :class:`EpochOrder` of one data set: :func:`epoch_sequence` over its blocks (over each
    partition's blocks: ``shard_starts``, the first sample of each shard, then the total)."""

    bounds: np.ndarray
    order: Order
    window: int
    shard_starts: np.ndarray | None = None

    sources, counted, repeats = 1, False, False

    def __len__(self) -> int:
        return int(self.bounds[-1])

    @cached_property
    def _blocks(self) -> SourceBlocks:
        return SourceBlocks(self.bounds, self.window, self.shard_starts)

    def blocks(self, source: int) -> SourceBlocks:
        """See :meth:`EpochOrder.blocks`."""
        return self._blocks

    def pass_order(self, source: int, seed: int, epoch: int, number: int, partition: int = 0,
                   partitions: int = 1, split: int = 1) -> np.ndarray:
        """See :meth:`EpochOrder.pass_order` (one pass: ``number`` is 0). One partition has the run's
        seed, each of several its own."""
        seed = seed if partitions == 1 else sub_seed(seed, partition)
        return self._blocks.sequence(self.order, seed, epoch, partition, partitions, split)

    def part_of(self, indices: np.ndarray, partitions: int) -> np.ndarray:
        """See :meth:`EpochOrder.part_of`."""
        return shard_partitions(self._blocks.shard_samples(), partitions)[self._blocks.shard_of(indices)]

    def counts(self, start: int, chunks: np.ndarray, consumed: tuple[int, ...] | None) -> np.ndarray:
        """See :meth:`EpochOrder.counts`: every sample from the one data set."""
        return np.asarray(chunks, np.int64)[:, None]

    def arrange(self, counts: np.ndarray, streams: list[np.ndarray]) -> np.ndarray:
        """See :meth:`EpochOrder.arrange`: the one data set's samples as dealt."""
        return streams[0]

    def sequence(self, seed: int, epoch: int, start: int, chunks: np.ndarray,
                 consumed: tuple[int, ...] | None) -> np.ndarray:
        """The samples of ``epoch`` at positions ``start``, ``start + 1``, ... of the sequence read on
        one node, as many as ``chunks`` holds (see :func:`dealt_sequence`; one partition: chunks do
        not change it). ``consumed``: each partition's samples before ``start`` (None: one partition)."""
        return dealt_sequence(self, seed, epoch, start, chunks, consumed)

    def settings(self) -> tuple[int | None, str | None]:
        """See :meth:`EpochOrder.settings` (``"<count> blocks #<digest of bounds>"``)."""
        if self.order != "quasi_random":
            return None, None
        digest = hashlib.blake2b(np.asarray(self.bounds, dtype="<i8").tobytes(), digest_size=8).hexdigest()
        return self.window, f"{len(self.bounds) - 1} blocks #{digest}"


ONE_NODE = Placement(1, (0,))


def consumed_counts(order: EpochOrder, start: int, consumed: tuple[int, ...] | None, partitions: int) -> np.ndarray:
    """The samples consumed before ``start`` of each source's partitions (sources x partitions),
    from ``consumed`` (a state's counts, source after source; None at 0, and for one partition
    of an order that does not count them: ``start`` itself)."""
    shape = (order.sources, partitions)
    if consumed is None:
        if start and (order.counted or partitions > 1):
            raise ValueError(f"a sequence from {start} of {partitions} partitions needs each one's samples consumed")
        return np.full(shape, start, np.int64) if start else np.zeros(shape, np.int64)
    counts = np.asarray(consumed, np.int64)
    if counts.size != shape[0] * shape[1] or int(counts.sum()) != start:
        raise ValueError(f"consumed={consumed} does not count {start} samples of {shape[0]} sources x {partitions} "
                         "partitions")
    return counts.reshape(shape)


def dealt_sequence(order: EpochOrder, seed: int, epoch: int, start: int, chunks: np.ndarray,
                   consumed: tuple[int, ...] | None, placement: Placement = ONE_NODE,
                   chunk_node: np.ndarray | None = None) -> np.ndarray:
    """The samples of ``epoch`` from ``start`` dealt in ``chunks`` (the ranks' batches in turn, see
    :meth:`RankBatches.chunks`), chunk k to a rank of node ``chunk_node[k]`` (default: all on node
    0): each chunk's samples per source (:meth:`EpochOrder.counts`) from its node's own
    partitions (``placement``) where it has them, else from the node with the most left
    (:func:`stoker.data.deal.deal`). ``consumed``: each source's partitions' samples before
    ``start`` (see :func:`consumed_counts`). For the chunks of a whole pass,
    ``dealt_sequence(o, s, e, 0, chunks, None)[start:]`` equals ``dealt_sequence(o, s, e, start,
    chunks[k:], c)`` where ``start`` is the end of ``chunks[:k]`` and ``c`` the counts of its samples."""
    partitions = placement.partitions
    counts = consumed_counts(order, start, consumed, partitions)
    sizes = np.stack([order.blocks(i).partition_sizes(partitions) for i in range(order.sources)])
    per_chunk = order.counts(start, chunks, tuple(int(c) for c in counts.sum(axis=1)))
    node_of = np.array(placement.node_of, np.int64)
    nodes = np.zeros(len(chunks), np.int64) if chunk_node is None else chunk_node
    pieces = deal(per_chunk, nodes, node_left(sizes, counts, node_of, placement.nodes, order.repeats))
    ties = _ties(order.order, partitions, seed, epoch)
    streams = []
    for i in range(order.sources):
        mine = pieces.source == i
        by_node = {}
        for node in np.unique(pieces.node[mine]).tolist():
            held = placement.held_by(node)

            def take(p: int, first: int, count: int, source: int = i, held: np.ndarray = held) -> np.ndarray:
                passes = functools.partial(order.pass_order, source, seed, epoch, partition=int(held[p]),
                                           partitions=partitions, split=placement.split)
                return stream(passes, int(sizes[source, held[p]]), first, count)

            total = int(pieces.count[mine & (pieces.node == node)].sum())
            by_node[node] = node_stream(sizes[i, held], counts[i, held], ties[held], order.repeats, total, take)
        streams.append(gather(pieces, i, by_node))
    return order.arrange(per_chunk, streams)


def _ties(order: Order, partitions: int, seed: int, epoch: int) -> np.ndarray:
    """Which partition of a node goes first where several come at the same place of its stream:
    drawn anew each epoch, or by number for the ``sequential`` order."""
    if order == "sequential" or partitions == 1:
        return np.arange(partitions, dtype=np.int64)
    return np.argsort(np.random.default_rng([seed, epoch, partitions]).permutation(partitions))


@dataclass(frozen=True)
class RankBatches:
    """How one pass deals the global sequence from position ``origin`` to ``end`` to the ranks:
    chunks of ``batch_size`` in turn (see :func:`stoker.data.order.rank_positions`). Positions are
    global (in the epoch's sequence). Small and picklable: batch makers key their random draws by
    :meth:`first`."""

    origin: int  # samples of the epoch consumed before the pass (all ranks)
    end: int  # where the pass ends: the epoch's length, or with drop_last the last whole global batch
    world_size: int
    rank: int
    batch_size: int  # per rank

    def __len__(self) -> int:
        """This rank's batches in the pass (ranks differ by at most one, at the end of the epoch)."""
        full, left = divmod(self.end - self.origin, self.world_size * self.batch_size)
        in_last = left // self.world_size + (self.rank < left % self.world_size)  # this rank's part of a short last one
        return full + (in_last > 0)

    @property
    def samples(self) -> int:
        """This rank's samples in the pass (the length of :meth:`positions`, without making it)."""
        full, left = divmod(self.end - self.origin, self.world_size * self.batch_size)
        return full * self.batch_size + left // self.world_size + (self.rank < left % self.world_size)

    def positions(self) -> np.ndarray:
        """This rank's global positions in the pass, batch after batch."""
        return self.origin + rank_positions(self.end - self.origin, self.world_size, self.rank, self.batch_size)

    def first(self, number: int) -> int:
        """The global position of batch ``number``'s first sample: unique within an epoch, the
        same on every resume of the same history, so random draws keyed by it are reproducible."""
        per_global = self.world_size * self.batch_size
        full, left = divmod(self.end - self.origin, per_global)
        if number < full:
            return self.origin + number * per_global + self.rank * self.batch_size
        base, extra = divmod(left, self.world_size)
        return self.origin + full * per_global + self.rank * base + min(self.rank, extra)

    def chunks(self) -> np.ndarray:
        """The sizes of the pass's chunks in the order they are dealt (chunk k: rank k % world_size's
        batch k // world_size): whole ones of ``batch_size``, then a short last global batch's
        near-even parts (a rank with none has no chunk)."""
        per_global = self.world_size * self.batch_size
        full, left = divmod(self.end - self.origin, per_global)
        base, extra = divmod(left, self.world_size)
        last = base + (np.arange(self.world_size) < extra)
        return np.concatenate([np.full(full * self.world_size, self.batch_size), last[last > 0]]).astype(np.int64)

    def samples_done(self, batches: int) -> int:
        """Samples of the epoch consumed (all ranks) once rank 0 has made ``batches`` batches of the
        pass (every rank steps with it; rank 0 has the most batches)."""
        return min(self.origin + batches * self.world_size * self.batch_size, self.end)


def rank_batches(length: int, *, start: int, world_size: int, rank: int, batch_size: int,
                 drop_last: bool) -> RankBatches:
    """The :class:`RankBatches` of a pass over an epoch of ``length`` samples from ``start`` on;
    ``drop_last`` ends it at the last whole global batch."""
    if not 0 <= start <= length:
        raise ValueError(f"start {start} is outside the epoch of {length} samples")
    per_global = world_size * batch_size
    end = start + (length - start) // per_global * per_global if drop_last else length
    return RankBatches(start, end, world_size, rank, batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """One rank's pass over one epoch: its samples in order, and where they lie in the epoch."""

    epoch: int
    share: np.ndarray  # this rank's sample indices for the pass, batch after batch (batch b: share[b*B:(b+1)*B])
    batches: RankBatches
    # Each source's partitions' samples consumed (all ranks) after each global step of the pass (row 0:
    # its start), source after source; None for one partition of one data set (samples_done says it).
    tally: np.ndarray | None = None

    def consumed(self, batches: int) -> tuple[int, ...] | None:
        """Each source's partitions' samples consumed (all ranks) once rank 0 has made ``batches``
        batches of the pass, at :meth:`RankBatches.samples_done`; None where ``tally`` is."""
        if self.tally is None:
            return None
        return tuple(int(n) for n in self.tally[min(batches, len(self.tally) - 1)])


def plan_epoch(order: EpochOrder, *, seed: int, epoch: int, start: int, world_size: int, rank: int,
               batch_size: int, drop_last: bool, consumed: tuple[int, ...] | None = None,
               placement: Placement = ONE_NODE) -> EpochPlan:
    """The pass of rank ``rank`` of ``world_size`` over ``epoch`` from global position ``start`` (the
    samples of the epoch consumed across all ranks; ``consumed``: of each source's partitions, see
    :func:`consumed_counts`), ``batch_size`` samples per rank and batch. The ranks are numbered node
    by node (``placement.nodes`` nodes of ``world_size // nodes`` ranks each), and each rank's
    batches come from its node's partitions (see :func:`dealt_sequence`)."""
    batches = rank_batches(len(order), start=start, world_size=world_size, rank=rank, batch_size=batch_size,
                           drop_last=drop_last)
    chunks = batches.chunks()
    chunk_node = np.arange(len(chunks)) % world_size // (world_size // placement.nodes)
    rest = dealt_sequence(order, seed, epoch, start, chunks, consumed, placement, chunk_node)
    tally = None
    if order.counted or placement.partitions > 1:
        counts = consumed_counts(order, start, consumed, placement.partitions).ravel()
        step = np.repeat(np.arange(len(chunks)) // world_size, chunks)
        per_step = np.bincount(step * len(counts) + order.part_of(rest, placement.partitions),
                               minlength=-(-len(chunks) // world_size) * len(counts))
        tally = np.cumsum(np.concatenate([counts, per_step]).reshape(-1, len(counts)), axis=0)
    return EpochPlan(epoch, rest[batches.positions() - start], batches, tally)
