"""QuasiRandomSampler: an I/O-friendly shuffle for any DataLoader over a ShardDataset."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch.distributed as dist
import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.order import quasi_random_order, rank_share
from stoker.data.readahead import Lookahead

_HINT_EVERY = 64


class QuasiRandomSampler(torch.utils.data.Sampler[int]):
    """Each epoch: shuffle blocks of consecutive samples (``dataset``'s ``block_bytes``, 8 MiB by
    default), then draw samples at random from ``window`` blocks open at a time.

    Each block is read once, as a whole, instead of one random read per sample. Under DDP each rank
    gets a disjoint, equal-length share of the same global order (``num_replicas`` and ``rank``
    default to torch.distributed's); call :meth:`set_epoch` each epoch, as with DistributedSampler.
    With ``readahead`` (default) the sampler, which knows the order, asks the kernel to read each
    block (``posix_fadvise`` WILLNEED) about one window before its first sample is yielded, so the
    disk streams while the current window is consumed. The page cache is shared, so this helps
    DataLoader workers in other processes too. With a node cache (``ShardDataset(cache_dir=...)``)
    a stager copies whole shards into it in the order the sampler will need them instead.
    Mixing is weaker than a full shuffle when the pack kept samples sorted by class: pack with
    ``--shuffle-seed`` or raise ``window`` (see :func:`stoker.data.order.classes_per_batch`).
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        window: int = 16,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        readahead: bool = True,
    ) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for {num_replicas} replicas")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.shards = dataset.shards
        self.bounds = self.shards.block_bounds()
        self.window = self.shards.open_blocks(window)
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.readahead = readahead
        self.epoch = 0
        self._pass_start = 0  # where in this epoch's share the pass begins: after load_state_dict, not 0
        self._pass_done = False  # the pass reached the end (DataLoader workers may still be delivering it)
        self.total_samples = int(self.bounds[-1])  # all ranks; len(self) is this rank's share

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (same on every rank). A resume point loaded for this epoch is kept."""
        if epoch != self.epoch:
            self._pass_start, self._pass_done = 0, False
        self.epoch = epoch

    def state_dict(self, samples_done: int) -> dict[str, int]:
        """The position to resume from after the current pass has delivered ``samples_done``
        samples that the model trained on (steps of this loop x batch size: the sampler cannot know
        what DataLoader workers fetched ahead). A resumed pass counts from where it resumed; the
        state holds the position in the epoch. Save one per rank, with the model's checkpoint."""
        done = min(self._pass_start + int(samples_done), self._share_length())  # a last, partial batch
        return {"epoch": self.epoch, "samples_done": done, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next pass yields the rest of ``state``'s epoch, the passes after it whole epochs."""
        if not 0 <= state["samples_done"] <= self._share_length():
            raise ValueError(f"samples_done={state['samples_done']} is outside this rank's share of "
                             f"{self._share_length()} samples: another data set or world size?")
        self.epoch, self._pass_start, self.seed = state["epoch"], state["samples_done"], state["seed"]
        self._pass_done = False

    def order(self) -> np.ndarray:
        """This rank's sample indices for the current epoch."""
        if self.shuffle:
            global_order = quasi_random_order(self.bounds, self.window, self.seed, self.epoch)
        else:
            global_order = np.arange(self.total_samples, dtype=np.int64)
        return rank_share(global_order, self.rank, self.num_replicas, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        if self._pass_done:  # the previous pass finished its epoch: this one starts it again
            self._pass_start, self._pass_done = 0, False
        share = self.order()[self._pass_start :]
        ahead = Lookahead(self.shards, self.bounds, share, self.window, hint_blocks=self.readahead)
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

    def _share_length(self) -> int:
        n = self.total_samples
        return n // self.num_replicas if self.drop_last else -(-n // self.num_replicas)
