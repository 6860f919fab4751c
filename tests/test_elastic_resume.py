"""Elastic resume (issue 32): an epoch killed at random points and resumed each time on a
random world size (1-4), with the same global batch or the same per-rank batch, delivers every
sample of the epoch exactly once, and the global order it delivers is the pure plan
(``epoch_sequence``), whatever the restarts. Rank 0's state alone resumes every rank. Over a
stoker.Mix the same holds with the mixture's plan: the sequence is the pure function of the
chunks it was read in (``MixOrder.sequence`` from 0 over all of them), so each source's count in
the epoch is the plan's, and every rank's batch is stratified.

The many random cases run the plan as the readers run it (``plan_epoch`` per rank, the state as a
``Position`` record through ``to_dict`` / ``from_dict`` / ``check_fits``); a handful run real
stoker.Loaders (threads, worker processes) and QuasiRandomSamplers under a DataLoader, every rank
of a world simulated in this process, and identify each delivered sample by its own pixels or index.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.data.epoch import BlockOrder, epoch_sequence, plan_epoch, rank_batches
from stoker.data.mix_plan import MixOrder, MixSpec, exact_weights
from stoker.data.order import block_bounds
from stoker.data.readahead import block_bounds_of
from stoker.state import Position, StateError, resume_mode
from tests.conftest import PIXELS_CROP

ORDERS = ("quasi_random", "random", "sequential")


def random_layout(rng: np.random.Generator, most: int = 40) -> np.ndarray:
    """Block bounds of a random data set: a few shards of random sizes (under ``most`` samples
    each), blocks of random bytes."""
    shards = rng.integers(1, 6)
    counts = rng.integers(1, most, size=shards)
    starts = np.concatenate([np.cumsum(rng.integers(1_000, 60_000, size=count)) - 1_000 for count in counts])
    shard_of = np.repeat(np.arange(shards), counts)
    return block_bounds(shard_of, starts, int(rng.integers(20_000, 200_000)))


def next_world(rng: np.random.Generator, world: int, batch: int) -> tuple[int, int]:
    """A world size among 1-4 and a per-rank batch that resumes a state of ``world`` x ``batch``:
    the same global batch where the new world divides it (else the same per-rank batch)."""
    new_world = int(rng.integers(1, 5))
    if rng.random() < 0.5 and world * batch % new_world == 0:
        return new_world, world * batch // new_world
    return new_world, batch


def position(order: BlockOrder | MixOrder, seed: int, epoch: int, world: int, batch: int, drop_last: bool,
             samples_done: int, consumed: tuple[int, ...] | None = None) -> Position:
    window, blocks = order.settings()
    mix = f"weights {order.spec.weights}" if isinstance(order, MixOrder) else None
    return Position("Loader", "digest", seed, epoch, world, 0, batch, order.order, window, blocks, drop_last, samples_done,
                    mix, consumed)


def run_epoch_with_restarts(order: BlockOrder | MixOrder, seed: int, epoch: int, rng: np.random.Generator,
                            drop_last: bool) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Consume one epoch through the plan, each rank its batches, killed after a random number of
    steps and resumed from rank 0's state on a random world. Returns the global batches in order
    (each the ranks' batches of one step, ranks in order), the ranks' batches in that order (the
    chunks) and the number of restarts."""
    world, batch = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    done, consumed, delivered, chunks, restarts = 0, None, [], [], 0
    while True:
        plans = [plan_epoch(order, seed=seed, epoch=epoch, start=done, world_size=world, rank=r, batch_size=batch,
                            drop_last=drop_last, consumed=consumed) for r in range(world)]
        steps = max(len(plan.batches) for plan in plans)
        assert len(plans[0].batches) == steps  # rank 0 has the most batches
        assert steps - min(len(plan.batches) for plan in plans) <= (0 if drop_last else 1)
        kill = int(rng.integers(0, steps)) if steps and rng.random() < 0.85 else steps  # mid-epoch, or the end
        for step in range(kill):
            parts = [plan.share[step * batch : (step + 1) * batch] for plan in plans if step < len(plan.batches)]
            sizes = [len(part) for part in parts]
            assert max(sizes) - min(sizes) <= 1 and all(sizes)
            delivered.append(np.concatenate(parts))
            chunks += parts
        saved = position(order, seed, epoch, world, batch, drop_last, plans[0].batches.samples_done(kill),
                         plans[0].consumed(kill))
        if isinstance(order, MixOrder):  # the state counts each source's samples delivered
            so_far = np.concatenate(delivered) if delivered else np.zeros(0, np.int64)
            assert saved.consumed == tuple(np.bincount(order.source_of(so_far), minlength=len(order.spec.sizes)))
        if kill == steps:
            return delivered, chunks, restarts
        # every rank's own count gives rank 0's position while all of them are mid-epoch
        assert all(plan.batches.samples_done(kill) == saved.samples_done for plan in plans)
        new_world, new_batch = next_world(rng, world, batch)
        loaded = Position.from_dict(saved.to_dict(), "Loader")
        mode = loaded.check_fits(replace(saved, world_size=new_world, batch_size=new_batch, samples_done=0))
        assert mode in ("same global batch", "same per-rank batch")
        done, consumed, world, batch, restarts = loaded.samples_done, loaded.consumed, new_world, new_batch, restarts + 1


