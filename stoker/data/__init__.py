"""Reading packed data sets: ShardDataset, QuasiRandomSampler, sample orders and verification."""

from stoker.data.dataset import ShardDataset
from stoker.data.sampler import QuasiRandomSampler

__all__ = ["QuasiRandomSampler", "ShardDataset"]
