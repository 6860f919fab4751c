"""QuasiRandomSampler: an I/O-friendly shuffle for any DataLoader over a ShardDataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import BlockOrder
from stoker.data.mix import Mix
from stoker.data.passes import Passes, PassesReader
from stoker.data.readable import reads_ahead
from stoker.errors import OptionError
from stoker.ranges import Choice
from stoker.state import StateError

_HINT_EVERY = 64
SHUFFLE, READAHEAD = Choice("shuffle", (True, False)), Choice("readahead", (True, False))


class QuasiRandomSampler(torch.utils.data.Sampler[int], PassesReader):
    """Each epoch: shuffle blocks of consecutive samples (``dataset``'s ``block_bytes``, 8 MiB by
    default), then draw samples at random from ``window`` blocks open at a time.

    Each block is read once, as a whole, instead of one random read per sample. Under DDP
    (``num_replicas`` and ``rank`` default to torch.distributed's, else torchrun's RANK /
    WORLD_SIZE) the epoch is dealt to the ranks in chunks of ``batch_size`` samples, in turn
    (:mod:`stoker.data.epoch`, as the Loader's): on one node from one global sequence, the same for
    any number of ranks, so that with ``batch_size`` the DataLoader's (or the default 1, sample by
    sample) every global batch of the DataLoaders of all ranks is a contiguous slice of it. On
    several ``nodes`` (default: torchrun's LOCAL_WORLD_SIZE) the data set is split into
    ``partitions`` of whole shards (default: a few per node) and each rank's chunks come from its
    own node's, so that each node reads its share (docs/distributed.md); :meth:`explain` says which
    node reads which. Nothing is
    repeated: the last global batch, when short, is split near-evenly (with fewer samples than
    ranks, the last ranks end the epoch one step early); ``drop_last`` drops it, so every rank makes
    the same number of steps (pass the DataLoader's ``batch_size`` for that).

    Passes keep a DataLoader's contract (stoker/data/passes.py, as stoker.Loader's): each ``iter()``
    is a whole pass over the current epoch, unless a state was loaded since the last pass began; a
    pass yielded whole advances the epoch (so a loop that never calls :meth:`set_epoch` gets fresh
    orders, as with ``shuffle=True``), a pass left early does not. :meth:`set_epoch` (as with
    DistributedSampler) and ``start_epoch`` name the next pass's epoch. Without ``seed``, it is drawn
    from torch's global generator, as RandomSampler draws its own (``torch.manual_seed`` before
    making the sampler repeats a run; under DDP rank 0's draw is sent to every rank over
    torch.distributed, and without a process group ``seed`` must be given: the ranks must agree).
    :meth:`state_dict` counts the samples of the epoch
    consumed by all ranks, so rank 0's state resumes every rank, on this world size or another:
    with the same global batch (``batch_size * num_replicas`` unchanged) or the same ``batch_size``
    (see docs/distributed.md). The first read-ahead groups of each epoch are small (2, 4, 8 blocks)
    so a cold start waits for little data.
    With ``readahead`` (default) the sampler, which knows the order, asks the kernel to read each
    block (``posix_fadvise`` WILLNEED) about one window before its first sample is yielded, so the
    disk streams while the current window is consumed. The page cache is shared, so this helps
    DataLoader workers in other processes too. With a node cache (``ShardDataset(cache_dir=...)``)
    a stager copies whole shards into it in the order the sampler will need them instead. From an
    object store without a node cache nothing is read ahead: blocks fetched into the sampler's
    process would go unread by the workers (give ``cache_dir``, or read with :class:`stoker.Loader`).
    Mixing is weaker than a full shuffle when the pack kept samples sorted by class: pack with
    ``--shuffle-seed`` or raise ``window`` (see :func:`stoker.data.order.classes_per_batch`).

    Over a :class:`stoker.Mix`, give ``batch_size`` (the DataLoader's): each rank's batch is
    stratified to the mix's weights, and the state counts each source's samples consumed too.
    """

    def __init__(
        self,
        dataset: ShardDataset | Mix,
        *,
        window: int = 16,
        seed: int | None = None,
        start_epoch: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        readahead: bool = True,
        batch_size: int | None = None,
        nodes: int | None = None,
        partitions: int | None = None,
    ) -> None:
        if batch_size is None and isinstance(dataset, Mix):
            raise OptionError("QuasiRandomSampler over a Mix needs batch_size= (the DataLoader's): each batch is "
                              "stratified to the mix's weights")
        self.dataset = dataset
        self.shuffle = SHUFFLE.check(shuffle)
        self.readahead = READAHEAD.check(readahead)
        self._passes = Passes("QuasiRandomSampler", dataset, "quasi_random" if shuffle else "sequential", window,
                              seed=seed, start_epoch=start_epoch, rank=rank, world_size=num_replicas,
                              batch_size=1 if batch_size is None else batch_size, drop_last=drop_last,
                              world_name="num_replicas", nodes=nodes, partitions=partitions)
        self.rank, self.num_replicas = self._passes.rank, self._passes.world_size
        self.batch_size, self.drop_last = self._passes.batch_size, self._passes.drop_last
        self._order = self._passes.epoch_order
        self.window = self._order.window
        if isinstance(dataset, ShardDataset):
            assert isinstance(self._order, BlockOrder)
            self.shards, self.bounds = dataset.shards, self._order.bounds
        self.total_samples = len(self._order)  # all ranks; len(self) is this rank's part

    def state_dict(self, samples_done: int | None = None) -> dict[str, Any]:
        """The position to resume from after this rank's loop has consumed ``samples_done`` samples of
        the current pass that the model trained on (steps of this loop x its batch size: the sampler
        cannot know what DataLoader workers fetched ahead), every rank as many (ranks step together).
        The state holds the position in the epoch's global sequence (a :class:`stoker.state.Position`),
        so rank 0's serves every rank; save it with the model's checkpoint. ``samples_done`` must be
        a multiple of ``batch_size`` (or all of the pass, a last partial batch counted whole: past
        the pass by less than a ``batch_size``; StateError beyond that)."""
        if samples_done is None:
            raise TypeError("QuasiRandomSampler.state_dict needs samples_done: the samples of this pass the "
                            "training loop consumed (DataLoader workers read ahead of it)")
        cursor = self._passes.cursor
        batches = self._passes.batches(cursor.position)
        if not isinstance(samples_done, int) or isinstance(samples_done, bool) or samples_done < 0:
            raise OptionError(f"samples_done={samples_done!r}: must be an integer >= 0 (the samples of this pass the "
                              "training loop consumed)")
        over = samples_done - batches.samples
        if self.batch_size > 1 and over >= self.batch_size:  # (sample by sample, the loop's batch is unknown)
            raise StateError(f"samples_done={samples_done} is past the end of this rank's pass of {batches.samples} "
                             f"samples by a batch_size={self.batch_size} or more: count the samples this pass's loop "
                             "consumed (its steps x batch_size), not those of several passes or of all ranks")
        if over >= 0:
            return self._passes.record(batches.end, self._passes.consumed(len(batches))).to_dict()
        if samples_done % self.batch_size:
            raise OptionError(f"samples_done={samples_done} is not a multiple of the sampler's batch_size="
                             f"{self.batch_size}: only whole chunks of every rank are a prefix of the epoch's order "
                             "(give the sampler the DataLoader's batch_size, or 1)")
        made = samples_done // self.batch_size
        return self._passes.record(batches.samples_done(made), self._passes.consumed(made)).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass yields this rank's part of the rest of ``state``'s epoch, the passes
        after it whole epochs. The state may come from another world size (rank 0's serves every
        rank): with the same global batch or the same ``batch_size``. A state saved for another
        data set, order (``shuffle``, ``window``, the data set's blocks, ``drop_last``), with a
        batch size that keeps neither, or by another part is refused (StateError). The state's
        seed is taken (with a StateWarning when ``seed=`` was given and differs)."""
        self._passes.load(state)

    def explain(self) -> str:
        """What the next pass reads (epoch, where in it, seed and where it came from), and which
        node reads which partitions of the data set, and why."""
        head = f"stoker.QuasiRandomSampler({type(self.dataset).__name__}): rank {self.rank} of {self.num_replicas}"
        return "\n".join([head, f"  next pass: {self._passes.describe_next()}", *self._passes.describe_placement()])

    def order(self) -> np.ndarray:
        """This rank's sample indices for a whole pass over the current epoch (:attr:`epoch`), from its start."""
        return self._passes.plan(self.epoch, 0).share

    def __iter__(self) -> Iterator[int]:
        """A new pass (see stoker/data/passes.py); it begins when its first index is asked for."""
        return self._pass(self._passes.begin())

    def _pass(self, number: int) -> Iterator[int]:
        share = self._passes.start(number).share
        # DataLoader workers read in other processes: blocks of an object store fetched here would go unread.
        ahead = reads_ahead(self.dataset, self._order, share, hint_blocks=self.readahead, reads_here=False,
                            home=self._passes.home_shards())
        try:
            for start in range(0, len(share), _HINT_EVERY):
                ahead.advance(start)
                yield from share[start : start + _HINT_EVERY].tolist()
            ahead.advance(len(share))
            if self._passes.latest(number):  # the next pass reads the next epoch (not yet: workers may be delivering)
                self._passes.cursor.finished = True
        finally:
            ahead.close()

    def __len__(self) -> int:
        """This rank's samples in the next pass: a whole pass's, or the rest of a loaded state's epoch."""
        return self._passes.batches(self._passes.upcoming()[1]).samples