@pytest.mark.parametrize("chunk", range(8))
def test_random_kills_and_world_sizes_deliver_the_pure_plan_exactly_once(chunk):
    """240 random cases (8 x 30): layouts, orders, windows, seeds, epochs, kill points, worlds, modes."""
    restarts = 0
    for case in range(30):
        rng = np.random.default_rng([32, chunk, case])
        bounds = random_layout(rng)
        order = BlockOrder(bounds, ORDERS[case % 3], int(rng.integers(1, 20)))
        seed, epoch, drop_last = int(rng.integers(0, 2**63)), int(rng.integers(0, 100)), bool(rng.random() < 0.3)
        delivered, _, restarted = run_epoch_with_restarts(order, seed, epoch, rng, drop_last)
        restarts += restarted
        together = np.concatenate(delivered) if delivered else np.zeros(0, np.int64)
        expected = epoch_sequence(bounds, order.order, order.window, seed, epoch)
        if drop_last:  # a prefix; what is left is less than the last world's global batch
            assert np.array_equal(together, expected[: len(together)])
            assert len(expected) - len(together) < 4 * 8
        else:
            assert np.array_equal(together, expected)
            assert np.array_equal(np.sort(together), np.arange(int(bounds[-1])))
    assert restarts > 3 * 30  # the cases do restart, several times each


def random_mix(rng: np.random.Generator, case: int) -> MixOrder:
    """The order of a random mixture: 1-4 sources of random layouts and weights, a random epoch
    size (under or over the sources' total), either ``exhausted``, any order and window."""
    bounds = tuple(random_layout(rng, most=16) for _ in range(int(rng.integers(1, 5))))
    sizes = tuple(int(b[-1]) for b in bounds)
    given = [float(w) for w in rng.uniform(0.05, 1, len(sizes))] if rng.random() < 0.5 else \
        [int(w) for w in rng.integers(1, 6, len(sizes))]
    spec = MixSpec(sizes, exact_weights(given), int(rng.integers(1, 2 * sum(sizes))),
                   "end" if rng.random() < 0.3 else "repeat")
    window = int(rng.integers(1, 8))
    return MixOrder(spec, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), bounds,
                    tuple(min(window, len(b) - 1) for b in bounds), ORDERS[case % 3], window,
                    tuple(f"s{i}" for i in range(len(sizes))))


