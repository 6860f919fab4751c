"""Who the ranks are: this rank, the world size, the nodes they run on and the seed they share,
as given, else from torch.distributed, else from the environment torchrun sets (RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK). The one place stoker's readers ask; their orders and plans
(stoker/data/epoch.py) take the answers as arguments."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from stoker.data.placement import PlacementWarning
from stoker.errors import OptionError
from stoker.ranges import NODES, SEED, WORLD_SIZE, Range
from stoker.storage.node import environ_int


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


def local_world_size() -> int:
    """torchrun's LOCAL_WORLD_SIZE: the ranks of this node; 0 where it is not set."""
    return environ_int("LOCAL_WORLD_SIZE", 0)


def resolve_nodes(nodes: int | None, rank: int, world_size: int) -> tuple[int, str]:
    """The nodes the ``world_size`` ranks run on, ranks numbered node by node (torchrun's numbering:
    rank r on node r // (world_size // nodes)), and where that came from (for explain()): as given;
    else torchrun's, WORLD_SIZE / LOCAL_WORLD_SIZE, where WORLD_SIZE is this world's and this rank
    is on its GROUP_RANK (or NODE_RANK); else one node. ``nodes`` that do not divide the world:
    OptionError."""
    if nodes is not None:
        NODES.check(nodes)
        if world_size % nodes:
            raise OptionError(f"nodes={nodes}: must divide world_size={world_size}: the ranks are numbered node by "
                              "node, the same number on each (torchrun's numbering)")
        return nodes, "given (nodes=)"
    local = local_world_size()
    if local < 1 or environ_int("WORLD_SIZE", 0) != world_size:
        return 1, "one node (no torchrun LOCAL_WORLD_SIZE for this world: pass nodes= where its ranks run on several)"
    named = next((name for name in ("GROUP_RANK", "NODE_RANK") if name in os.environ), None)
    if world_size % local or (named is not None and environ_int(named, 0) != rank // local):
        where = f" and {named}={os.environ[named]}" if named else ""
        why = (f"one node: torchrun's LOCAL_WORLD_SIZE={local}{where} do not number rank {rank} of {world_size} "
               "node by node, so every rank reads from all the data as on one node (pass nodes=)")
        warnings.warn(f"stoker: {why}", PlacementWarning, stacklevel=4)
        return 1, why
    return world_size // local, f"torchrun's: {world_size // local} of LOCAL_WORLD_SIZE={local} ranks each"

