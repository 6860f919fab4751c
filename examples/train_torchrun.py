"""Train with plain torch.distributed under torchrun, fed by stoker.Loader; checkpoint mid-epoch, resume after a failure.

    stoker pack /data/train /fast/train                              # once
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --max-restarts 3 \
        examples/train_torchrun.py /fast/train --checkpoint run.pt

Every ``--every`` steps rank 0 saves the model, the optimizer and the Loader's state in one file
(written under another name, then renamed: a kill never leaves half a checkpoint), and every rank
waits until it is there. When a process dies, torchrun stops the others and, with
``--max-restarts``, starts them all again (or your scheduler reruns the command): each rank loads
the checkpoint, and the epoch goes on at the first batch the job had not trained on. Rank 0's
Loader state serves every rank, since ranks step together. (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torchrun
keeps one store across restarts, and a restarted gloo or NCCL group can read the addresses of the processes
that died there and fail to connect; pytorch/pytorch#135712, still so with torch 2.13 and gloo.)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import stoker

AfterStep = Callable[[int, int, torch.Tensor], None]  # step (1 for the first), epoch, the batch's labels


def network(classes: int, width: int = 16) -> nn.Module:
    """A small convolutional network on the Loader's uint8 NCHW batches (scaled to [0, 1] first)."""
    return nn.Sequential(nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                         nn.Conv2d(width, 2 * width, 3, 2, 1), nn.ReLU(inplace=True),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))


def main(argv: Sequence[str] | None = None, after_step: AfterStep | None = None) -> None:
    """Train as the command line says; ``after_step`` is called on every rank after each step (and its checkpoint)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a packed data set (stoker pack SRC DST)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--size", type=int, default=64, help="crop size")
    parser.add_argument("--threads", type=int, default=None, help="Loader threads (default: the Loader chooses)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"), help="resumed from when it exists")
    parser.add_argument("--every", type=int, default=100, help="checkpoint every this many steps")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    dataset = stoker.ShardDataset(args.data)
    loader = stoker.Loader(dataset, args.batch_size, crop=stoker.CropSpec(size=(args.size, args.size)),
                           threads=args.threads, seed=args.seed, device=device if cuda else None,  # rank from dist
                           drop_last=True)  # every rank makes the same number of steps (DDP all-reduces each one)
    model = DistributedDataParallel(network(len(dataset.classes)).to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=device)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # its epoch, and the samples of it the job trained on
        step = state["step"]
        print(f"rank {dist.get_rank()}: resumed at step {step}, epoch {loader.epoch}", flush=True)

    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a loaded position within this epoch
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.float() / 255), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.every == 0:
                if dist.get_rank() == 0:
                    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                             "loader": loader.state_dict(), "step": step}
                    torch.save(state, args.checkpoint.with_suffix(".partial"))
                    os.replace(args.checkpoint.with_suffix(".partial"), args.checkpoint)
                    print(f"epoch {epoch} step {step} loss {loss.item():.3f}: saved {args.checkpoint}", flush=True)
                dist.barrier()  # no rank goes on (or fails) before the checkpoint is whole
            if after_step is not None:
                after_step(step, epoch, labels)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
