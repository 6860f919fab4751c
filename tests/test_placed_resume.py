"""Placement by partitions (issue 42), elastic and exact: an epoch killed at random points and resumed
each time on a random number of nodes and of ranks per node (with the same global batch or the same
per-rank batch), over one data set or a stoker.Mix, delivers every sample of the epoch exactly once,
each partition's samples in the order of its own sequence (``pass_order``: the pure plan of that
partition, whoever read them), each rank's batch from its own node's partitions until that node has
none left, and rank 0's state alone (a ``Position`` record through ``to_dict`` / ``from_dict``)
resumes every rank, its partitions placed on the new nodes as the readers place them.

The many random cases run the plan as the readers run it (``plan_epoch`` per rank); a few run real
stoker.Loaders and QuasiRandomSamplers, every rank of a world simulated in this process, and one a
real two-node torchrun (tests/ddp_nodes.py).
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data

import stoker
from stoker.data.deal import stream
from stoker.data.epoch import BlockOrder, plan_epoch
from stoker.data.mix_plan import MixOrder, MixSpec, exact_weights
from stoker.data.order import block_bounds
from stoker.data.placement import Placement, default_partitions
from stoker.state import Position
from tests.conftest import PIXELS_CROP
from tests.ddp_nodes import BATCH
from tests.test_elastic_resume import check_mix_epoch

ORDERS = ("quasi_random", "random", "sequential")


def random_shards(rng: np.random.Generator, most: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Block bounds and shard starts of a random data set: 1-12 shards of random sizes (under
    ``most`` samples each), blocks of random bytes."""
    shards = int(rng.integers(1, 13))
    counts = rng.integers(1, most, size=shards)
    offsets = np.concatenate([np.cumsum(rng.integers(1_000, 60_000, size=count)) - 1_000 for count in counts])
    bounds = block_bounds(np.repeat(np.arange(shards), counts), offsets, int(rng.integers(20_000, 200_000)))
    return bounds, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def random_mix(rng: np.random.Generator, case: int) -> MixOrder:
    """The order of a random mixture: 1-3 sources of random shards and weights, a random epoch size
    (under or over the sources' total), either ``exhausted``, any order and window."""
    layouts = [random_shards(rng, most=16) for _ in range(int(rng.integers(1, 4)))]
    sizes = tuple(int(starts[-1]) for _, starts in layouts)
    spec = MixSpec(sizes, exact_weights([int(w) for w in rng.integers(1, 6, len(sizes))]),
                   int(rng.integers(1, 2 * sum(sizes))), "end" if rng.random() < 0.3 else "repeat")
    window = int(rng.integers(1, 8))
    return MixOrder(spec, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), tuple(b for b, _ in layouts),
                    tuple(min(window, len(b) - 1) for b, _ in layouts), ORDERS[case % 3], window,
                    tuple(f"s{i}" for i in range(len(sizes))), tuple(s for _, s in layouts))


def next_world(rng: np.random.Generator, world: int, batch: int) -> tuple[int, int, int]:
    """Nodes (1-4), ranks per node (1-3) and a per-rank batch that resume a state of ``world`` x
    ``batch``: the same global batch where the new world divides it (else the same per-rank batch)."""
    nodes, local = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    if rng.random() < 0.5 and world * batch % (nodes * local) == 0:
        return nodes, local, world * batch // (nodes * local)
    return nodes, local, batch


def shards_of(order: BlockOrder | MixOrder) -> int:
    return max(len(order.blocks(i).shard_samples()) for i in range(order.sources))


