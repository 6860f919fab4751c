"""The epoch plan: which samples one rank reads in one epoch, in what order, from where a pass starts.

    (block bounds, order kind, window, seed, epoch, rank, world size, drop_last)  ──>  share
    share[start:]  ──>  what the pass reads, and what is read or staged ahead (never before ``start``)

stoker.Loader and QuasiRandomSampler both read their epochs from here, so they agree on order,
rank shares, padding, blocks and resume points. Everything but :func:`resolve_rank` is a pure
function of its arguments.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch.distributed as dist

from stoker.data.order import quasi_random_order, rank_share

Order = Literal["quasi_random", "random", "sequential"]
ORDERS = ("quasi_random", "random", "sequential")


@dataclass(frozen=True)
class EpochPlan:
    """One rank's pass over one epoch: the whole share of the epoch in order, and where the pass starts."""

    epoch: int
    share: np.ndarray  # this rank's sample indices for the epoch, in order (padded to the ranks' common length)
    start: int  # samples of the share already consumed: 0, or a resume point

    @property
    def rest(self) -> np.ndarray:
        """What the pass reads: the share from ``start`` on."""
        return self.share[self.start :]


def plan_epoch(bounds: np.ndarray, *, order: Order, window: int, seed: int, epoch: int, rank: int, world_size: int,
               drop_last: bool, start: int = 0) -> EpochPlan:
    """The plan of ``epoch`` for rank ``rank`` of ``world_size``, resuming after ``start`` samples.

    ``bounds``: block boundaries (see :func:`stoker.data.order.block_bounds`). ``quasi_random``
    shuffles blocks and reads ``window`` at a time (see :func:`quasi_random_order`); ``random`` is
    a full permutation; ``sequential`` is the stored order. Every rank gets an equal share, padded by
    repeating the start of the order unless ``drop_last``.
    """
    n = int(bounds[-1])
    if order == "quasi_random":
        share = quasi_random_order(bounds, window, seed, epoch, rank=rank, world_size=world_size, drop_last=drop_last)
    else:
        every = np.random.default_rng([seed, epoch]).permutation(n) if order == "random" else np.arange(n, dtype=np.int64)
        share = rank_share(every, rank, world_size, drop_last)
    if not 0 <= start <= len(share):
        raise ValueError(f"start {start} is outside this rank's share of {len(share)} samples")
    return EpochPlan(epoch, share, start)


def order_settings(bounds: np.ndarray, order: Order, window: int) -> tuple[int | None, str | None]:
    """What besides seed, epoch, ranks and ``drop_last`` decides an ``order``'s epochs, as a resume
    state records it: for ``quasi_random``, ``window`` and the block layout (``"<count> blocks
    #<digest of bounds>"``); for the other orders nothing (None, None)."""
    if order != "quasi_random":
        return None, None
    digest = hashlib.blake2b(np.asarray(bounds, dtype="<i8").tobytes(), digest_size=8).hexdigest()
    return window, f"{len(bounds) - 1} blocks #{digest}"


def share_length(num_samples: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank per epoch (see :func:`stoker.data.order.rank_share`)."""
    return num_samples // world_size if drop_last else -(-num_samples // world_size)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: as given, else torch.distributed's, else the RANK / WORLD_SIZE that
    torchrun sets, else (0, 1)."""
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world size {world_size}")
    return rank, world_size