@pytest.mark.parametrize("chunk", range(4))
def test_random_kills_and_world_sizes_over_a_mix_deliver_its_pure_plan(chunk):
    """120 random cases (4 x 30) over a Mix: the delivered sequence is the plan of the chunks it was
    read in, each source's count in the epoch the plan's, each rank's batch stratified."""
    restarts = 0
    for case in range(30):
        rng = np.random.default_rng([32, 3, chunk, case])
        order = random_mix(rng, case)
        seed, epoch, drop_last = int(rng.integers(0, 2**63)), int(rng.integers(0, 100)), bool(rng.random() < 0.3)
        delivered, chunks, restarted = run_epoch_with_restarts(order, seed, epoch, rng, drop_last)
        restarts += restarted
        together = np.concatenate(delivered) if delivered else np.zeros(0, np.int64)
        sizes = np.array([len(part) for part in chunks], np.int64)
        assert np.array_equal(together, order.sequence(seed, epoch, 0, sizes, None))  # the pure plan
        check_mix_epoch(order, chunks, together, 4 * 8 if drop_last else 0)
    assert restarts > 3 * 30


def check_mix_epoch(order: MixOrder, chunks: list[np.ndarray], together: np.ndarray, short_by: int) -> None:
    """A mix's epoch delivered in ``chunks`` (``together``): each source's count the plan's, every
    rank's batch stratified, the epoch whole (or, with drop_last, short by less than ``short_by``)
    and, where a source that runs out ends it, no sample twice."""
    sizes = np.array([len(part) for part in chunks], np.int64)
    planned = order.counts(0, sizes, None)
    sources = len(order.spec.sizes)
    assert np.bincount(order.source_of(together), minlength=sources).tolist() == planned.sum(axis=0).tolist()
    shares = order.spec.fractions()
    for part in chunks:  # every rank's batch, the short last ones included
        counts = np.bincount(order.source_of(part), minlength=sources)
        assert all(abs(int(n) - share * len(part)) < 1 for n, share in zip(counts, shares))
    if short_by:
        assert len(order) - len(together) < short_by
    else:
        assert len(together) == len(order)
    if order.spec.exhausted == "end":  # no sample twice in the epoch
        assert len(np.unique(together)) == len(together)


def test_the_epoch_order_does_not_depend_on_the_world_size():
    bounds = random_layout(np.random.default_rng(3))
    order = BlockOrder(bounds, "quasi_random", 4)
    whole = epoch_sequence(bounds, "quasi_random", 4, 5, 2)
    for world, batch in ((1, 1), (2, 3), (3, 8), (4, 2)):
        plans = [plan_epoch(order, seed=5, epoch=2, start=0, world_size=world, rank=r, batch_size=batch,
                            drop_last=False) for r in range(world)]
        steps = [[p.share[i * batch : (i + 1) * batch] for i in range(len(p.batches))] for p in plans]
        dealt = np.concatenate([part for i in range(len(steps[0])) for s in steps if i < len(s) for part in [s[i]]])
        assert np.array_equal(dealt, whole)
    assert np.array_equal(order.sequence(5, 2, 40, np.array([8, 8, 5]), None), whole[40:61])


# ---- refusals ----

def test_a_batch_size_that_keeps_neither_batch_is_refused_saying_what_works():
    with pytest.raises(StateError, match=r"saved on 4 ranks with batch_size=6 \(global batch 24\) and the reader has "
                                         r"3 ranks with batch_size=5 .*same global batch \(batch_size=8 on 3 ranks\) "
                                         r"or the same per-rank batch \(batch_size=6\)"):
        resume_mode(4, 6, 3, 5, "the reader")
    with pytest.raises(StateError, match=r"global batch 9\).*not on 2 ranks: 9 does not divide by 2 \(it does on "
                                         r"1, 3, 9 ranks\)\) or the same per-rank batch \(batch_size=3\)"):
        resume_mode(3, 3, 2, 4)
    assert resume_mode(4, 6, 3, 8) == "same global batch" and resume_mode(4, 6, 3, 6) == "same per-rank batch"
    assert "\n" not in str(pytest.raises(StateError, resume_mode, 4, 6, 3, 5).value)


