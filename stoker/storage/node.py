"""Where this process sits in a job of several nodes, as torchrun's environment says it, and what
that changes for storage: the node cache is shared by a node's ranks, the metadata of a data set is
fetched once per node, and the nodes' first requests are staggered so that many nodes starting
together do not reach the store in the same instant.

    WORLD_SIZE, RANK                 ranks in the job, this one's number
    LOCAL_WORLD_SIZE, LOCAL_RANK     ranks on this node, this one's number among them
    GROUP_RANK (torchrun), NODE_RANK (Lightning, SLURM scripts)   this node's number

Read from the environment only (no torch import): a job started by torchrun, Lightning or a
scheduler that sets these is seen as it is; one process alone is node 0 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from stoker.errors import OptionError

# The nodes' first requests are spread over at most this many seconds, and over this much per node
# below that (two nodes: 0.1 s), so a small job waits little and 64 nodes reach the store ~30 ms apart.
MAX_STAGGER = 2.0
STAGGER_PER_NODE = 0.05


@dataclass(frozen=True)
class NodePlace:
    """This process's place: ``ranks`` in the job, ``local_ranks`` of them on each node, this
    node's number ``node`` of ``nodes``, this rank's number ``local_rank`` on its node."""

    ranks: int = 1
    local_ranks: int = 1
    node: int = 0
    local_rank: int = 0

    @property
    def nodes(self) -> int:
        """Nodes in the job."""
        return max(1, self.ranks // self.local_ranks)

    def stagger(self) -> float:
        """Seconds this node waits before its first request to the store: node n of N waits
        n / N of ``min(MAX_STAGGER, STAGGER_PER_NODE * N)``, so the nodes' first requests are
        spread evenly; 0 for one node."""
        nodes = self.nodes
        return self.node % nodes / nodes * min(MAX_STAGGER, STAGGER_PER_NODE * nodes)


def this_node() -> NodePlace:
    """This process's place, from torchrun's environment (see the module docstring); a variable
    that is not an integer is an OptionError naming it."""
    ranks = environ_int("WORLD_SIZE", 1)
    local_ranks = environ_int("LOCAL_WORLD_SIZE", ranks)
    node = environ_int("GROUP_RANK", environ_int("NODE_RANK", 0))
    return NodePlace(max(1, ranks), max(1, min(local_ranks, ranks)), max(0, node), environ_int("LOCAL_RANK", 0))


def environ_int(name: str, default: int) -> int:
    """An integer environment variable that torchrun sets (``default`` when unset); OptionError naming it otherwise."""
    text = os.environ.get(name)
    try:
        return default if text is None else int(text)
    except ValueError:
        raise OptionError(f"the environment variable {name}={text!r} must be an integer (torchrun sets it)") from None
