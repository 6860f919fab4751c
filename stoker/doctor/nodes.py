"""What a job of several nodes asks of the store, from the data set's shards and the placement
(which shards each node's ranks read), before it runs: ``stoker doctor PATH --nodes N``.

    shard bytes and samples, nodes, ranks per node  ──forecast──>  per node: the bytes of the shards
                                                       it reads (its share), what it fetches from
                                                       the store per epoch with a cache that holds
                                                       its share and with one that does not, the
                                                       cache each needs; the manifest and indexes,
                                                       once per node

The shards each node's ranks read are :func:`shards_read`: the Loader's own placement
(:mod:`stoker.data.placement`: whole shards in partitions, each on one node), so a node's share is
about 1/N of the data set. A node cache of whole shards (``cache_dir``, or the one chosen for
several ranks) makes each node fetch each shard it reads once: once per run when its limit holds
the node's share, about once per epoch when it does not (room for the shards its ranks have open
and those staged next is the least that keeps it so: :data:`OPEN_SHARDS` of the largest). Not
counted: the tail of an epoch, where a node that ran out of its own samples reads some of the
node with the most left (a few batches' worth).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.data.placement import Placement, default_partitions, node_shards
from stoker.storage.node import NodePlace

# How the ranks' reads fall on nodes (see shards_read), in words.
PLACEMENT = "each node reads its own partitions of whole shards"
# Shards a node's cache needs room for at the least: those its ranks read at once and as many
# staged next (the order shuffles whole shards, as many open as fill half the limit, when the
# limit is below what the node reads).
OPEN_SHARDS = 4


def shards_read(shard_samples: np.ndarray, nodes: int) -> list[np.ndarray]:
    """The shards each node's ranks read in an epoch: those of its partitions, as a Loader or sampler
    places them on ``nodes`` nodes by default (:func:`stoker.data.placement.default_partitions`)."""
    partitions = default_partitions(len(shard_samples), nodes)
    placement = Placement.of(partitions, nodes)
    return [node_shards(shard_samples, partitions, np.array(placement.node_of), node) for node in range(nodes)]


@dataclass(frozen=True)
class NodeForecast:
    """Per node of ``nodes`` (``ranks`` each): ``share`` the bytes of the shards it reads;
    ``largest`` shard and the set's ``total`` bytes; ``metadata`` the manifest's and indexes'
    bytes each node fetches once."""

    nodes: int
    ranks: int
    share: np.ndarray
    largest: int
    total: int
    metadata: int

    @property
    def least_cache(self) -> int:
        """The smallest ``cache_limit`` with which a node still fetches each byte about once per epoch."""
        return OPEN_SHARDS * self.largest

    def per_epoch(self, cache_limit: float) -> tuple[np.ndarray, np.ndarray]:
        """Each node's bytes from the store in the first epoch and in each later one, with a
        node cache of ``cache_limit`` bytes (``inf``: room for everything)."""
        holds = self.share <= cache_limit
        return self.share.copy(), np.where(holds, 0, self.share)

    def stagger(self) -> float:
        """The longest a node waits before its first request (:meth:`NodePlace.stagger`)."""
        return max(NodePlace(self.nodes, 1, node).stagger() for node in range(self.nodes))

    def to_dict(self) -> dict:
        """The forecast as the doctor's report holds it (bytes; a node cache that holds the share)."""
        first, later = self.per_epoch(float("inf"))
        return {"nodes": self.nodes, "ranks_per_node": self.ranks, "data_set_bytes": self.total,
                "metadata_bytes_per_node": self.metadata, "share_bytes": self.share.tolist(),
                "store_bytes_first_epoch": int(first.sum()), "store_bytes_later_epochs": int(later.sum()),
                "cache_for_share_bytes": int(self.share.max()), "least_cache_bytes": self.least_cache,
                "first_request_spread_s": round(self.stagger(), 3)}

    def lines(self) -> list[str]:
        """The forecast in words, for the terminal report."""
        share, gb = self.share, 1e9
        same = share.min() == share.max()
        each = f"{share.max() / gb:,.1f} GB" if same else f"{share.min() / gb:,.1f}-{share.max() / gb:,.1f} GB"
        return [f"Several nodes ({self.nodes} x {self.ranks} ranks; {PLACEMENT})",
                f"  each node reads {each} per epoch ({share.max() / self.total:.2f} x the {self.total / gb:,.1f} GB set); "
                f"all nodes together {share.sum() / self.total:.2f} x the set",
                f"  node cache of {share.max() / gb:,.1f} GB or more per node (its share): epoch 1 fetches "
                f"{share.sum() / gb:,.1f} GB from the store in all, later epochs nothing",
                f"  node cache below that (at least {self.least_cache / gb:,.2f} GB, {OPEN_SHARDS} of the largest "
                f"shard): {share.sum() / gb:,.1f} GB from the store every epoch",
                f"  manifest and indexes: {self.metadata / 1e6:,.1f} MB per node, once; the nodes' first requests "
                f"spread over {self.stagger():.2f} s"]


def forecast(shard_bytes: np.ndarray, shard_samples: np.ndarray, index_bytes: int, manifest_bytes: int, nodes: int,
             ranks: int) -> NodeForecast:
    """The forecast for ``nodes`` nodes of ``ranks`` ranks reading shards of ``shard_bytes`` and
    ``shard_samples`` (``index_bytes`` of indexes and a manifest of ``manifest_bytes`` besides)."""
    sizes = np.asarray(shard_bytes, np.int64)
    share = np.array([int(sizes[mine].sum()) for mine in shards_read(np.asarray(shard_samples), nodes)], np.int64)
    return NodeForecast(nodes, ranks, share, int(sizes.max(initial=0)), int(sizes.sum()), index_bytes + manifest_bytes)
