"""One rank of tests/test_distributed.py, run under torchrun (gloo, CPU): reads a packed data set
through QuasiRandomSampler + DataLoader workers and through stoker.Loader, and writes what it saw.

    phase full:   epochs 0 and 1 whole
    phase first:  the first STOP batches of epoch 0, then saves each reader's state and exits
    phase resume: loads that state, then the rest of epoch 0 and epoch 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import torch.distributed as dist
import torch.utils.data

import stoker

BATCH = 10


class Keys(torch.utils.data.Dataset):
    """The sample keys of a ShardDataset, so that what each rank read can be compared."""

    def __init__(self, dataset: stoker.ShardDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> str:
        return self.dataset.key(index)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out", type=Path)
    parser.add_argument("phase", choices=["full", "first", "resume"])
    parser.add_argument("--stop", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = stoker.ShardDataset(args.data)
    sampler = stoker.QuasiRandomSampler(dataset, seed=7)
    keys = torch.utils.data.DataLoader(Keys(dataset), batch_size=BATCH, sampler=sampler, num_workers=2)
    loader = stoker.Loader(dataset, batch_size=BATCH, crop=stoker.CropSpec(size=(32, 32)), seed=7, threads=2,
                           drop_last=True)
    state_file = args.out / f"state-{rank}.json"
    if args.phase == "resume":
        state = json.loads(state_file.read_text())
        sampler.load_state_dict(state["sampler"])
        loader.load_state_dict(state["loader"])
    seen: dict[str, list] = {"keys": [], "batches": [], "loader_indices": [], "batch_counts": []}
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        loader.set_epoch(epoch)
        seen["loader_indices"].append([dataset.key(i) for i in loader.indices(epoch)])
        counts = [len(keys), len(loader)]
        for n, batch in enumerate(keys, 1):
            seen["keys"].append(list(batch))
            if args.phase == "first" and n == args.stop:
                break
        for n, (images, labels) in enumerate(loader, 1):  # the state is saved after a step, as in training
            seen["batches"].append(hashlib.sha1(images.numpy().tobytes() + labels.numpy().tobytes()).hexdigest())
            if args.phase == "first" and n == args.stop:
                break
        seen["batch_counts"].append(counts)
        if args.phase == "first":
            state_file.write_text(json.dumps({"sampler": sampler.state_dict(args.stop * BATCH),
                                              "loader": loader.state_dict()}))
            break
    (args.out / f"{args.phase}-{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
