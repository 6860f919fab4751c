"""Pure functions that fix the shard plan up front: which samples go to which shard, and digests
that tell a resumed pack whether a finished shard still matches its plan."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import xxhash

# Two tar headers (image and class members) and the mean block padding of each member.
SAMPLE_OVERHEAD_BYTES = 2 * 512 + 512


def samples_per_shard(mean_sample_bytes: float, shard_bytes: int) -> int:
    """How many samples of the given mean size fill a shard of ``shard_bytes``."""
    return max(1, int(shard_bytes // (mean_sample_bytes + SAMPLE_OVERHEAD_BYTES)))


def shard_bounds(num_samples: int, per_shard: int) -> np.ndarray:
    """``bounds[i]:bounds[i + 1]`` are the positions (in pack order) that shard i holds."""
    bounds = np.arange(0, num_samples, per_shard, dtype=np.int64)
    return np.append(bounds, num_samples)


def pack_order(num_samples: int, shuffle_seed: int | None) -> np.ndarray:
    """Source positions in the order they are packed: listing order, or a seeded permutation."""
    if shuffle_seed is None:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(shuffle_seed).permutation(num_samples)


def digest(*parts: object) -> str:
    """A stable digest of JSON-serialisable parts (paths, keys, labels, options)."""
    h = xxhash.xxh3_128()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=_plain).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def sample_positions(num_samples: int, count: int) -> Sequence[int]:
    """Evenly spread positions used to estimate sizes without reading everything."""
    return np.unique(np.linspace(0, num_samples - 1, min(count, num_samples)).astype(np.int64)).tolist()


def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"cannot digest {type(value).__name__}")
