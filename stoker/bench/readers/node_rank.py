"""Reader: one rank of a simulated multi-node job (stoker.bench.nodes starts it with torchrun's
environment): a gloo group, stoker.Loader over a data set at a URL, a few epochs; writes the labels
it delivered in each epoch and how far its memory grew while it read the last epoch (what is
made once, the store's client, batch buffers, was made in the first).

Only the public API, as a training script uses it, so the same script runs another checkout of
stoker (its folder first on PYTHONPATH). Between epochs rank 0 hands over to the simulation
(``epoch-N.done``, then waits for ``epoch-N.counted``) so that the store's bytes are counted per epoch.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch.distributed as dist

import stoker

_HANDOVER_SECONDS = 600.0


def memory_kb(field: str) -> int:
    """A field of /proc/self/status in kB (VmRSS: resident now, VmHWM: the peak so far)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def hand_over(out: Path, epoch: int) -> None:
    """Tell the simulation that every rank ended ``epoch``; wait until it has counted the store's bytes."""
    (out / f"epoch-{epoch}.done").touch()
    deadline = time.monotonic() + _HANDOVER_SECONDS
    while not (out / f"epoch-{epoch}.counted").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{out}: epoch {epoch}'s bytes were never counted")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--storage-options", type=json.loads, required=True, help="JSON")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--cache-limit", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = stoker.ShardDataset(args.url, storage_options=args.storage_options, cache_dir=args.cache_dir,
                                  cache_limit=args.cache_limit)
    loader = stoker.Loader(dataset, args.batch, crop=stoker.CropSpec(size=(16, 16)), seed=0, threads=1)
    epochs, resident = [], 0
    for epoch in range(args.epochs):
        if epoch == args.epochs - 1:  # the last epoch's growth: what was made once (a client, buffers) is made
            Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
            resident = memory_kb("VmRSS")
        epochs.append([label for _, labels in loader for label in labels.tolist()])
        dist.barrier()
        if rank == 0:
            hand_over(args.out, epoch)
        dist.barrier()
    growth = (memory_kb("VmHWM") - resident) * 1024
    (args.out / f"rank-{rank}.json").write_text(json.dumps({"epochs": epochs, "memory_growth": growth}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
