"""``on_error="skip"`` over whole damaged shards (issue 40, class 7): one rule for ShardDataset and
the Loader (stoker/data/skips.py), the same replacement whatever the threads, work linear in the
damaged samples (reads counted, not timed) and one warning per damaged shard."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import CorruptDataError

CROP = stoker.CropSpec("resize", size=(8, 8), flip=False)


class Counting(stoker.ShardDataset):
    """A ShardDataset that counts the samples read one by one (ShardDataset's own reads, and the
    Loader's outside its native call: every try of a damaged sample and of its replacements)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0
        self._counting = threading.Lock()

    def read_image(self, index, into=None):
        with self._counting:
            self.reads += 1
        return super().read_image(index, into)


@pytest.fixture(scope="module")
def small_samples(tmp_path_factory) -> Path:
    """600 tiny photos in 6 shards of ~100 samples."""
    src = tmp_path_factory.mktemp("many") / "src"
    rng = np.random.default_rng(0)
    for i in range(600):
        folder = src / f"c{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i:03}.jpg", quality=90)
    stoker.pack(src, src.parent / "ds", shard_bytes=256 << 10, workers=1, progress=False)
    return src.parent / "ds"


def damaged_copy(root: Path, tmp_path: Path) -> tuple[Path, range, range]:
    """A copy with shard 1 lost (its file gone) and shard 3 truncated after its 10th sample: the
    samples of each, as ranges of global indices."""
    copy = Path(shutil.copytree(root, tmp_path / "ds"))
    dataset = stoker.ShardDataset(copy)
    shards = dataset.shards.manifest.shards
    (copy / shards[1].name).unlink()
    with open(copy / shards[3].name, "r+b") as f:
        f.truncate(int(dataset.shards.index(3).samples[10]["start"]) + 100)
    lost = range(shards[1].start, shards[1].start + shards[1].count)
    cut = range(shards[3].start + 10, shards[3].start + shards[3].count)
    assert len(lost) > 90 and len(cut) > 80
    return copy, lost, cut


def warnings_about(caplog, dataset: stoker.ShardDataset) -> dict[str, int]:
    """How many warnings named each shard of ``dataset``."""
    counts: dict[str, int] = {}
    for record in caplog.records:
        if record.levelno == logging.WARNING and "skipping damaged sample" in record.getMessage():
            named = [s.name for s in dataset.shards.manifest.shards if f"/{s.name}" in record.getMessage()]
            assert len(named) == 1, record.getMessage()
            counts[named[0]] = counts.get(named[0], 0) + 1
    return counts


def test_shard_dataset_skips_damaged_shards_in_linear_work(small_samples, tmp_path, caplog):
    root, lost, cut = damaged_copy(small_samples, tmp_path)
    caplog.set_level(logging.WARNING, logger="stoker")
    dataset = Counting(root, decode="raw", on_error="skip")
    plain = stoker.ShardDataset(small_samples, decode="raw")
    items = [dataset[i] for i in range(len(dataset))]
    # the next readable sample: past the lost shard, and past the truncated shard's end
    assert items[lost[0]] == items[lost[-1]] == plain[lost[-1] + 1]
    assert items[cut[0]] == plain[(cut[-1] + 1) % len(plain)]
    assert dataset.skipped == len(lost) + len(cut)  # each item served by another sample
    # a read per item, one per replacement, one per damaged sample found: no trying sample after sample
    assert dataset.reads <= len(dataset) + 2 * (len(lost) + len(cut)), dataset.reads
    names = dataset.shards.manifest.shards
    assert warnings_about(caplog, dataset) == {names[1].name: 1, names[3].name: 1}


@pytest.mark.parametrize("order", ["sequential", "quasi_random"])
def test_the_loader_replaces_as_shard_dataset_does_in_linear_work(small_samples, tmp_path, caplog, order):
    root, lost, cut = damaged_copy(small_samples, tmp_path)
    caplog.set_level(logging.WARNING, logger="stoker")
    reference = stoker.ShardDataset(root, decode="raw", on_error="skip")
    runs = []
    for threads in (1, 3):
        dataset = Counting(root, on_error="skip")
        loader = stoker.Loader(dataset, 32, crop=CROP, order=order, threads=threads, seed=3)
        labels = np.concatenate([labels.numpy() for _, labels in loader])
        runs.append((labels, loader.indices(0)))
        assert loader.skipped == len(lost) + len(cut)
        assert dataset.reads <= 3 * (len(lost) + len(cut)), dataset.reads  # the rest go through the native call
    (labels, indices), (labels_3, _) = runs
    assert np.array_equal(labels, labels_3)  # the same replacements whatever the threads
    assert np.array_equal(labels, [reference[int(i)][1] for i in indices])  # ShardDataset's rule
    names = reference.shards.manifest.shards
    assert warnings_about(caplog, reference) == {names[1].name: 1, names[3].name: 1}  # in this process, both loaders


def test_worker_processes_replace_as_threads_do(small_samples, tmp_path):
    root, _, _ = damaged_copy(small_samples, tmp_path)
    labels = []
    for processes in (0, 2):
        loader = stoker.Loader(stoker.ShardDataset(root, on_error="skip"), 32, crop=CROP, order="sequential",
                               threads=2, processes=processes, seed=3)
        labels.append(np.concatenate([labels.numpy() for _, labels in loader]))
    assert np.array_equal(*labels)


def test_nothing_readable_left_is_said_at_once(small_samples, tmp_path):
    root = Path(shutil.copytree(small_samples, tmp_path / "ds"))
    for shard in root.glob("shard-*.tar"):
        shard.unlink()
    dataset = Counting(root, decode="raw", on_error="skip")
    with pytest.raises(CorruptDataError, match=f"{root}: no readable sample left"):
        dataset[5]
    assert dataset.reads == len(dataset.shards.manifest.shards)  # one try per lost shard
    with pytest.raises(CorruptDataError, match="no readable sample left"):
        for _ in stoker.Loader(Counting(root, on_error="skip"), 32, crop=CROP, threads=2):
            pass
