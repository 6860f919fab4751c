"""A job of 2 simulated nodes x 2 ranks (stoker.bench.nodes: each rank a process with torchrun's
environment and a gloo group, each node its own link to the moto server, metadata and cache
folder) reading a data set at an s3:// URL with stoker.Loader, no ``cache_dir`` given, 2 epochs:
every sample of every epoch delivered once; the manifest and each index fetched once per node;
each shard fetched at most once per node over both epochs (the node cache chosen for the ranks
holds the set); and, once the order pins shards to nodes, the store's bytes per
epoch about the data set's (not the number of nodes times it)."""

from __future__ import annotations

import pytest

from stoker.bench.nodes import NodeJob, NodesRun, simulate
from stoker.format import read_manifest
from tests.conftest import NUMBERED

NODES, RANKS = 2, 2


@pytest.fixture(scope="module")
def job(s3, numbered, tmp_path_factory) -> tuple[NodesRun, dict[str, int]]:
    """One simulated run, and each shard's bytes by its object's path."""
    s3.fs.put(str(numbered) + "/", "data/numbered", recursive=True)
    run = simulate(NodeJob("s3://data/numbered", s3.options, NODES, RANKS, cache=False, batch=4), s3.port,
                   tmp_path_factory.mktemp("nodes") / "job")
    return run, {f"/data/numbered/{entry.name}": entry.bytes for entry in read_manifest(numbered).shards}


def test_every_sample_of_every_epoch_is_delivered_once(job):
    run, _ = job
    assert run.exact(NUMBERED)


def test_the_manifest_and_each_index_are_fetched_once_per_node(job):
    run, sizes = job
    for node in range(NODES):
        gets = {request: tally["requests"] for epoch in run.traffic for request, tally in epoch[node].items()
                if request.startswith("GET ") and not request.endswith(".tar")}
        assert gets == {"GET /data/numbered/stoker.json": 1,
                        **{f"GET {path[:-4]}.idx": 1 for path in sizes}}, gets


def test_each_shard_comes_once_per_node_without_a_cache_dir(job):
    """Once over both epochs, even: the node cache chosen for the ranks holds the set."""
    run, sizes = job
    for node in range(NODES):
        fetched = [run.bytes_per_shard(epoch, node) for epoch in (0, 1)]
        assert all(fetched[0].get(path, 0) + fetched[1].get(path, 0) <= size for path, size in sizes.items()), fetched
    assert run.shard_bytes(0) > 0


def test_the_nodes_together_fetch_about_the_data_set_once(job):
    """Each node's ranks read only its own partitions of whole shards: one epoch fetches the set
    about once between the nodes (the tail of the epoch may read a few of another node's)."""
    run, sizes = job
    assert run.shard_bytes(0) <= 1.1 * sum(sizes.values())
    # the next epoch from the node caches, but the few samples of another node's shards at its end
    assert run.shard_bytes(1) <= 0.1 * sum(sizes.values())