def test_a_version_2_state_resumes_on_one_rank_and_is_refused_from_several(packed):
    dataset = stoker.ShardDataset(packed)
    crop = stoker.CropSpec("resize", size=(8, 8), flip=False)
    saved = stoker.Loader(dataset, 8, crop=crop, seed=0).state_dict()
    version_2 = {**{k: v for k, v in saved.items() if k not in ("mix", "consumed")}, "stoker_state": 2,
                 "samples_done": 24}
    loader = stoker.Loader(dataset, 4, crop=crop, rank=1, world_size=2, seed=0)  # the same global batch
    loader.load_state_dict(version_2)
    assert loader.state_dict()["samples_done"] == 24 and len(loader) == len(dataset) // 8  # a whole epoch
    with pytest.raises(StateError, match=r"version 2 record saved on 2 ranks.*set_epoch\(0\)"):
        loader.load_state_dict({**version_2, "world_size": 2})
    sampler_2 = {**version_2, "part": "QuasiRandomSampler", "batch_size": None, "order": "quasi_random"}
    sampler = stoker.QuasiRandomSampler(dataset, num_replicas=3, seed=0, rank=0)
    sampler.load_state_dict(sampler_2)
    assert sampler.state_dict(0)["samples_done"] == 24


# ---- real readers, every rank of a world in this process ----

CROP = PIXELS_CROP  # no random draw: a sample's pixels identify it (the fingerprints fixture)


def steps_left(epoch: int, state: dict | None, world: int, batch: int, drop_last: bool) -> int:
    """Rank 0's batches in the rest of an epoch of ``epoch`` samples after ``state`` (a Loader's
    len() is a whole epoch's, as a DataLoader's)."""
    done = 0 if state is None else state["samples_done"]
    return len(rank_batches(epoch, start=done, world_size=world, rank=0, batch_size=batch, drop_last=drop_last))


def take(loader, kill: int, steps: int) -> list:
    """The first ``kill`` batches of a pass; all of them (the loop runs to the pass's end) when
    ``kill`` is rank 0's ``steps``."""
    if kill == steps:
        return list(loader)
    return [batch for _, batch in zip(range(kill), loader)]


def loader_run(packed, fingerprints, rng, processes: int, drop_last: bool) -> tuple[list[int], int, int]:
    """One epoch of real Loaders killed (the loop left) at random steps, resumed from rank 0's
    state on a random world each time. Returns the samples delivered, in global order, and the seed."""
    dataset = stoker.ShardDataset(packed, block_bytes=64 << 10)
    world, batch, seed = int(rng.integers(1, 5)), int(rng.integers(2, 7)), int(rng.integers(0, 1000))
    state, delivered, worlds = None, [], []
    while True:
        loaders = [stoker.Loader(dataset, batch, crop=CROP, seed=seed, window=3, rank=r, world_size=world,
                                 threads=2, processes=processes, mp_context="fork" if processes else None,
                                 drop_last=drop_last) for r in range(world)]
        for loader in loaders:
            if state is not None:
                loader.load_state_dict(state)
        steps = steps_left(len(dataset), state, world, batch, drop_last)
        kill = int(rng.integers(0, steps)) if steps and (len(worlds) < 3 or rng.random() < 0.5) else steps
        worlds.append(world)
        made = [[images.numpy() for images, _ in take(loader, kill, steps)] for loader in loaders]
        for step in range(kill):
            for made_by_rank in made:
                if step < len(made_by_rank):
                    delivered += [fingerprints[image.tobytes()] for image in made_by_rank[step]]
        state = loaders[0].state_dict()
        if kill == steps:
            assert state["epoch"] == 1 and state["samples_done"] == 0
            assert len(worlds) >= 3  # killed and resumed twice at least
            return delivered, seed, batch * world
        world, batch = next_world(rng, world, batch)


