"""stoker.Mix: stratified batches, per-source counts, repeat or end, labels, Loader / sampler reads, resume."""

from __future__ import annotations

import shutil
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
from stoker.data.deal import stream
from stoker.data.epoch import rank_batches
from stoker.data.mix_plan import MixSpec, allocate, exact_weights, interleave
from stoker.decode.crops import CropSpec
from stoker.state import StateError, StateWarning

from .conftest import SMALL_SHARD

CENTER = CropSpec(size=(32, 32), kind="center", flip=False)


def _random_weights(rng: np.random.Generator, sources: int) -> list[float]:
    return [float(w) for w in rng.uniform(0.01, 1.0, sources)]


def _chunks(length: int, world_size: int, batch_size: int, drop_last: bool = False) -> np.ndarray:
    """The chunks (ranks' batches, in the order dealt) of a whole epoch of ``length`` samples."""
    return rank_batches(length, start=0, world_size=world_size, rank=0, batch_size=batch_size,
                        drop_last=drop_last).chunks()


def _sequence(mix: stoker.Mix, seed: int, batch_size: int, window: int, world_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A whole epoch 0 of ``mix`` in quasi-random order, read in batches of ``batch_size`` on
    ``world_size`` ranks, and its per-chunk counts."""
    order = mix.epoch_order("quasi_random", window)
    chunks = _chunks(len(order), world_size, batch_size)
    return order.sequence(seed, 0, 0, chunks, None), order.counts(0, chunks, None)


@pytest.mark.parametrize("case", range(60))
def test_every_chunk_is_within_one_sample_of_its_weighted_share(case):
    rng = np.random.default_rng(case)
    sources = int(rng.integers(2, 5))
    weights = _random_weights(rng, sources)
    exact = exact_weights(weights)
    before, batch = (int(b) for b in rng.integers(1, 40, 2))  # a batch size change at a resume
    earlier = allocate(exact, [before] * int(rng.integers(0, 30)), (0,) * sources)
    chunks = np.concatenate([np.full(150, batch), rng.integers(1, batch + 1, 4)])  # and a short last global batch
    counts = allocate(exact, chunks, tuple(int(c) for c in earlier.sum(axis=0)))
    shares = [Fraction(w) / sum(map(Fraction, weights)) for w in weights]
    assert (counts.sum(axis=1) == chunks).all()
    for i, share in enumerate(shares):
        assert all(abs(int(c) - share * int(b)) < 1 for c, b in zip(counts[:, i], chunks)), (weights, batch, i)
    # and so far: after every chunk, each source within one sample of its share of all samples
    for done in np.cumsum(np.concatenate([earlier, counts]), axis=0):
        assert all(abs(int(done[i]) - share * int(done.sum())) < 1 for i, share in enumerate(shares))


def test_allocation_resumed_from_counts_continues_the_same_chunks():
    weights = exact_weights([0.5, 0.3, 0.2])
    whole = allocate(weights, [7] * 30, (0, 0, 0))
    first = allocate(weights, [7] * 11, (0, 0, 0))
    rest = allocate(weights, [7] * 19, tuple(int(c) for c in first.sum(axis=0)))
    assert np.array_equal(np.concatenate([first, rest]), whole)


def test_a_source_that_runs_out_goes_on_with_its_next_pass():
    passes = {p: np.random.default_rng(p).permutation(5) for p in range(4)}
    got = stream(passes.__getitem__, 5, 3, 9)
    assert np.array_equal(got, np.concatenate([passes[0][3:], passes[1], passes[2][:2]]))


def test_interleave_spreads_each_source_through_its_chunk():
    got = interleave(np.array([[3, 1], [2, 2]]), [np.arange(5), np.arange(100, 103)])
    assert got.tolist() == [0, 1, 100, 2, 3, 101, 4, 102]


def test_repeat_keeps_the_stated_epoch_and_end_stops_before_a_source_runs_out():
    weights = exact_weights([0.5, 0.5])
    assert MixSpec((100, 10), weights, 110, "repeat").length() == 110  # the small source repeats
    assert MixSpec((100, 10), weights, 110, "end").length() == 19  # 1/2 of 20 would reach the small source's 10
    assert MixSpec((100, 10), weights, 15, "end").length() == 15  # epoch_size, when it ends first
    assert MixSpec((7, 30), exact_weights([1, 2]), 100, "end").length() == 20  # 1/3 of 21 is 7
    rng = np.random.default_rng(0)
    for _ in range(200):  # whatever the batches, no source gives more than its one pass
        sizes = tuple(int(n) for n in rng.integers(1, 60, int(rng.integers(2, 5))))
        spec = MixSpec(sizes, exact_weights(_random_weights(rng, len(sizes))), 10_000, "end")
        chunks = np.concatenate([_chunks(int(rng.integers(0, spec.length() + 1)), 1, int(rng.integers(1, 9))),
                                 [0]])
        done = allocate(spec.weights, chunks, (0,) * len(sizes)).sum(axis=0)
        rest = allocate(spec.weights, _chunks(spec.length() - int(done.sum()), int(rng.integers(1, 5)),
                                              int(rng.integers(1, 9))), tuple(int(n) for n in done))
        assert ((done + rest.sum(axis=0)) <= np.array(sizes)).all()


# -- over real packed data sets ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def halves(photos, tmp_path_factory) -> dict[str, Path]:
    """The sample photos' classes split in two, each half packed as a data set of its own."""
    root = tmp_path_factory.mktemp("halves")
    classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
    packs = {}
    for name, part in (("web", classes[:2]), ("books", classes[2:])):
        for c in part:
            shutil.copytree(photos / c, root / f"{name}-src" / c)
        stoker.pack(root / f"{name}-src", root / name, shard_bytes=SMALL_SHARD, workers=1, progress=False)
        packs[name] = root / name
    return packs


def _mix(halves, weights=None, **options) -> stoker.Mix:
    sources = {name: stoker.ShardDataset(path, decode="raw") for name, path in halves.items()}
    return stoker.Mix(sources, weights or {"web": 0.7, "books": 0.3}, **options)


def test_weights_whose_sum_overflows_are_still_their_shares(halves):
    assert _mix(halves, {"web": 1e308, "books": 1e308}).weights == {"web": 0.5, "books": 0.5}
    assert _mix(halves, {"web": 1.5e308, "books": 5e307}).weights == {"web": 0.75, "books": 0.25}
    assert _mix(halves, {"web": 5e-324, "books": 5e-324}).weights == {"web": 0.5, "books": 0.5}


def test_labels_say_their_source(halves):
    mix = _mix(halves)
    web, books = mix.sources
    assert mix.classes == [f"web/{c}" for c in web.classes] + [f"books/{c}" for c in books.classes]
    for index in (0, len(web) - 1, len(web), len(mix) - 1):
        data, label = mix[index]
        source, local = mix.locate(index)
        assert data == mix.sources[source][local][0]
        assert mix.label_source(np.array([label]))[0] == source == mix.source_of(index)
        assert mix.source_label(torch.tensor([label]))[0] == mix.sources[source].targets[local]
    assert np.array_equal(mix.label_source(mix.targets), mix.source_of(np.arange(len(mix))))


def _stratified(mix: stoker.Mix, labels: torch.Tensor) -> None:
    counts = np.bincount(mix.label_source(labels), minlength=len(mix.sources))
    for i, name in enumerate(mix.names):
        assert abs(counts[i] - mix.weights[name] * len(labels)) < 1, (counts, len(labels))


def _reference(mix: stoker.Mix) -> dict[int, torch.Tensor]:
    """Each mix sample's center crop, made by a Loader over its own source."""
    images = {}
    for i, source in enumerate(mix.sources):
        plain = stoker.ShardDataset(source.root)
        (batch, _), = stoker.Loader(plain, len(plain), crop=CENTER, order="sequential", threads=1)
        for local in range(len(plain)):
            images[int(mix.offsets[i]) + local] = batch[local]
    return images


@pytest.mark.parametrize("processes", [0, 1])
def test_loader_batches_are_stratified_and_hold_the_planned_samples(halves, processes):
    mix = _mix(halves)
    loader = stoker.Loader(mix, 10, crop=CENTER, threads=2, processes=processes, seed=3)
    sequence, counts = _sequence(mix, 3, 10, loader.window)
    reference = _reference(mix)
    batches = list(loader)
    assert len(batches) == len(loader) == len(counts)
    for number, (images, labels) in enumerate(batches):
        indices = sequence[number * 10 : (number + 1) * 10]
        assert labels.tolist() == mix.targets[indices].tolist()
        assert all(torch.equal(images[j], reference[int(i)]) for j, i in enumerate(indices))
        _stratified(mix, labels)
    per_source = np.bincount(mix.label_source(torch.cat([labels for _, labels in batches])))
    assert per_source.tolist() == list(mix.epoch_counts(10).values()) == counts.sum(axis=0).tolist()


def test_each_source_keeps_its_own_block_order(halves):
    mix = _mix(halves)
    sequence, _ = _sequence(mix, 0, 10, 2)
    web = sequence[mix.source_of(sequence) == 0]
    first_pass = mix.epoch_order("quasi_random", 2).pass_order(0, 0, 0, 0)
    assert np.array_equal(web[: len(first_pass)], first_pass)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_sampler_and_dataloader_give_stratified_batches(halves, context):
    mix = _mix(halves, {"web": 1, "books": 3})
    sampler = stoker.QuasiRandomSampler(mix, batch_size=7, seed=5)
    loader = DataLoader(mix, batch_size=7, sampler=sampler, num_workers=2, multiprocessing_context=context)
    sequence, counts = _sequence(mix, 5, 7, 16)
    labels = [batch_labels for _, batch_labels in loader]
    assert torch.cat(labels).tolist() == mix.targets[sequence].tolist()
    for batch_labels in labels:
        _stratified(mix, batch_labels)
    assert len(labels) == len(counts)


def test_sampler_over_a_mix_needs_the_batch_size(halves):
    with pytest.raises(ValueError, match="batch_size"):
        stoker.QuasiRandomSampler(_mix(halves))


def test_exhausted_end_reads_each_source_at_most_once(halves):
    mix = _mix(halves, {"web": 0.5, "books": 0.5}, epoch_size=1000, exhausted="end")
    counts = mix.epoch_counts(6)
    assert all(counts[name] <= len(source) for name, source in zip(mix.names, mix.sources))
    sequence, _ = _sequence(mix, 0, 6, 16)
    assert len(np.unique(sequence)) == len(sequence) == sum(counts.values())
    assert len(sequence) == 2 * min(len(source) for source in mix.sources) - 1
    repeat = _mix(halves, {"web": 0.5, "books": 0.5}, epoch_size=1000)
    sequence, _ = _sequence(repeat, 0, 6, 16)
    assert len(sequence) == 1000 and np.bincount(repeat.source_of(sequence)).tolist() == [500, 500]


def test_resume_mid_epoch_continues_exactly(halves):
    mix = _mix(halves)
    whole = [labels for _, labels in stoker.Loader(mix, 10, crop=CENTER, threads=2, seed=1)]
    first = stoker.Loader(mix, 10, crop=CENTER, threads=2, seed=1)
    seen = []
    for _, labels in first:
        seen.append(labels)
        if len(seen) == 4:
            break
    state = first.state_dict()
    assert state["mix"] == mix.describe()
    resumed = stoker.Loader(_mix(halves), 10, crop=CENTER, threads=1, seed=1)
    resumed.load_state_dict(state)
    seen += [labels for _, labels in resumed]
    assert torch.equal(torch.cat(seen), torch.cat(whole))


def test_changed_weights_start_a_new_mix_and_say_so(halves):
    first = stoker.Loader(_mix(halves), 10, crop=CENTER, threads=1)
    next(iter(first))
    state = first.state_dict()
    changed = stoker.Loader(_mix(halves, {"web": 0.5, "books": 0.5}), 10, crop=CENTER, threads=1)
    with pytest.warns(StateWarning, match=r"saved for a mix of weights web=0\.7 books=0\.3.*a stoker\.Loader has "
                                          r"weights web=0\.5 books=0\.5.*a new mix starts at epoch 1 \(the rest of "
                                          r"epoch 0 is not read\)"):
        changed.load_state_dict(state)
    assert changed.epoch == 1 and changed.state_dict()["samples_done"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stoker.Loader(_mix(halves), 10, crop=CENTER, threads=1).load_state_dict(state)  # same weights: no warning


def test_loader_for_takes_a_mix(halves):
    loader = stoker.loader_for(_mix(halves), batch_size=10, crop=CENTER, threads=1)
    images, labels = next(iter(loader))
    assert images.shape == (10, 3, 32, 32)
    _stratified(loader.dataset, labels)


def test_decode_on_the_gpu_refuses_a_mix(halves):
    with pytest.raises(ValueError, match=r"decode='gpu' reads one ShardDataset: a stoker\.Mix is decoded on the CPU"):
        stoker.Loader(_mix(halves), 10, crop=CENTER, decode="gpu")


def test_a_state_whose_source_counts_do_not_add_up_is_refused(halves):
    loader = stoker.Loader(_mix(halves), 10, crop=CENTER, threads=1)
    next(iter(loader))
    state = loader.state_dict()
    assert sum(state["consumed"]) == state["samples_done"] == 10
    with pytest.raises(StateError, match=r"consumed=\[6, 5\] must count a mixture's samples_done=10"):
        loader.load_state_dict({**state, "consumed": [6, 5]})
    with pytest.raises(StateError, match=r"a mixture's state after samples_done=10 samples needs consumed"):
        loader.load_state_dict({**state, "consumed": None})