def run_epoch(order: BlockOrder | MixOrder, seed: int, epoch: int, rng: np.random.Generator, drop_last: bool):
    """One epoch through the plan, each rank its batches, killed after a random number of steps and
    resumed from rank 0's state on random nodes and ranks per node, the partitions placed as the
    readers place them (the state's, kept where each node held them). Checks every step as it goes;
    returns what was delivered (the ranks' batches of each step, in rank order), the partitions, the
    restarts and the last world's global batch."""
    nodes, local, batch = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
    partitions = int(rng.integers(1, shards_of(order) + 1)) if rng.random() < 0.5 else \
        default_partitions(shards_of(order), nodes)
    placement = Placement.of(partitions, nodes)
    done, consumed, delivered, restarts = 0, None, [], 0
    while True:
        world = nodes * local
        plans = [plan_epoch(order, seed=seed, epoch=epoch, start=done, world_size=world, rank=r, batch_size=batch,
                            drop_last=drop_last, consumed=consumed, placement=placement) for r in range(world)]
        steps = len(plans[0].batches)
        assert steps - min(len(plan.batches) for plan in plans) <= (0 if drop_last else 1)
        kill = int(rng.integers(0, steps)) if steps and rng.random() < 0.85 else steps
        for step in range(kill):
            parts = [plan.share[step * batch : (step + 1) * batch] for plan in plans if step < len(plan.batches)]
            assert max(map(len, parts)) - min(map(len, parts)) <= 1 and all(map(len, parts))
            delivered.append((parts, placement, local))
            check_own_first(order, delivered, partitions)
        saved = Position("Loader", "digest", seed, epoch, world, 0, batch, order.order, *order.settings(), drop_last,
                         plans[0].batches.samples_done(kill), "mix" if order.counted else None,
                         plans[0].consumed(kill), partitions, nodes, placement.node_of if partitions > 1 else None,
                         placement.split)
        so_far = np.concatenate([part for parts, _, _ in delivered for part in parts] or [np.zeros(0, np.int64)])
        if saved.consumed is not None:  # the state counts each source's partitions' samples delivered
            assert saved.consumed == tuple(np.bincount(order.part_of(so_far, partitions),
                                                       minlength=order.sources * partitions))
        assert saved.samples_done == len(so_far)
        if kill == steps:
            return delivered, partitions, restarts, world * batch
        loaded = Position.from_dict(saved.to_dict(), "Loader")
        nodes, local, new_batch = next_world(rng, world, batch)
        loaded.check_fits(replace(saved, world_size=nodes * local, batch_size=new_batch, samples_done=0))
        placement = Placement.of(loaded.partitions, nodes, loaded.placement, loaded.nodes, loaded.split)
        done, consumed, batch, restarts = loaded.samples_done, loaded.consumed, new_batch, restarts + 1