@pytest.mark.parametrize(("case", "processes", "drop_last"), [(0, 0, False), (1, 0, False), (2, 0, True), (3, 0, False),
                                                              (4, 1, False), (5, 2, False)])
def test_real_loaders_resumed_on_other_world_sizes_deliver_the_plan(packed, fingerprints, case, processes, drop_last):
    rng = np.random.default_rng([32, 1, case])
    delivered, seed, last_global = loader_run(packed, fingerprints, rng, processes, drop_last)
    dataset = stoker.ShardDataset(packed, block_bytes=64 << 10)
    loader = stoker.Loader(dataset, 1, crop=CROP, seed=seed, window=3)
    expected = epoch_sequence(block_bounds_of(dataset.shards), "quasi_random", loader.window, seed, 0)
    assert delivered == expected[: len(delivered)].tolist()
    if drop_last:
        assert len(expected) - len(delivered) < last_global
    else:
        assert sorted(delivered) == list(range(len(dataset)))


@pytest.mark.parametrize(("case", "workers"), [(0, 0), (1, 0), (2, 2)])
def test_real_samplers_under_dataloaders_resumed_on_other_world_sizes(packed, case, workers):
    dataset = stoker.ShardDataset(packed, decode="raw", block_bytes=64 << 10)
    rng = np.random.default_rng([32, 2, case])
    world, batch, chunk = int(rng.integers(1, 5)), int(rng.integers(2, 7)), int(rng.integers(0, 2))
    state, delivered, worlds = None, [], []
    while True:
        samplers = [stoker.QuasiRandomSampler(dataset, seed=9, window=3, num_replicas=world, rank=r,
                                              batch_size=batch if chunk else 1) for r in range(world)]
        for sampler in samplers:
            if state is not None:
                sampler.load_state_dict(state)
        loaders = [torch.utils.data.DataLoader(range(len(dataset)), batch_size=batch, sampler=sampler,
                                               num_workers=workers) for sampler in samplers]
        steps = len(loaders[0])
        kill = int(rng.integers(0, steps)) if steps and (len(worlds) < 3 or rng.random() < 0.5) else steps
        worlds.append(world)
        made = [[b.tolist() for b in take(loader, kill, steps)] for loader in loaders]
        for step in range(kill):  # one global step: the ranks' batches (sample by sample, they interleave)
            delivered.append(sorted(sum((by_rank[step] for by_rank in made if step < len(by_rank)), [])))
        state = samplers[0].state_dict(samples_done=kill * batch)
        if kill == steps:
            assert len(worlds) >= 3
            break
        world, batch = next_world(rng, world, batch)
    expected, done = epoch_sequence(samplers[0].bounds, "quasi_random", 3, 9, 0), 0
    for step in delivered:  # each global step is the next slice of the plan
        assert step == sorted(expected[done : done + len(step)].tolist())
        done += len(step)
    assert done == len(dataset)


# ---- real readers over a Mix, every rank of a world in this process ----

def mix_of(packed, epoch_size: int) -> stoker.Mix:
    """The packed set twice, weighted 2:1 (labels say the source, pixels the sample in it)."""
    sources = {name: stoker.ShardDataset(packed, block_bytes=64 << 10) for name in ("a", "b")}
    return stoker.Mix(sources, {"a": 2, "b": 1}, epoch_size=epoch_size)


