"""QuasiRandomSampler: an I/O-friendly shuffle for any DataLoader over a ShardDataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import EpochPlan, Order, order_settings, plan_epoch, resolve_rank, share_length
from stoker.data.mix import Mix, MixReader
from stoker.data.readahead import Lookahead, ReadsAhead, block_bounds_of, open_blocks
from stoker.ranges import SEED
from stoker.state import Position, StateError

_HINT_EVERY = 64


class QuasiRandomSampler(torch.utils.data.Sampler[int]):
    """Each epoch: shuffle blocks of consecutive samples (``dataset``'s ``block_bytes``, 8 MiB by
    default), then draw samples at random from ``window`` blocks open at a time.

    Each block is read once, as a whole, instead of one random read per sample. Under DDP each rank
    gets a disjoint, equal-length share of the same global order (``num_replicas`` and ``rank``
    default to torch.distributed's, else torchrun's RANK / WORLD_SIZE); call :meth:`set_epoch`
    each epoch, as with DistributedSampler. The order comes from :mod:`stoker.data.epoch`, as the
    Loader's does; the first read-ahead groups of each epoch are small (2, 4, 8 blocks) so a cold
    start waits for little data.
    With ``readahead`` (default) the sampler, which knows the order, asks the kernel to read each
    block (``posix_fadvise`` WILLNEED) about one window before its first sample is yielded, so the
    disk streams while the current window is consumed. The page cache is shared, so this helps
    DataLoader workers in other processes too. With a node cache (``ShardDataset(cache_dir=...)``)
    a stager copies whole shards into it in the order the sampler will need them instead.
    Mixing is weaker than a full shuffle when the pack kept samples sorted by class: pack with
    ``--shuffle-seed`` or raise ``window`` (see :func:`stoker.data.order.classes_per_batch`).

    Over a :class:`stoker.Mix`, give ``batch_size`` (the DataLoader's): the sampler yields this
    rank's batches of the mix's epoch one after another, each stratified to the weights.
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
        self.rank, self.num_replicas = resolve_rank(rank, num_replicas)
        self.seed = SEED.check(seed)
        self._mix = _mix_reader(dataset, batch_size, self._order_of(shuffle), window, self.rank, self.num_replicas,
                                drop_last)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.readahead = readahead
        if self._mix is not None:
            assert isinstance(dataset, Mix)
            self.window = window
            self.total_samples = self._mix.batches() * self._mix.batch_size * self.num_replicas
            self._dataset = dataset.digest()
        else:
            assert isinstance(dataset, ShardDataset)
            self.shards = dataset.shards
            self.bounds = block_bounds_of(self.shards)
            self.window = open_blocks(self.shards, window)
            self.total_samples = int(self.bounds[-1])  # all ranks; len(self) is this rank's share
            self._dataset = self.shards.manifest.digest()
        self.epoch = 0
        self._pass_start = 0  # where in this epoch's share the pass begins: after load_state_dict, not 0
        self._pass_done = False  # the pass reached the end (DataLoader workers may still be delivering it)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (same on every rank). A resume point loaded for this epoch is kept."""
        if epoch != self.epoch:
            self._pass_start, self._pass_done = 0, False
        self.epoch = epoch

    def state_dict(self, samples_done: int | None = None) -> dict[str, Any]:
        """The position to resume from after the current pass has delivered ``samples_done``
        samples that the model trained on (steps of this loop x batch size: the sampler cannot know
        what DataLoader workers fetched ahead). A resumed pass counts from where it resumed; the
        state holds the position in the epoch (a :class:`stoker.state.Position`). Save it with the
        model's checkpoint (one per rank, or rank 0's for all: ranks step together)."""
        if samples_done is None:
            raise TypeError("QuasiRandomSampler.state_dict needs samples_done: the samples of this pass the "
                            "training loop consumed (DataLoader workers read ahead of it)")
        if samples_done < 0:
            raise ValueError(f"samples_done must be >= 0, got {samples_done}")
        return self._position(min(self._pass_start + int(samples_done), self._share_length())).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass yields the rest of ``state``'s epoch, the passes after it whole epochs.
        A state saved for another data set, world size, order (``shuffle``, ``window``, the data
        set's blocks, ``drop_last``) or by another part is refused (StateError); the state's seed
        is taken (a StateWarning when it is not this sampler's)."""
        saved = Position.from_dict(state, "QuasiRandomSampler")
        if self._mix is not None:
            saved = self._mix.resumable(saved)
        saved.check_fits(self._position(0))
        if not 0 <= saved.samples_done <= self._share_length():
            raise StateError(f"samples_done={saved.samples_done} is outside this rank's share of "
                             f"{self._share_length()} samples")
        self.epoch, self._pass_start, self.seed = saved.epoch, saved.samples_done, saved.seed
        self._pass_done = False

    def order(self) -> np.ndarray:
        """This rank's sample indices for the current epoch."""
        return self._plan().share

    def __iter__(self) -> Iterator[int]:
        if self._pass_done:  # the previous pass finished its epoch: this one starts it again
            self._pass_start, self._pass_done = 0, False
        share = self._plan(self._pass_start).rest
        ahead: ReadsAhead = (Lookahead(self.shards, self.bounds, share, self.window, hint_blocks=self.readahead)
                 if self._mix is None else self._mix.mix.lookahead(share, self.window, hint_blocks=self.readahead))
        try:
            for start in range(0, len(share), _HINT_EVERY):
                ahead.advance(start)
                yield from share[start : start + _HINT_EVERY].tolist()
            ahead.advance(len(share))
            self._pass_done = True
        finally:
            ahead.close()

    def __len__(self) -> int:
        return self._share_length() - (0 if self._pass_done else self._pass_start)

    def _plan(self, start: int = 0) -> EpochPlan:
        if self._mix is not None:
            return self._mix.plan(self.seed, self.epoch, start)
        return plan_epoch(self.bounds, order=self._order(), window=self.window, seed=self.seed, epoch=self.epoch,
                          rank=self.rank, world_size=self.num_replicas, drop_last=self.drop_last, start=start)

    def _order(self) -> Order:
        return self._order_of(self.shuffle)

    @staticmethod
    def _order_of(shuffle: bool) -> Order:
        return "quasi_random" if shuffle else "sequential"

    def _position(self, samples_done: int) -> Position:
        if self._mix is not None:
            return self._mix.position("QuasiRandomSampler", self._dataset, self.seed, self.epoch, samples_done)
        window, blocks = order_settings(self.bounds, self._order(), self.window)
        return Position("QuasiRandomSampler", self._dataset, self.seed, self.epoch, self.num_replicas, self.rank,
                        None, self._order(), window, blocks, self.drop_last, samples_done)

    def _share_length(self) -> int:
        if self._mix is not None:
            return self.total_samples // self.num_replicas
        return share_length(self.total_samples, self.num_replicas, self.drop_last)


def _mix_reader(dataset: ShardDataset | Mix, batch_size: int | None, order: Order, window: int, rank: int,
                world_size: int, drop_last: bool) -> MixReader | None:
    """How the sampler reads ``dataset`` when it is a Mix (its batches need the DataLoader's batch size)."""
    if not isinstance(dataset, Mix):
        return None
    if batch_size is None:
        raise ValueError("QuasiRandomSampler over a Mix needs batch_size= (the DataLoader's): each batch is stratified "
                         "to the mix's weights")
    return MixReader(dataset, batch_size, order, window, rank, world_size, drop_last)
