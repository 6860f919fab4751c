"""A check shared by the tests of the engines' writers (tests/test_spark_pack.py, tests/test_ray_data.py)."""

from __future__ import annotations

from pathlib import Path

import stoker
from stoker.format.verify import verify_dataset


def assert_same_samples(written: Path, packed: Path) -> None:
    """Sample by sample in order: every member's bytes, the key and the label; and the class
    names; and the written data set verifies (every checksum)."""
    ours, theirs = stoker.ShardDataset(written, decode="raw"), stoker.ShardDataset(packed, decode="raw")
    assert len(ours) == len(theirs) > 0
    assert ours.classes == theirs.classes
    assert (ours.targets == theirs.targets).all()
    for i in range(len(theirs)):
        assert ours.key(i) == theirs.key(i)
        assert ours.read_sample(i) == theirs.read_sample(i)
    assert verify_dataset(written) == []