@pytest.mark.parametrize(("case", "processes"), [(0, 0), (1, 0), (2, 1)])
def test_real_loaders_over_a_mix_resumed_on_other_world_sizes_deliver_its_plan(packed, fingerprints, case, processes):
    rng = np.random.default_rng([32, 4, case])
    mix = mix_of(packed, int(rng.integers(len(mix_of(packed, 1)) // 2, 2 * len(mix_of(packed, 1)))))
    world, batch, seed = int(rng.integers(1, 5)), int(rng.integers(2, 7)), int(rng.integers(0, 1000))
    state, delivered, chunks, worlds = None, [], [], []
    while True:
        loaders = [stoker.Loader(mix, batch, crop=CROP, seed=seed, window=3, rank=r, world_size=world, threads=2,
                                 processes=processes, mp_context="fork" if processes else None) for r in range(world)]
        for loader in loaders:
            if state is not None:
                loader.load_state_dict(state)
        steps = steps_left(mix.epoch_size, state, world, batch, False)
        kill = int(rng.integers(0, steps)) if steps and (len(worlds) < 3 or rng.random() < 0.5) else steps
        worlds.append(world)
        made = [take(loader, kill, steps) for loader in loaders]
        for step in range(kill):
            for made_by_rank in made:
                if step < len(made_by_rank):
                    images, labels = made_by_rank[step]
                    source = mix.label_source(labels)
                    delivered += [int(mix.offsets[s]) + fingerprints[image.numpy().tobytes()]
                                  for s, image in zip(source, images)]
                    chunks.append(len(labels))
        state = loaders[0].state_dict()
        if kill == steps:
            assert state["epoch"] == 1 and state["samples_done"] == 0 and len(worlds) >= 3
            break
        assert state["consumed"] == np.bincount(mix.source_of(delivered), minlength=2).tolist()
        world, batch = next_world(rng, world, batch)
    order = loaders[0]._epoch_order
    assert delivered == order.sequence(seed, 0, 0, np.array(chunks), None).tolist()  # the pure plan of its batches
    assert len(delivered) == mix.epoch_size


def test_a_sampler_over_a_mix_resumed_on_another_world_size(packed):
    mix = mix_of(packed, 50)
    first = [stoker.QuasiRandomSampler(mix, batch_size=4, seed=2, num_replicas=3, rank=r) for r in range(3)]
    made = [list(torch.utils.data.DataLoader(range(len(mix)), batch_size=4, sampler=s)) for s in first]
    state = first[0].state_dict(samples_done=2 * 4)  # two steps of 3 ranks x 4
    then = [stoker.QuasiRandomSampler(mix, batch_size=6, seed=2, num_replicas=2, rank=r) for r in range(2)]
    for sampler in then:
        sampler.load_state_dict(state)  # the same global batch, 2 x 6
    rest = [list(torch.utils.data.DataLoader(range(len(mix)), batch_size=6, sampler=s)) for s in then]
    delivered = [b.tolist() for step in range(2) for b in (made[r][step] for r in range(3))]
    delivered += [b.tolist() for step in range(len(rest[0])) for b in (r[step] for r in rest if step < len(r))]
    chunks = np.array([len(b) for b in delivered])
    assert sum(delivered, []) == first[0]._order.sequence(2, 0, 0, chunks, None).tolist()
    assert state["consumed"] == np.bincount(mix.source_of(sum(delivered[:6], [])), minlength=2).tolist()


def test_a_rank_with_nothing_left_of_the_epoch_stays_in_it(packed):
    """Fewer samples left than ranks: the last rank's pass is empty (the others take the last
    samples), not the next epoch's, and every rank then goes on to the next epoch together."""
    dataset = stoker.ShardDataset(packed)
    first = stoker.Loader(dataset, 1, crop=CROP, seed=4, threads=1)
    for _ in zip(range(len(dataset) - 3), first):
        pass
    state = first.state_dict()
    ranks = [stoker.Loader(dataset, 1, crop=CROP, seed=4, threads=1, rank=r, world_size=4) for r in range(4)]
    for loader in ranks:
        loader.load_state_dict(state)
    assert [sum(len(labels) for _, labels in loader) for loader in ranks] == [1, 1, 1, 0]
    assert [loader.state_dict()["epoch"] for loader in ranks] == [1, 1, 1, 1]
