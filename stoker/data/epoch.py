"""The epoch plan: the epoch's global sequence of samples, and which of them one rank reads in a pass.

    (order, seed, epoch)  ──>  the epoch's global sequence, the same for any number of ranks
    sequence[start:]  ──dealt in chunks of batch_size──>  rank k % world_size gets chunk k as its
                                                          batch k // world_size
    a rank's chunks  ──>  what its pass reads, and what is read or staged ahead (never before ``start``)

``start`` is the number of samples of the epoch consumed across all ranks (a resume point: rank
0's state says it, since ranks step together). Every global batch is a contiguous slice of the
sequence, so after any number of steps the samples consumed are a prefix of it, whatever the
world size was at each step: a pass may resume on another number of ranks, or with another batch
size, and the epoch still delivers each of its samples exactly once. The last global batch, when
shorter than ``world_size * batch_size``, is split near-evenly over the ranks (sizes differ by at
most one; with fewer samples left than ranks, the last ranks end the epoch one step early); with
``drop_last`` it is dropped, so every rank makes the same number of steps.

stoker.Loader and QuasiRandomSampler both read their epochs from here. An :class:`EpochOrder` is
what decides the sequence: :class:`BlockOrder` over one data set's blocks (the same whatever the
chunks); a mixture of data sets (:class:`stoker.data.mix_plan.MixOrder`) stratifies each chunk,
including the short ones at the epoch's end, so its sequence from ``start`` also depends on the
chunks the rest is dealt in and on each source's samples consumed before ``start`` (a resume
state records them). Everything but :func:`resolve_rank` and :func:`resolve_seed` (which ask
torch.distributed) is a pure function of its arguments.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch
import torch.distributed as dist

from stoker.data.order import quasi_random_order, rank_positions
from stoker.errors import OptionError
from stoker.ranges import ORDER, SEED, WORLD_SIZE, Range
from stoker.storage.node import environ_int

Order = Literal["quasi_random", "random", "sequential"]
ORDERS: tuple[Order, ...] = ORDER.values


class EpochOrder(Protocol):
    """What decides the global sequence of each epoch (a pure function of its arguments): the same
    for any number of ranks, so that a resume on another world size continues it exactly."""

    def __len__(self) -> int:
        """Samples per epoch (the length of the whole sequence)."""

    def sequence(self, seed: int, epoch: int, start: int, chunks: np.ndarray,
                 consumed: tuple[int, ...] | None) -> np.ndarray:
        """The sample indices of ``epoch`` at positions ``start``, ``start + 1``, ... (int64), as many
        as ``chunks`` holds: the sizes of the consecutive chunks (ranks' batches) the rest will be read
        in (see :meth:`RankBatches.chunks`), for orders whose every chunk must hold something (a
        stratified mixture); an order may ignore them. ``consumed``: a mixture's samples of each
        source before ``start`` (None at 0, and for one data set). For the chunks of a whole pass,
        ``sequence(s, e, 0, chunks, None)[start:]`` equals ``sequence(s, e, start, chunks[k:], c)``
        where ``start`` is the end of ``chunks[:k]`` and ``c`` the counts of its samples."""

    def tally(self, indices: np.ndarray, chunks: np.ndarray, consumed: tuple[int, ...] | None) -> np.ndarray | None:
        """For a mixture: each source's samples consumed at the start (``consumed``) and at the end
        of each chunk of ``indices`` (a :meth:`sequence`; int64, chunks + 1 rows); None for one data set."""


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
class BlockOrder:
    """The :class:`EpochOrder` of one data set: :func:`epoch_sequence` over its blocks."""

    bounds: np.ndarray
    order: Order
    window: int

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def sequence(self, seed: int, epoch: int, start: int, chunks: np.ndarray,
                 consumed: tuple[int, ...] | None) -> np.ndarray:
        """See :meth:`EpochOrder.sequence` (chunks do not change a data set's order)."""
        return epoch_sequence(self.bounds, self.order, self.window, seed, epoch)[start : start + int(chunks.sum())]

    def tally(self, indices: np.ndarray, chunks: np.ndarray, consumed: tuple[int, ...] | None) -> None:
        """One data set: no sources to count."""
        return None

    def settings(self) -> tuple[int | None, str | None]:
        """What besides seed and epoch decides the sequence, as a resume state records it: for
        ``quasi_random``, ``window`` and the block layout (``"<count> blocks #<digest of bounds>"``);
        for the other orders nothing (None, None)."""
        if self.order != "quasi_random":
            return None, None
        digest = hashlib.blake2b(np.asarray(self.bounds, dtype="<i8").tobytes(), digest_size=8).hexdigest()
        return self.window, f"{len(self.bounds) - 1} blocks #{digest}"


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
    tally: np.ndarray | None = None  # a mixture's samples of each source consumed at each chunk's end (row 0: the start)

    def consumed(self, batches: int) -> tuple[int, ...] | None:
        """A mixture's samples of each source consumed (all ranks) once rank 0 has made ``batches``
        batches of the pass, at :meth:`RankBatches.samples_done`; None for one data set."""
        if self.tally is None:
            return None
        return tuple(int(n) for n in self.tally[min(batches * self.batches.world_size, len(self.tally) - 1)])


def plan_epoch(order: EpochOrder, *, seed: int, epoch: int, start: int, world_size: int, rank: int,
               batch_size: int, drop_last: bool, consumed: tuple[int, ...] | None = None) -> EpochPlan:
    """The pass of rank ``rank`` of ``world_size`` over ``epoch`` from global position ``start`` (the
    samples of the epoch consumed across all ranks; for a mixture, ``consumed`` of each source),
    ``batch_size`` samples per rank and batch."""
    batches = rank_batches(len(order), start=start, world_size=world_size, rank=rank, batch_size=batch_size,
                           drop_last=drop_last)
    chunks = batches.chunks()
    rest = order.sequence(seed, epoch, start, chunks, consumed)
    return EpochPlan(epoch, rest[batches.positions() - start], batches, order.tally(rest, chunks, consumed))


def resolve_rank(rank: int | None, world_size: int | None, world_name: str = "world_size") -> tuple[int, int]:
    """Rank and world size: as given, else torch.distributed's, else the RANK / WORLD_SIZE that
    torchrun sets, else (0, 1). Out of range: OptionError naming the argument (the world size's is
    ``world_name``: a sampler's ``num_replicas``) or the variable."""
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = environ_int("RANK", 0), environ_int("WORLD_SIZE", 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    Range(world_name, "", WORLD_SIZE.low, WORLD_SIZE.high).check(world_size)
    if not Range("rank", "", 0, world_size - 1).accepts(rank):
        raise OptionError(f"rank={rank!r}: must be an integer from 0 to {world_size - 1} ({world_name}={world_size})")
    return rank, world_size


def resolve_seed(seed: int | None, rank: int, world_size: int, reader: str) -> tuple[int, str]:
    """The seed of ``reader``'s orders and draws, and where it came from (for explain()): as given;
    else drawn from torch's global generator, as a DataLoader's RandomSampler draws its own, so a
    run seeded with ``torch.manual_seed`` repeats and an unseeded one does not replay another's.
    Several ranks must agree: rank 0's draw is sent to the others over torch.distributed when the
    ranks are its group's (every rank makes its reader, as a DDP script does); without a process
    group they cannot agree, so ``seed`` must be given (OptionError)."""
    if seed is not None:
        return SEED.check(seed), "given (seed=)"
    drawn = int(torch.empty((), dtype=torch.int64).random_().item())  # RandomSampler's draw: 0 to 2**63 - 1
    if world_size == 1:
        return drawn, "drawn from torch's global generator (torch.manual_seed before making it repeats it)"
    if dist.is_available() and dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (rank, world_size):
        shared = [drawn]
        dist.broadcast_object_list(shared, src=0)
        return int(shared[0]), ("rank 0's draw from torch's global generator, sent to every rank over "
                                "torch.distributed (torch.manual_seed before making it repeats it)")
    raise OptionError(f"{reader}: seed=None on rank {rank} of {world_size} without a torch.distributed process group "
                      "of those ranks, so the ranks cannot share a drawn seed and would read different orders: pass "
                      "seed= (the same on every rank), or make it after torch.distributed.init_process_group()")