def check_own_first(order: BlockOrder | MixOrder, delivered: list, partitions: int) -> None:
    """The last step's ranks read another node's samples of a source only where their own node has
    none left of it: its partitions of it all consumed, or (a source that repeats) none held."""
    parts, placement, local = delivered[-1]
    so_far = np.concatenate([part for step, _, _ in delivered for part in step])
    node_of = np.array(placement.node_of)
    for rank, part in enumerate(parts):
        node = rank // local
        ids = order.part_of(part, partitions)
        foreign = ids[node_of[ids % partitions] != node]
        for source in np.unique(foreign // partitions):
            mine = np.flatnonzero(node_of == node)
            sizes = order.blocks(int(source)).partition_sizes(partitions)[mine]
            if order.repeats:
                assert sizes.sum() == 0, "a node holding a repeating source read another node's"
            else:
                counts = np.bincount(order.part_of(so_far, partitions), minlength=order.sources * partitions)
                assert (counts[source * partitions + mine] == sizes).all(), "a node read another's before its own"


def check_partition_orders(order: BlockOrder | MixOrder, delivered: list, partitions: int, seed: int,
                           epoch: int) -> np.ndarray:
    """Each partition's samples were delivered in the order of its own sequence (its passes one after
    another, each with its window: the run's ``split``), whoever read them. Returns everything
    delivered, in order."""
    split = delivered[0][1].split if delivered else 1
    together = np.concatenate([part for parts, _, _ in delivered for part in parts] or [np.zeros(0, np.int64)])
    ids = order.part_of(together, partitions)
    for part in np.unique(ids):
        source, p = divmod(int(part), partitions)
        size = int(order.blocks(source).partition_sizes(partitions)[p])
        own = stream(functools.partial(order.pass_order, source, seed, epoch, partition=p, partitions=partitions,
                                       split=split), size, 0, int((ids == part).sum()))
        assert np.array_equal(together[ids == part], own)
    return together


@pytest.mark.parametrize("chunk", range(8))
def test_random_kills_nodes_and_ranks_per_node_deliver_each_partition_in_its_own_order(chunk):
    """160 random cases (8 x 20) over one data set: layouts, partitions, orders, windows, seeds,
    epochs, kill points, nodes, ranks per node, modes."""
    restarts = 0
    for case in range(20):
        rng = np.random.default_rng([42, chunk, case])
        bounds, starts = random_shards(rng)
        order = BlockOrder(bounds, ORDERS[case % 3], int(rng.integers(1, 20)), starts)
        seed, epoch, drop_last = int(rng.integers(0, 2**63)), int(rng.integers(0, 100)), bool(rng.random() < 0.3)
        delivered, partitions, restarted, last_global = run_epoch(order, seed, epoch, rng, drop_last)
        restarts += restarted
        together = check_partition_orders(order, delivered, partitions, seed, epoch)
        assert len(np.unique(together)) == len(together)
        if drop_last:
            assert len(order) - len(together) < last_global
        else:
            assert np.array_equal(np.sort(together), np.arange(len(order)))
    assert restarts > 2 * 20  # the cases do restart, several times each


@pytest.mark.parametrize("chunk", range(4))
def test_random_kills_nodes_and_ranks_per_node_over_a_mix_deliver_its_plan(chunk):
    """80 random cases (4 x 20) over a Mix: each source's partitions in their own orders, each
    source's count in the epoch the plan's, every rank's batch stratified."""
    restarts = 0
    for case in range(20):
        rng = np.random.default_rng([42, 1, chunk, case])
        order = random_mix(rng, case)
        seed, epoch, drop_last = int(rng.integers(0, 2**63)), int(rng.integers(0, 100)), bool(rng.random() < 0.3)
        delivered, partitions, restarted, last_global = run_epoch(order, seed, epoch, rng, drop_last)
        restarts += restarted
        together = check_partition_orders(order, delivered, partitions, seed, epoch)
        check_mix_epoch(order, [part for parts, _, _ in delivered for part in parts], together,
                        last_global if drop_last else 0)
    assert restarts > 2 * 20


@pytest.mark.parametrize("case", range(40))
def test_a_resume_on_the_same_nodes_repeats_the_run_that_was_not_stopped(case):
    """The plan from a state depends on the state's counts alone: killed anywhere and resumed on the
    same nodes, ranks and batch, every rank reads what it would have read."""
    rng = np.random.default_rng([42, 7, case])
    bounds, starts = random_shards(rng)
    order = random_mix(rng, case) if case % 2 else BlockOrder(bounds, ORDERS[case % 3], 3, starts)
    nodes, local, batch = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
    placement = Placement.of(int(rng.integers(1, shards_of(order) + 1)), nodes)
    world = nodes * local

    def plans(start: int, consumed: tuple[int, ...] | None) -> list:
        return [plan_epoch(order, seed=case, epoch=2, start=start, world_size=world, rank=r, batch_size=batch,
                           drop_last=False, consumed=consumed, placement=placement) for r in range(world)]

    whole = plans(0, None)
    for kill in rng.integers(0, len(whole[0].batches) + 1, 3):
        kill = int(kill)
        resumed = plans(whole[0].batches.samples_done(kill), whole[0].consumed(kill))
        for before, after in zip(whole, resumed):
            assert np.array_equal(before.share[kill * batch :], after.share)


def test_one_partition_is_the_global_order_on_any_nodes():
    """One partition (a state of a run before placement, or a default one-node run) deals the one
    global sequence to the ranks in turn, whatever the nodes: the order of an unplaced run."""
    rng = np.random.default_rng(7)
    bounds, starts = random_shards(rng)
    order = BlockOrder(bounds, "quasi_random", 3, starts)
    whole = order.sequence(11, 4, 0, np.array([len(order)]), None)
    for nodes, local, batch in ((1, 1, 5), (2, 2, 3), (4, 1, 2), (3, 2, 7)):
        world = nodes * local
        plans = [plan_epoch(order, seed=11, epoch=4, start=0, world_size=world, rank=r, batch_size=batch,
                            drop_last=False, placement=Placement.of(1, nodes)) for r in range(world)]
        dealt = [p.share[s * batch : (s + 1) * batch] for s in range(len(plans[0].batches)) for p in plans]
        assert np.array_equal(np.concatenate(dealt), whole)
        assert plans[0].tally is None  # the state counts samples_done alone, as before placement


def test_nodes_read_their_own_shards_but_for_a_tail():
    """39 shards on 8 nodes of 2 ranks (the issue's simulation): every rank's batches come from its
    node's shards but for a tail at the epoch's end, smaller than a shard per node."""
    counts = np.full(39, 40)
    starts = np.concatenate([[0], np.cumsum(counts)])
    bounds = block_bounds(np.repeat(np.arange(39), counts), np.tile(np.arange(40) * 25_000, 39), 1 << 20)
    order = BlockOrder(bounds, "quasi_random", 4, starts)
    nodes, local = 8, 2
    placement = Placement.of(default_partitions(39, nodes), nodes)
    node_of_shard = np.array(placement.node_of)[order.part_of(starts[:-1], placement.partitions)]
    foreign = 0
    for rank in range(nodes * local):
        plan = plan_epoch(order, seed=3, epoch=1, start=0, world_size=nodes * local, rank=rank, batch_size=16,
                          drop_last=False, placement=placement)
        shard = np.searchsorted(starts, plan.share, side="right") - 1
        outside = node_of_shard[shard] != rank // local
        foreign += int(outside.sum())
        if outside.any():  # only in the last batches
            assert np.flatnonzero(outside)[0] >= len(plan.share) - 3 * 16
    assert 0 < foreign < nodes * 40


# ---- real readers on nodes, every rank of a world in this process ----

def real_epoch(rng: np.random.Generator, make, identify, world_of) -> tuple[list, int]:
    """One epoch of real readers of every rank (``make(nodes, local, batch, rank)``), killed at
    random steps and resumed from rank 0's state on random nodes and ranks per node. ``identify``
    turns what a rank's reader made into sample indices per batch; ``world_of`` the readers of one
    world into their batches and rank 0's state after ``kill`` steps. Returns what was delivered
    (as :func:`run_epoch` does) and the partitions."""
    nodes, local, batch = int(rng.integers(2, 4)), int(rng.integers(1, 3)), int(rng.integers(2, 5))
    state, delivered, worlds = None, [], 0
    while True:
        readers = [make(nodes, local, batch, r) for r in range(nodes * local)]
        for reader in readers:
            if state is not None:
                reader.load_state_dict(state)
        passes = readers[0]._passes
        steps = len(passes.batches(passes.upcoming()[1]))
        kill = int(rng.integers(0, steps)) if steps and (worlds < 3 or rng.random() < 0.5) else steps
        made, state = world_of(readers, kill, steps, batch)
        for step in range(kill):
            delivered.append(([identify(by_rank[step]) for by_rank in made if step < len(by_rank)],
                              passes.placement, local))
        worlds += 1
        if kill == steps:
            assert worlds >= 3  # killed and resumed twice at least
            return delivered, passes.placement.partitions
        nodes, local, batch = next_world(rng, nodes * local, batch)


def take(reader, kill: int, steps: int) -> list:
    """The first ``kill`` batches of a pass; all of them (to the pass's end) when ``kill`` is ``steps``."""
    return list(reader) if kill == steps else [made for _, made in zip(range(kill), reader)]


@pytest.mark.parametrize(("case", "processes"), [(0, 0), (1, 0), (2, 1)])
def test_real_loaders_on_nodes_resumed_on_other_nodes_deliver_the_plan(packed, fingerprints, case, processes):
    rng = np.random.default_rng([42, 2, case])
    dataset = stoker.ShardDataset(packed, block_bytes=64 << 10)
    seed = int(rng.integers(0, 1000))

    def make(nodes, local, batch, rank):
        return stoker.Loader(dataset, batch, crop=PIXELS_CROP, seed=seed, window=3, rank=rank, world_size=nodes * local,
                             nodes=nodes, threads=2, processes=processes, mp_context="fork" if processes else None)

    def world_of(loaders, kill, steps, batch):
        made = [[images.numpy() for images, _ in take(loader, kill, steps)] for loader in loaders]
        return made, loaders[0].state_dict()

    delivered, partitions = real_epoch(rng, make, lambda images: np.array([fingerprints[i.tobytes()] for i in images]),
                                       world_of)
    assert partitions == 12  # the default for the first run's 2 or 3 nodes: one shard each
    order = make(1, 1, 1, 0)._epoch_order
    for end in range(1, len(delivered) + 1):
        check_own_first(order, delivered[:end], partitions)
    together = check_partition_orders(order, delivered, partitions, seed, 0)
    assert sorted(together.tolist()) == list(range(len(dataset)))


@pytest.mark.parametrize(("case", "workers"), [(0, 0), (1, 2)])
def test_real_samplers_on_nodes_under_dataloaders_resumed_on_other_nodes(packed, case, workers):
    dataset = stoker.ShardDataset(packed, decode="raw", block_bytes=64 << 10)
    rng = np.random.default_rng([42, 3, case])

    def make(nodes, local, batch, rank):
        return stoker.QuasiRandomSampler(dataset, seed=9, window=3, num_replicas=nodes * local, rank=rank, nodes=nodes,
                                         batch_size=batch)

    def world_of(samplers, kill, steps, batch):
        loaders = [torch.utils.data.DataLoader(range(len(dataset)), batch_size=batch, sampler=sampler,
                                               num_workers=workers) for sampler in samplers]
        return [take(loader, kill, steps) for loader in loaders], samplers[0].state_dict(samples_done=kill * batch)

    delivered, partitions = real_epoch(rng, make, lambda batch: batch.numpy(), world_of)
    order = make(1, 1, 1, 0)._order
    for end in range(1, len(delivered) + 1):
        check_own_first(order, delivered[:end], partitions)
    together = check_partition_orders(order, delivered, partitions, 9, 0)
    assert sorted(together.tolist()) == list(range(len(dataset)))


def test_real_loaders_on_nodes_over_a_mix_deliver_its_plan(packed, fingerprints):
    rng = np.random.default_rng([42, 4])
    mix = stoker.Mix({name: stoker.ShardDataset(packed, block_bytes=64 << 10) for name in ("a", "b")}, {"a": 2, "b": 1},
                     epoch_size=150)

    def make(nodes, local, batch, rank):
        return stoker.Loader(mix, batch, crop=PIXELS_CROP, seed=5, window=3, rank=rank, world_size=nodes * local,
                             nodes=nodes, threads=2)

    def identify(made):
        images, labels = made
        return np.array([int(mix.offsets[s]) + fingerprints[image.numpy().tobytes()]
                         for s, image in zip(mix.label_source(labels), images)])

    def world_of(loaders, kill, steps, batch):
        return [take(loader, kill, steps) for loader in loaders], loaders[0].state_dict()

    delivered, partitions = real_epoch(rng, make, identify, world_of)
    order = make(1, 1, 1, 0)._epoch_order
    for end in range(1, len(delivered) + 1):
        check_own_first(order, delivered[:end], partitions)
    together = check_partition_orders(order, delivered, partitions, 5, 0)
    check_mix_epoch(order, [part for parts, _, _ in delivered for part in parts], together, 0)


# ---- a real two-node torchrun: the nodes come from its environment ----

def test_two_torchrun_nodes_each_read_their_own_shards(packed, tmp_path):
    """Two torchrun agents on this machine, one per simulated node (static rendezvous), two ranks
    each: every rank finds its node in torchrun's environment, reads its node's shards but for a
    tail, and the four ranks together read the epoch once (the Loader and a sampler alike)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    script = Path(__file__).with_name("ddp_nodes.py")
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                                "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}", str(script),
                                str(packed), str(tmp_path)], cwd=script.parents[1], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    for agent in agents:
        output = agent.communicate(timeout=240)[0]
        assert agent.returncode == 0, output
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(4)]
    dataset = stoker.ShardDataset(packed)
    starts = dataset.shards.starts
    assert [r["node"] for r in ranks] == [0, 0, 1, 1] and ranks[0]["shards"] == list(range(0, 12, 2))
    assert ranks[3]["shards"] == list(range(1, 12, 2))
    assert "over 2 nodes (torchrun's: 2 of LOCAL_WORLD_SIZE=2 ranks each)" in ranks[0]["explain"]
    assert ranks[0]["state"]["partitions"] == 12 and ranks[0]["state"]["nodes"] == 2
    for reader in ("loader", "sampler"):
        read = [r[reader] for r in ranks]
        assert sorted(sum(read, [])) == list(range(len(dataset)))
        for r, indices in zip(ranks, read):
            shards = np.searchsorted(starts, indices, side="right") - 1
            outside = np.flatnonzero(~np.isin(shards, r["shards"]))
            assert not len(outside) or outside[0] >= len(indices) - BATCH  # a tail in the last batch at most
    assert len({len(r["steps"]) for r in ranks}) == 1
