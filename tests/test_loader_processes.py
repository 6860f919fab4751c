"""Loader(processes=P, threads=T): P DataLoader worker processes, each making whole batches with T
threads, give the batches, errors, skips and resume points of the thread-only Loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import stoker
from stoker.decode.crops import CropSpec
from stoker.errors import CorruptDataError

SPEC = CropSpec("random_resized", (64, 64))


def _batches(path: Path, stop: int | None = None, **options) -> list[tuple[torch.Tensor, torch.Tensor]]:
    on_error = options.pop("on_error", "raise")
    loader = stoker.Loader(stoker.ShardDataset(path, on_error=on_error), 16, crop=SPEC, seed=11, **options)
    out = []
    for images, labels in loader:
        out.append((images.clone(), labels.clone()))
        if len(out) == stop:
            break
    return out


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (images, labels), (other_images, other_labels) in zip(a, b):
        assert torch.equal(labels, other_labels)
        assert torch.equal(images, other_images)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_processes_with_threads_make_the_thread_loader_s_batches(packed, context):
    _assert_same(_batches(packed, processes=2, threads=2, mp_context=context), _batches(packed, threads=3))


def test_one_process_of_many_threads_and_many_of_one_agree(packed):
    _assert_same(_batches(packed, processes=1, threads=4), _batches(packed, processes=3, threads=1))


def test_a_damaged_sample_in_a_worker_raises_stoker_s_error_naming_it(damaged):
    path, key = damaged
    with pytest.raises(CorruptDataError, match="checksum mismatch") as caught:
        _batches(path, processes=2, threads=2)
    assert key in str(caught.value) and caught.value.key == key


def test_workers_skip_damaged_samples_as_threads_do(damaged):
    path, _ = damaged
    _assert_same(_batches(path, processes=2, threads=2, on_error="skip"), _batches(path, threads=2, on_error="skip"))


def test_a_state_saved_with_processes_resumes_with_threads(packed):
    whole = _batches(packed, threads=2)
    loader = stoker.Loader(stoker.ShardDataset(packed), 16, crop=SPEC, seed=11, processes=2, threads=2)
    for number, _ in enumerate(loader):
        if number == 2:
            break
    state = loader.state_dict()
    resumed = stoker.Loader(stoker.ShardDataset(packed), 16, crop=SPEC, seed=11, threads=3)
    resumed.load_state_dict(state)
    _assert_same([(i.clone(), label.clone()) for i, label in resumed], whole[3:])


def test_explain_says_processes_and_threads(packed):
    loader = stoker.Loader(stoker.ShardDataset(packed), 16, crop=SPEC, processes=3, threads=2, transform=lambda x: x)
    assert "3 worker processes of 2 threads each" in loader.explain()


@pytest.mark.parametrize("options, message", [(dict(threads=0), "threads=0: must be an integer from 1 to 4096"),
                                              (dict(processes=-1), "processes=-1: must be an integer from 0 to 1024")])
def test_bad_counts_are_refused(packed, options, message):
    with pytest.raises(ValueError, match=message):
        stoker.Loader(stoker.ShardDataset(packed), 16, **options)


def test_threads_of_a_forked_worker_reopen_the_parent_s_shards_once(packed):
    """The parent has readers open when it forks; every thread of a worker then asks for readers at
    once, and exactly one closes the parent's copies (two closing one descriptor: EBADF)."""
    dataset = stoker.ShardDataset(packed)
    expected = [(i.clone(), label.clone()) for i, label in stoker.Loader(dataset, 16, crop=SPEC, seed=11, threads=2)]
    assert dataset.shards._readers  # open in the parent
    for _ in range(3):
        made = [(i.clone(), label.clone()) for i, label in
                stoker.Loader(dataset, 16, crop=SPEC, seed=11, processes=2, threads=8, mp_context="fork")]
        _assert_same(made, expected)
