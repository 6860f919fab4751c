"""Loader(processes=N) makes its batches in a ring of shared buffers made once (process_batches.py):
the same batches as threads, a batch the loop keeps never overwritten, errors and resume as with
threads, and no more shared memory after many epochs than the ring's slots."""

from __future__ import annotations

import gc
import multiprocessing as mp
from pathlib import Path

import pytest
import torch

import stoker
from stoker.decode.crops import CropSpec
from stoker.errors import CorruptDataError

SPEC = CropSpec("random_resized", (48, 48))
BATCH = 19  # 96 photos: 5 batches of 19, then a last one of 1 (fewer samples than workers)


def _loader(path: Path, **options) -> stoker.Loader:
    on_error = options.pop("on_error", "raise")
    return stoker.Loader(stoker.ShardDataset(path, on_error=on_error), options.pop("batch_size", BATCH),
                         crop=options.pop("crop", SPEC), seed=7, **options)


def _copies(loader: stoker.Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """An epoch of ``loader``, each batch copied and let go of (so the ring's buffers come back)."""
    return [(images.clone(), labels.clone()) for images, labels in loader]


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (images, labels), (other_images, other_labels) in zip(a, b, strict=True):
        assert torch.equal(labels, other_labels)
        assert images.dtype == other_images.dtype and torch.equal(images, other_images)


def _ring_maps() -> set[str]:
    """The inodes of the shared memory torch made that this process has mapped (torch's names:
    /torch_<pid>_...): every batch in fresh shared memory would be one more."""
    with open("/proc/self/maps") as maps:
        return {line.split()[4] for line in maps if "/torch_" in line}


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("processes", [1, 2])
def test_processes_make_the_thread_batches_whether_the_loop_keeps_them_or_not(packed, context, processes):
    threads = _copies(_loader(packed, threads=2))
    assert len(threads[-1][1]) == 1  # the last batch is short
    loader = _loader(packed, processes=processes, mp_context=context)
    _assert_same(_copies(loader), threads)  # each let go of: made in the ring's buffers, over and over
    loader.set_epoch(0)
    kept = list(loader)  # each kept: none may be overwritten while held (more batches than slots)
    assert len(kept) > loader.prefetch + 2
    _assert_same(kept, threads)


def test_each_slot_of_the_ring_is_mapped_once_however_many_epochs(packed):
    before = _ring_maps()
    loader = _loader(packed, processes=2, batch_size=8)  # 12 batches an epoch
    seen: set[str] = set()
    workers = []
    for _ in range(4):
        for _ in loader:
            seen |= _ring_maps() - before
        workers.append(len(mp.active_children()))
    assert len(seen) == loader.prefetch + 2  # fresh shared memory per batch: 48
    assert workers == [2, 2, 2, 2]  # the workers wait for the next pass
    del loader, _
    gc.collect()
    assert not _ring_maps() - before  # all of it let go of with the loader
    assert not mp.active_children()


def test_leaving_a_pass_early_stops_the_workers_and_the_next_pass_reads_the_epoch_again(packed):
    threads = _copies(_loader(packed, threads=2))
    loader = _loader(packed, processes=2)
    for number, _ in enumerate(loader):
        if number == 1:
            break
    assert not mp.active_children()
    _assert_same(_copies(loader), threads)  # a DataLoader's contract: a new pass is the whole epoch


def test_two_passes_at_once_get_the_batches_they_get_with_threads(packed):
    def two_at_once(**options) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader = _loader(packed, **options)
        return [(images.clone(), labels.clone()) for pair in zip(loader, loader) for images, labels in pair]

    _assert_same(two_at_once(processes=2), two_at_once(threads=2))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_state_saved_mid_epoch_resumes_in_processes(packed, context):
    threads = _copies(_loader(packed, threads=2))
    loader = _loader(packed, processes=2, mp_context=context)
    for number, _ in enumerate(loader):
        if number == 2:
            break
    resumed = _loader(packed, processes=2, mp_context=context)
    resumed.load_state_dict(loader.state_dict())
    _assert_same(_copies(resumed), threads[3:])
    assert resumed.epoch == 1  # and the next epoch from its start (new workers: its batches start at 0)
    _assert_same(_copies(resumed), _copies(_epoch(packed, 1, threads=2)))


def _epoch(path: Path, epoch: int, **options) -> stoker.Loader:
    loader = _loader(path, **options)
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_s_damaged_sample_raises_as_itself_and_stops_the_workers(damaged, context):
    path, key = damaged
    with pytest.raises(CorruptDataError, match="checksum mismatch") as caught:
        _copies(_loader(path, processes=2, mp_context=context))
    assert caught.value.key == key
    del caught
    gc.collect()
    assert not mp.active_children()


def test_workers_skip_damaged_samples_and_count_them(damaged):
    path, _ = damaged
    threads, processes = _loader(path, threads=2, on_error="skip"), _loader(path, processes=2, on_error="skip")
    _assert_same(_copies(processes), _copies(threads))
    assert processes.skipped == threads.skipped == 1


def _scale(image: torch.Tensor) -> torch.Tensor:
    """A user's per-sample transform (module level: spawned workers unpickle it)."""
    return image.float() / 255


def test_a_per_sample_transform_in_processes_makes_the_thread_batches(packed):
    threads = _copies(_loader(packed, threads=1, transform=_scale))
    processes = _loader(packed, processes=2, transform=_scale, mp_context="spawn")
    _assert_same(_copies(processes), threads)
    _assert_same(_copies(processes), _copies(_epoch(packed, 1, threads=1, transform=_scale)))


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.torchvision
@pytest.mark.parametrize("name", ["float32, augmented in the workers", "whole images"])
def test_torchvision_pipelines_in_processes_make_the_thread_batches(packed, name):
    T = pytest.importorskip("torchvision.transforms", reason="needs torchvision (runs in .venv-tv)")
    pipeline = {"float32, augmented in the workers": T.Compose([
                    T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                    T.Normalize(MEAN, STD)]),
                "whole images": T.Compose([T.Grayscale(3), T.Resize((32, 40)), T.PILToTensor()])}[name]
    threads = [(images.clone(), labels.clone()) for images, labels in
               stoker.Loader(stoker.ShardDataset(packed), BATCH, transform=pipeline, seed=7, threads=2)]
    assert threads[0][0].dtype == (torch.float32 if name.startswith("float32") else torch.uint8)
    loader = stoker.Loader(stoker.ShardDataset(packed), BATCH, transform=pipeline, seed=7, processes=2)
    _assert_same(_copies(loader), threads)
    loader.set_epoch(0)
    _assert_same(list(loader), threads)
