"""``loader.sampler`` and ``loader.batch_sampler``: what training scripts read of a DataLoader,
as views of a stoker.Loader's order.

    timm's train.py        _set_loader_epoch: loader.batch_sampler.set_epoch, else loader.sampler.set_epoch
    Lightning              loader.sampler.set_epoch and loader.batch_sampler.sampler.set_epoch, each epoch
    imagenet/main.py       len(val_loader.sampler) * world_size < len(val_loader.dataset): samples dropped

The sampler is this rank's share of a whole pass over the Loader's current epoch (as
DistributedSampler's is), and its ``set_epoch`` is the Loader's; the batch sampler cuts that share
into the Loader's batches. Neither makes a batch: iterating them only lists indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch.utils.data


class LoaderSampler(torch.utils.data.Sampler[int]):
    """This rank's sample indices of a whole pass (``indices()``: the order, ``samples()``: how
    many, without planning it); ``set_epoch`` sets the Loader's epoch."""

    def __init__(self, indices: Callable[[], np.ndarray], samples: Callable[[], int],
                 set_epoch: Callable[[int], None]) -> None:
        self._indices, self._samples, self._set_epoch = indices, samples, set_epoch

    def set_epoch(self, epoch: int) -> None:
        """The Loader's next pass reads ``epoch`` (see stoker.Loader.set_epoch)."""
        self._set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices().tolist())

    def __len__(self) -> int:
        return self._samples()


class LoaderBatchSampler(torch.utils.data.Sampler[list[int]]):
    """The Loader's batches of a whole pass as lists of indices, as torch's BatchSampler gives them:
    ``sampler`` cut into ``batch_size`` (the last one shorter, unless ``drop_last`` dropped it)."""

    def __init__(self, sampler: LoaderSampler, batch_size: int, drop_last: bool, batches: Callable[[], int]) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self._batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        share = list(self.sampler)
        for start in range(0, len(share), self.batch_size):
            yield share[start : start + self.batch_size]

    def __len__(self) -> int:
        return self._batches()
