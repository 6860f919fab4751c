"""The Loader's choice of worker processes and threads without its tuner (tune=False): the rule on
given figures, and a real Loader that measures its first batches, then switches (or not) from its
next pass on."""

from __future__ import annotations

import pytest
import torch

import stoker
from stoker.decode.crops import CropSpec
from stoker.loader import plan as plan_module
from stoker.loader.workers import choose_workers

SPEC = CropSpec("random_resized", (48, 48))


@pytest.mark.parametrize("cores, threads, used, waited, processes, per_process, why", [
    (16, 17, 2.6, 0.02, 0, 17, "keeps up"),  # the loop hardly waits: nothing to gain
    (2, 3, 1.0, 0.9, 0, 3, "fewer than 4 cores"),
    (16, 17, 14.5, 0.8, 0, 17, "use the cores"),
    (16, 17, 2.6, 0.5, 7, 4, "the GIL limits one process"),  # ceil(16 / 2.6) processes, ceil(16 / 7) + 1 threads
    (96, 97, 3.9, 0.6, 25, 5, "the GIL limits one process"),
    (8, 9, 0.4, 0.7, 8, 2, "the GIL limits one process"),  # under one core: a process per core
])
def test_the_rule(cores, threads, used, waited, processes, per_process, why):
    choice = choose_workers(cores, threads, used, waited)
    assert (choice.processes, choice.threads) == (processes, per_process)
    assert why in choice.reason and f"{used:.1f} of {cores} cores" in choice.reason


def test_data_fetched_per_process_keeps_the_threads():
    """From an object store without a node cache each worker process would fetch the blocks its
    share of every batch lies in: the GIL-bound figures keep the threads there."""
    choice = choose_workers(16, 17, 2.6, 0.5, fetches_per_process=True)
    assert (choice.processes, choice.threads) == (0, 17)
    assert "object store without a node cache" in choice.reason and "cache_dir=" in choice.reason


def _pass(loader: stoker.Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_on_few_cores_the_loader_keeps_its_threads(packed, monkeypatch):
    monkeypatch.setattr(plan_module, "available_cores", lambda: 2)
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=SPEC, tune=False)
    assert "threads until the first batches are measured" in loader.explain()
    _pass(loader)
    _pass(loader)
    assert loader.processes == 0 and loader.threads == 3  # the rule's first two cases: either keeps the threads
    assert "fewer than 4 cores" in loader.explain() or "keeps up" in loader.explain()


def test_the_choice_made_from_the_first_batches_runs_the_next_pass_with_the_same_batches(packed, monkeypatch):
    """The Loader measures its first pass's batches, asks the rule (here one that always picks 2
    worker processes of 2 threads: what the figures are depends on the machine) and runs its next
    pass so, making the batches threads make."""
    asked = []

    def rule(cores, threads, cores_used, waited, fetches_per_process):
        assert not fetches_per_process  # a data set on disk
        asked.append((cores, threads, cores_used, waited))
        return choose_workers(4, threads, 1.0, 0.5)  # the GIL-bound case: 4 processes of 2 threads

    monkeypatch.setattr(plan_module, "choose_workers", rule)
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=SPEC, seed=4, tune=False)
    first = _pass(loader)
    second = _pass(loader)
    [(cores, threads, cores_used, waited)] = asked
    assert threads == plan_module.available_cores() + 1 and cores_used >= 0 and 0 <= waited <= 1
    assert loader.processes == 4 and loader.threads == 2 and "4 worker processes" in loader.explain()
    reference = stoker.Loader(stoker.ShardDataset(packed), 8, crop=SPEC, seed=4, processes=0, threads=2)
    for made, expected in zip((first, second), (_pass(reference), _pass(reference)), strict=True):
        assert len(made) == len(expected)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(made, expected))


def test_counts_given_are_kept(packed):
    loader = stoker.Loader(stoker.ShardDataset(packed), 8, crop=SPEC, threads=2)
    _pass(loader)
    _pass(loader)
    assert (loader.processes, loader.threads) == (0, 2) and "as given" in loader.explain()
