"""Placement (issue 42): partitions of whole shards balanced by samples, their nodes kept across node
counts, the nodes from torchrun's environment or ``nodes=``, ``partitions=`` and what a state records
of them, the refusals and the warnings, and explain()."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import stoker
from stoker.data.placement import Placement, PlacementWarning, default_partitions, node_shards, place, shard_partitions
from stoker.errors import OptionError
from stoker.state import StateError, StateWarning

CROP = stoker.CropSpec("resize", size=(8, 8), flip=False)


# ---- pure functions ----

@pytest.mark.parametrize("case", range(40))
def test_partitions_hold_whole_shards_balanced_by_samples(case):
    rng = np.random.default_rng([42, 5, case])
    samples = rng.integers(1, 3000, size=int(rng.integers(1, 300)))
    partitions = int(rng.integers(1, len(samples) + 1))
    part = shard_partitions(samples, partitions)
    assert part.shape == samples.shape and part.min() >= 0 and part.max() < partitions
    loads = np.bincount(part, samples, minlength=partitions)
    assert loads.max() - loads.min() <= samples.max()  # within about a shard
    assert np.array_equal(part, shard_partitions(samples.copy(), partitions))  # no seed, no epoch


def test_equal_shards_go_round_robin_so_each_partition_spans_the_data_set():
    assert shard_partitions(np.full(10, 7), 4).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    # a short last shard goes where the fewest samples are
    assert shard_partitions(np.array([7, 7, 7, 3]), 3).tolist() == [0, 1, 2, 0]


def test_the_default_partitions_deal_evenly_over_divisors_of_the_node_count():
    assert default_partitions(550, 1) == 1  # one node: the unplaced order
    assert default_partitions(550, 8) == 96 and all(96 % n == 0 for n in (1, 2, 3, 4, 6, 8, 12, 16, 24))
    assert default_partitions(550, 64) == 384  # 64 x 6: 64 x 12 would exceed the shards
    assert default_partitions(39, 8) == 32
    assert default_partitions(5, 8) == 5  # fewer shards than nodes: one each


@pytest.mark.parametrize("case", range(30))
def test_a_node_keeps_its_partitions_and_as_few_as_possible_move(case):
    rng = np.random.default_rng([42, 6, case])
    partitions = int(rng.integers(1, 200))
    before_nodes, nodes = (int(n) for n in rng.integers(1, 40, 2))
    before = place(partitions, before_nodes)
    after = place(partitions, nodes, before)
    counts = np.bincount(after, minlength=nodes)
    assert counts.max() - counts.min() <= 1 and after.min() >= 0 and after.max() < nodes
    stayed = sum(min(int((before == n).sum()), int(c)) for n, c in enumerate(counts))  # the most that can stay
    assert int((after == before).sum()) == stayed
    assert np.array_equal(place(partitions, before_nodes, after), place(partitions, before_nodes, after))


def test_a_node_count_that_divides_keeps_every_partition_on_its_node():
    eight = place(96, 8)
    assert eight.tolist() == [p % 8 for p in range(96)]
    assert np.array_equal(place(96, 4, eight), np.arange(96) % 4)  # node n of 4 holds nodes n and n + 4's
    seven = place(96, 7, eight)
    assert int((seven == eight).sum()) == 84  # only the 12 partitions of the node gone move
    assert int((place(96, 8, seven) == seven).sum()) == 84  # and back


def test_node_shards_are_the_shards_of_its_partitions():
    samples = np.full(12, 10)
    node_of = place(6, 2)
    assert node_shards(samples, 6, node_of, 0).tolist() == [0, 2, 4, 6, 8, 10]
    assert node_shards(samples, 6, node_of, 1).tolist() == [1, 3, 5, 7, 9, 11]


# ---- the readers: nodes, partitions, states ----

def test_nodes_come_from_torchruns_environment(packed, monkeypatch):
    dataset = stoker.ShardDataset(packed)
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": "2"}.items():
        monkeypatch.setenv(name, value)
    loader = stoker.Loader(dataset, 2, crop=CROP, seed=0, threads=1)
    passes = loader._passes
    assert (passes.nodes, passes.node, passes.placement.partitions) == (4, 2, 12)  # 4 x 3: 12 shards
    assert "LOCAL_WORLD_SIZE=2" in loader.explain()
    sampler = stoker.QuasiRandomSampler(dataset, seed=0)
    assert (sampler._passes.nodes, sampler._passes.node) == (4, 2)
    assert {int(s) for s in np.concatenate(passes.node_shards())} == {2, 6, 10}  # partitions 2, 6, 10: one shard each
    monkeypatch.setenv("GROUP_RANK", "1")  # not numbered node by node: one node, said so
    with pytest.warns(PlacementWarning, match="do not number rank 5 of 8 node by node"):
        assert stoker.Loader(dataset, 2, crop=CROP, seed=0, threads=1)._passes.nodes == 1
    assert stoker.Loader(dataset, 2, crop=CROP, seed=0, threads=1, rank=0, world_size=2)._passes.nodes == 1  # another world


def test_bad_nodes_and_partitions_are_refused_naming_what_works(packed):
    dataset = stoker.ShardDataset(packed)
    with pytest.raises(OptionError, match=r"nodes=3: must divide world_size=4"):
        stoker.Loader(dataset, 2, crop=CROP, seed=0, rank=0, world_size=4, nodes=3)
    with pytest.raises(OptionError, match=r"nodes=0: must be an integer from 1"):
        stoker.QuasiRandomSampler(dataset, seed=0, nodes=0)
    with pytest.raises(OptionError, match=r"partitions=13: must be at most 12, the shards of .*whole shards"):
        stoker.Loader(dataset, 2, crop=CROP, seed=0, partitions=13)
    with pytest.raises(OptionError, match=r"partitions=0: must be an integer from 1"):
        stoker.QuasiRandomSampler(dataset, seed=0, partitions=0)


def test_partitions_that_do_not_deal_evenly_warn_naming_the_node_counts_that_do(packed):
    dataset = stoker.ShardDataset(packed)
    with pytest.warns(PlacementWarning, match=r"12 partitions do not deal evenly over 5 nodes: nodes hold 2 or 3.*"
                                              r"node counts that deal them evenly: 1, 2, 3, 4, 6, 12"):
        stoker.QuasiRandomSampler(dataset, seed=0, num_replicas=5, rank=0, nodes=5, partitions=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stoker.QuasiRandomSampler(dataset, seed=0, num_replicas=8, rank=0, nodes=4)  # the default: 4 x 3


def test_a_state_records_the_placement_and_resumes_it_on_other_nodes(packed):
    dataset = stoker.ShardDataset(packed)
    ranks = [stoker.Loader(dataset, 2, crop=CROP, seed=1, threads=1, rank=r, world_size=4, nodes=4) for r in range(4)]
    for loader in ranks:
        next(iter(loader))
    state = ranks[0].state_dict()
    assert (state["stoker_state"], state["partitions"], state["nodes"]) == (4, 12, 4)
    assert state["placement"] == [p % 4 for p in range(12)] and sum(state["consumed"]) == state["samples_done"] == 8
    halves = [stoker.Loader(dataset, 4, crop=CROP, seed=1, threads=1, rank=r, world_size=2, nodes=2) for r in range(2)]
    for loader in halves:
        loader.load_state_dict(state)
    assert halves[0]._passes.placement.node_of == tuple(p % 2 for p in range(12))  # node n kept nodes n, n + 2's
    text = halves[1].explain()
    assert "12 partitions of whole shards (taken from the loaded state) over 2 nodes" in text
    assert "node 1: partitions 1, 3, 5, 7, 9, 11 (kept 3, 3 from node 3 (gone)): 6 shards" in text
    with pytest.warns(StateWarning, match=r"partitions=6 and loads a state saved mid-epoch with 12: it takes 12"):
        stoker.Loader(dataset, 4, crop=CROP, seed=1, threads=1, rank=0, world_size=2, nodes=2,
                      partitions=6).load_state_dict(state)
    fresh = stoker.Loader(dataset, 4, crop=CROP, seed=1, threads=1, rank=0, world_size=2, nodes=2, partitions=6)
    fresh.load_state_dict({**state, "samples_done": 0, "consumed": [0] * 12})  # at an epoch's start: as given
    assert fresh._passes.placement.partitions == 6 and fresh.state_dict()["partitions"] == 6


def test_a_state_from_before_placement_resumes_as_one_partition(packed):
    dataset = stoker.ShardDataset(packed)
    loader = stoker.Loader(dataset, 4, crop=CROP, seed=2, threads=1)
    for _ in zip(range(3), loader):
        pass
    state = loader.state_dict()
    version_3 = {**{k: v for k, v in state.items() if k not in ("partitions", "nodes", "placement")}, "stoker_state": 3}
    on_two = [stoker.Loader(dataset, 1, crop=CROP, seed=2, threads=1, rank=r, world_size=4, nodes=2) for r in range(4)]
    for loader_of_rank in on_two:
        with pytest.warns(PlacementWarning, match="1 partitions do not deal evenly over 2 nodes: nodes hold one or none"):
            loader_of_rank.load_state_dict(version_3)
    assert on_two[0].state_dict()["partitions"] == 1 and on_two[0].state_dict()["samples_done"] == 12
    whole = loader._epoch_order.sequence(2, 0, 0, np.array([len(dataset)]), None)
    firsts = [int(r._passes.plan(0, 12).share[0]) for r in on_two]
    assert firsts == whole[12:16].tolist()  # the unplaced order goes on, dealt to the 4 ranks in turn


@pytest.mark.parametrize(("change", "match"), [
    ({"placement": [0, 1]}, r"placement=\[0, 1\] must be None for one partition, else the node \(0 to 3\) of each"),
    ({"placement": None}, r"placement=None must be None for one partition, else the node"),
    ({"placement": [5] * 12}, r"placement=\[5, 5, .*the node \(0 to 3\)"),
    ({"partitions": 0}, r"partitions=0 must be an integer from 1"),
    ({"nodes": 0}, r"nodes=0 must be an integer from 1"),
    ({"consumed": None}, r"several partitions' state after samples_done=8 samples needs consumed"),
    ({"consumed": [1] * 12}, r"consumed=\[1, 1, .* must count several partitions' samples_done=8"),
])
def test_a_damaged_placement_record_is_refused(packed, change, match):
    dataset = stoker.ShardDataset(packed)
    ranks = [stoker.Loader(dataset, 2, crop=CROP, seed=1, threads=1, rank=r, world_size=4, nodes=4) for r in range(4)]
    next(iter(ranks[0]))
    state = ranks[0].state_dict()
    with pytest.raises(StateError, match=match):
        ranks[1].load_state_dict({**state, **change})


def test_explain_says_one_node_reads_one_sequence(packed):
    text = stoker.Loader(stoker.ShardDataset(packed), 4, crop=CROP, seed=0, threads=1).explain()
    assert ("placement: 1 partition of whole shards (the default on one node: one sequence over the whole data set) "
            "over 1 node (one node (no torchrun LOCAL_WORLD_SIZE") in text


def test_many_nodes_explain_a_few_and_this_ranks(packed):
    sampler = stoker.QuasiRandomSampler(stoker.ShardDataset(packed), seed=0, num_replicas=12, rank=11, nodes=12)
    lines = sampler._passes.describe_placement()
    assert lines[0].startswith("  placement: 12 partitions of whole shards (the default for 12 nodes, 1 each")
    assert lines[1].startswith("    each node reads its partitions together, each with 16 blocks of window=16 open")
    assert [line.split(":")[0].strip() for line in lines[2:-1]] == [*(f"node {n}" for n in range(8)), "node 11"]
    assert lines[-1] == "    ... and 3 more nodes"
    assert Placement.of(3, 5).describe(4) == "node 4: partitions none (fewer partitions than nodes)"
