"""QuasiRandomSampler: an I/O-friendly shuffle for any DataLoader over a ShardDataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import BlockOrder, EpochPlan, RankBatches, plan_epoch, rank_batches, resolve_rank
from stoker.data.mix import Mix
from stoker.data.mix_plan import MixOrder
from stoker.data.readable import consumed_of, epoch_order_of, identity_of, reads_ahead
from stoker.ranges import SEED
from stoker.state import Position, StateError

_HINT_EVERY = 64


class QuasiRandomSampler(torch.utils.data.Sampler[int]):
    """Each epoch: shuffle blocks of consecutive samples (``dataset``'s ``block_bytes``, 8 MiB by
    default), then draw samples at random from ``window`` blocks open at a time.

    Each block is read once, as a whole, instead of one random read per sample. The epoch's order is
    one global sequence, the same for any number of ranks (:mod:`stoker.data.epoch`, as the
    Loader's); under DDP (``num_replicas`` and ``rank`` default to torch.distributed's, else
    torchrun's RANK / WORLD_SIZE) it is dealt to the ranks in chunks of ``batch_size`` samples, in
    turn: with ``batch_size`` the DataLoader's (or the default 1, sample by sample), every global
    batch of the DataLoaders of all ranks is a contiguous slice of the sequence. Nothing is
    repeated: the last global batch, when short, is split near-evenly (with fewer samples than
    ranks, the last ranks end the epoch one step early); ``drop_last`` drops it, so every rank makes
    the same number of steps (pass the DataLoader's ``batch_size`` for that). Call :meth:`set_epoch`
    each epoch, as with DistributedSampler. :meth:`state_dict` counts the samples of the epoch
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
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        readahead: bool = True,
        batch_size: int | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if batch_size is None and isinstance(dataset, Mix):
            raise ValueError("QuasiRandomSampler over a Mix needs batch_size= (the DataLoader's): each batch is "
                             "stratified to the mix's weights")
        batch_size = 1 if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.rank, self.num_replicas = resolve_rank(rank, num_replicas)
        self.dataset = dataset
        self.seed = SEED.check(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.readahead = readahead
        self.batch_size = batch_size
        self.epoch = 0
        self._pass_start = 0  # samples of this epoch consumed (all ranks) before the pass: after load_state_dict, not 0
        self._pass_done = False  # the pass reached the end (DataLoader workers may still be delivering it)
        self._order = epoch_order_of(dataset, "quasi_random" if shuffle else "sequential", window)
        self._identity = identity_of(dataset)  # what a state names the data by
        self.window = self._order.window
        if isinstance(dataset, ShardDataset):
            assert isinstance(self._order, BlockOrder)
            self.shards, self.bounds = dataset.shards, self._order.bounds
        self.total_samples = len(self._order)  # all ranks; len(self) is this rank's part
        self._consumed: tuple[int, ...] | None = None  # a Mix's samples of each source before the pass
        self._pass_plan: EpochPlan | None = None  # the plan of the pass last started (a Mix's state counts from it)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (same on every rank). A resume point loaded for this epoch is kept."""
        if epoch != self.epoch:
            self._pass_start, self._pass_done, self._consumed = 0, False, None
        self.epoch = epoch

    def state_dict(self, samples_done: int | None = None) -> dict[str, Any]:
        """The position to resume from after this rank's loop has consumed ``samples_done`` samples of
        the current pass that the model trained on (steps of this loop x its batch size: the sampler
        cannot know what DataLoader workers fetched ahead), every rank as many (ranks step together).
        The state holds the position in the epoch's global sequence (a :class:`stoker.state.Position`),
        so rank 0's serves every rank; save it with the model's checkpoint. ``samples_done`` must be
        a multiple of ``batch_size`` (or all of the pass)."""
        if samples_done is None:
            raise TypeError("QuasiRandomSampler.state_dict needs samples_done: the samples of this pass the "
                            "training loop consumed (DataLoader workers read ahead of it)")
        if samples_done < 0:
            raise ValueError(f"samples_done must be >= 0, got {samples_done}")
        batches = self._batches()
        if samples_done >= len(batches.positions()):
            return self._position(batches.end, self._pass_consumed(len(batches))).to_dict()
        if samples_done % self.batch_size:
            raise ValueError(f"samples_done={samples_done} is not a multiple of the sampler's batch_size="
                             f"{self.batch_size}: only whole chunks of every rank are a prefix of the epoch's order "
                             "(give the sampler the DataLoader's batch_size, or 1)")
        made = samples_done // self.batch_size
        return self._position(batches.samples_done(made), self._pass_consumed(made)).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass yields this rank's part of the rest of ``state``'s epoch, the passes
        after it whole epochs. The state may come from another world size (rank 0's serves every
        rank): with the same global batch or the same ``batch_size``. A state saved for another
        data set, order (``shuffle``, ``window``, the data set's blocks, ``drop_last``), with a
        batch size that keeps neither, or by another part is refused (StateError); the state's seed
        is taken (a StateWarning when it is not this sampler's)."""
        saved, _ = Position.from_dict(state, "QuasiRandomSampler").resumed_by(self._position(0))
        if saved.samples_done > self.total_samples:
            raise StateError(f"samples_done={saved.samples_done} is outside the epoch of {self.total_samples} samples")
        self.epoch, self._pass_start, self.seed = saved.epoch, saved.samples_done, saved.seed
        self._pass_done, self._consumed = False, saved.consumed

    def order(self) -> np.ndarray:
        """This rank's sample indices for a whole pass over the current epoch, from its start."""
        return self._plan(0).share

    def __iter__(self) -> Iterator[int]:
        if self._pass_done:  # the previous pass finished its epoch: this one starts it again
            self._pass_start, self._pass_done, self._consumed = 0, False, None
        self._pass_plan = self._plan(self._pass_start)
        share = self._pass_plan.share
        # DataLoader workers read in other processes: blocks of an object store fetched here would go unread.
        ahead = reads_ahead(self.dataset, self._order, share, hint_blocks=self.readahead, reads_here=False)
        try:
            for start in range(0, len(share), _HINT_EVERY):
                ahead.advance(start)
                yield from share[start : start + _HINT_EVERY].tolist()
            ahead.advance(len(share))
            self._pass_done = True
        finally:
            ahead.close()

    def __len__(self) -> int:
        return len(self._batches(0 if self._pass_done else self._pass_start).positions())

    def _plan(self, start: int) -> EpochPlan:
        return plan_epoch(self._order, seed=self.seed, epoch=self.epoch, start=start,
                          world_size=self.num_replicas, rank=self.rank, batch_size=self.batch_size,
                          drop_last=self.drop_last, consumed=self._consumed if start == self._pass_start else None)

    def _pass_consumed(self, batches: int) -> tuple[int, ...] | None:
        """A Mix's samples of each source consumed once this rank's loop made ``batches`` batches of
        the current pass (None for one data set)."""
        if not isinstance(self._order, MixOrder):
            return None
        plan = self._pass_plan
        if plan is None or (plan.epoch, plan.batches.origin) != (self.epoch, self._pass_start):
            plan = self._pass_plan = self._plan(self._pass_start)
        return plan.consumed(batches)

    def _batches(self, start: int | None = None) -> RankBatches:
        return rank_batches(self.total_samples, start=self._pass_start if start is None else start,
                            world_size=self.num_replicas, rank=self.rank, batch_size=self.batch_size,
                            drop_last=self.drop_last)

    def _position(self, samples_done: int, consumed: tuple[int, ...] | None = None) -> Position:
        window, blocks = self._order.settings()
        dataset, mix = self._identity
        return Position("QuasiRandomSampler", dataset, self.seed, self.epoch, self.num_replicas, self.rank,
                        self.batch_size, self._order.order, window, blocks, self.drop_last, samples_done, mix,
                        consumed_of(self.dataset, consumed))
