"""Training on several nodes from an object store: what each node fetches (stoker.bench.nodes).

N simulated nodes x G ranks (each rank a process with torchrun's environment and a gloo group,
each node its own link to the store, metadata folder and node cache folder) read a small packed
set (~570 photos in ~39 shards, ~40 MB, each photo its own class) from the moto S3 server with
stoker.Loader, for 2 epochs, in three set-ups:

  cache      ``cache_dir`` on each node, its default limit (room for the whole set here)
  tight      ``cache_dir`` with ``cache_limit`` = 1.25 x a node's share (the set's bytes / N)
  no cache   no ``cache_dir`` given

Printed per run: the store's shard bytes in epoch 0 and 1, summed over nodes, as a multiple of the
set's; the most a node fetched as a multiple of the shards its ranks read from (1: each byte once);
the manifest and index requests of the busiest node (whole run); the largest growth of a rank's
resident memory while it read the last epoch; whether every sample of every epoch was delivered
exactly once. ``--baseline PATH`` runs a checkout of another commit the same way, beside it (its folder
first on PYTHONPATH; its C extensions built in place).

    .venv/bin/python bench/nodes.py [--quick] [--nodes 1 2 4 8] [--baseline /tmp/stoker-base]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import stoker
from stoker.bench.nodes import NodeJob, NodesRun, simulate
from stoker.format import read_manifest
from stoker.sample_data import make_sample_photos

from _common import header

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.s3server import S3Server  # noqa: E402 -- the tests' moto server, started the same way

PHOTOS = 570
SHARD_BYTES = 1 << 20
RANKS = 2
SETUPS = ("cache", "tight", "no cache")


def packed_set(data: Path) -> Path:
    """The photos, each its own class, packed into ~1 MB shards (made once under ``data``)."""
    shards = data / "shards"
    if not (shards / "stoker.json").is_file():
        photos = make_sample_photos(data / "photos", count=PHOTOS, num_classes=PHOTOS, seed=3)
        stoker.pack(photos, shards, shard_bytes=SHARD_BYTES, workers=os.cpu_count() or 1, progress=False)
    return shards


def shard_of_labels(shards: Path) -> tuple[np.ndarray, np.ndarray]:
    """For each label (each photo is its own class), the number of the shard it is in; each shard's bytes."""
    dataset = stoker.ShardDataset(shards)
    shard_of = np.empty(len(dataset), np.int64)
    shard_of[dataset.shards.column("label")] = np.searchsorted(dataset.shards.starts, np.arange(len(dataset)),
                                                               side="right") - 1
    return shard_of, np.array([entry.bytes for entry in dataset.shards.manifest.shards])


def reread(run: NodesRun, epoch: int, shard_of: np.ndarray, sizes: np.ndarray) -> float:
    """The most any node fetched in ``epoch`` as a multiple of the shards its ranks read from."""
    ratios = [run.shard_bytes(epoch, node) / sizes[np.unique(shard_of[run.delivered[node][epoch]])].sum()
              for node in range(len(run.delivered))]
    return max(ratios)


def row(nodes: int, ranks: int, setup: str, code: str, run: NodesRun, total: int, shards: tuple[np.ndarray, np.ndarray],
        seconds: float) -> str:
    epochs = " / ".join(f"{run.shard_bytes(e) / total:5.2f}" for e in range(len(run.traffic)))
    rereads = " / ".join(f"{reread(run, e, *shards):4.2f}" for e in range(len(run.traffic)))
    metadata = [run.metadata_requests(n) for n in range(nodes)]
    manifest, indexes = max(m["manifest"] for m in metadata), max(m["indexes"] for m in metadata)
    return (f"| {nodes} x {ranks} | {setup} | {code} | {epochs} | {rereads} | {manifest} + {indexes} | "
            f"{max(run.memory_growth) / 1e6:.0f} MB | {'yes' if run.exact(len(shards[0])) else 'NO'} | {seconds:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/nodes"))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--quick", action="store_true", help="1 and 2 nodes only")
    parser.add_argument("--baseline", default=None, help="a checkout of another commit, run the same way")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--ranks", type=int, default=RANKS, help="ranks per node")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    header("several nodes from an object store: bytes fetched per node")
    shards = packed_set(args.data)
    manifest = read_manifest(shards)
    total = sum(entry.bytes for entry in manifest.shards)
    labelled = shard_of_labels(shards)
    print(f"data: {manifest.num_samples} photos, {len(manifest.shards)} shards, {total / 1e6:.1f} MB; "
          f"{args.ranks} ranks per node, batch {args.batch} per rank, 2 epochs")
    codes = {"this": None, **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-nodes-"))
    server = S3Server(work / "requests.log")
    try:
        server.fs.mkdir("data")
        server.fs.put(str(shards) + "/", "data/ds", recursive=True)
        print("| N x G | set-up | code | store bytes / set, epoch 0 / 1 | a node's bytes / its shards' (most) | "
              "manifest + index requests (busiest node) | rank memory growth, last epoch | exact | time |")
        print("|---|---|---|---|---|---|---|---|---|")
        for nodes in [1, 2] if args.quick else args.nodes:
            for setup in args.setups:
                for code, path in codes.items():
                    limit = int(1.25 * total / nodes) if setup == "tight" else None
                    job = NodeJob("s3://data/ds", server.options, nodes, args.ranks, cache=setup != "no cache",
                                  cache_limit=limit, batch=args.batch, pythonpath=path)
                    started = time.perf_counter()
                    run = simulate(job, server.port, work / f"{nodes}-{setup.replace(' ', '-')}-{code}")
                    print(row(nodes, args.ranks, setup, code, run, total, labelled, time.perf_counter() - started),
                          flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
