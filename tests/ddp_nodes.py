"""One rank of tests/test_placed_resume.py's two-node run: torchrun starts it on each simulated node
(``--nnodes 2 --node-rank N``, gloo, CPU). It reads a packed data set through stoker.Loader and
through QuasiRandomSampler + a DataLoader, the nodes and partitions taken from torchrun's
environment, and writes what it read and where the reader placed it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist
import torch.utils.data

import stoker

BATCH = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = stoker.ShardDataset(args.data)
    loader = stoker.Loader(dataset, BATCH, crop=stoker.CropSpec("resize", size=(8, 8), flip=False), seed=3, threads=1)
    sampler = stoker.QuasiRandomSampler(dataset, seed=3, batch_size=BATCH)
    indices = torch.utils.data.DataLoader(range(len(dataset)), batch_size=BATCH, sampler=sampler)
    steps = [len(labels) for _, labels in loader]
    seen = {"node": int(os.environ["GROUP_RANK"]), "loader": loader.indices(0).tolist(), "steps": steps,
            "sampler": [i for batch in indices for i in batch.tolist()],
            "shards": [int(s) for s in loader._passes.node_shards()[0]], "explain": loader.explain(),
            "state": loader.state_dict()}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
