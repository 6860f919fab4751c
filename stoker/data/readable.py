"""What stoker.Loader and QuasiRandomSampler read, one packed data set (of images or of video
clips) or a :class:`Mix` of them, and what they need of it, in one place: its epochs, the
reading ahead of a pass, whether its bytes are fetched into each reading process, and what its
resume state names it by."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import BlockOrder, Order
from stoker.data.mix import ClipSet, Mix
from stoker.data.mix_plan import MixOrder
from stoker.data.readahead import Lookahead, ReadsAhead, block_bounds_of, open_blocks
from stoker.storage.remote import RemoteData

Readable = ShardDataset | ClipSet | Mix


def epoch_order_of(dataset: Readable, order: Order, window: int) -> BlockOrder | MixOrder:
    """The epochs ``dataset`` is read in: a Mix's over its sources, or one data set's blocks with
    ``window`` of them open (as many as its shards allow: the order's ``window``)."""
    if isinstance(dataset, Mix):
        return dataset.epoch_order(order, window)
    return BlockOrder(block_bounds_of(dataset.shards), order, open_blocks(dataset.shards, window), dataset.shards.starts)


def reads_ahead(dataset: Readable, epoch_order: BlockOrder | MixOrder, share: np.ndarray,
                hint_blocks: bool, reads_here: bool, trail: int = 0,
                home: list[np.ndarray] | None = None) -> ReadsAhead:
    """The reading ahead of a pass over ``share`` (see :class:`Lookahead`; ``reads_here``: whether this
    process reads the samples; ``trail``: how far reads may trail the position ahead is given;
    ``home``: the shards of each source that this rank's node holds, None: all): a Mix's reads
    each source's."""
    if isinstance(dataset, Mix):
        return dataset.lookahead(share, epoch_order.window, hint_blocks, reads_here, trail, home)
    assert isinstance(epoch_order, BlockOrder)
    return Lookahead(dataset.shards, epoch_order.bounds, share, epoch_order.window, hint_blocks, reads_here, trail,
                     None if home is None else home[0])


def shard_bounds_of(dataset: Readable) -> np.ndarray:
    """The first sample of each shard in ``dataset``'s index space, then its length (a Mix: every
    source's shards, one source after another): what :class:`stoker.data.skips.Skips` passes over
    when a shard cannot be read."""
    if isinstance(dataset, Mix):
        return np.unique(np.concatenate([offset + s.shards.starts for offset, s in zip(dataset.offsets, dataset.sources)]))
    return dataset.shards.starts


def fetches_per_process(dataset: Readable) -> bool:
    """Whether reading ``dataset`` fetches from an object store into the memory of each process
    that reads (a source at a URL without a node cache, which processes would share)."""
    sources = dataset.sources if isinstance(dataset, Mix) else [dataset]
    return any(s.shards.remote is not None and s.shards.cache is None for s in sources)


def storage_of(dataset: Readable) -> Storage:
    """Where ``dataset``'s bytes come from, as the Loader's tuner needs it (see :class:`Storage`)."""
    sources = dataset.sources if isinstance(dataset, Mix) else [dataset]
    remotes = [s.shards.remote for s in sources if s.shards.remote is not None]
    given = [n for s in sources if (n := s.shards.settings.reads_in_flight) is not None]
    stored = sum(entry.bytes for s in sources for entry in s.shards.manifest.shards)
    samples = sum(len(s.shards) for s in sources)
    return Storage(remotes, any(s.shards.cache is not None for s in sources), min(given, default=None),
                   stored / max(1, samples), max(s.shards.block_bytes for s in sources))


@dataclass(frozen=True)
class Storage:
    """Where a data set's bytes come from: the object stores it reads (``remotes``, a
    :class:`RemoteData` each), whether a node cache stages its shards (``cached``), the reads in
    flight its ShardDatasets were given (None: left to tune), the mean stored bytes of a sample
    and the bytes of a block of its order."""

    remotes: list[RemoteData]
    cached: bool
    reads_in_flight: int | None
    sample_bytes: float
    block_bytes: int


def storage_lines_of(dataset: Readable) -> list[str]:
    """Where each data set's bytes come from and where the node keeps them, one line each (explain())."""
    sources = dataset.sources if isinstance(dataset, Mix) else [dataset]
    return [s.shards.describe_storage() for s in sources]


def identity_of(dataset: Readable) -> tuple[str, str | None]:
    """What a resume state names ``dataset`` by: its digest, and for a Mix how it mixes (a hash
    of every shard's entry: a reader computes it once, not with every state)."""
    if isinstance(dataset, Mix):
        return dataset.digest(), dataset.describe()
    return dataset.shards.manifest.digest(), None
