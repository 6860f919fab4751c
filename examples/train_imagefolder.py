"""Train a small ResNet on an ImageFolder tree with torchvision transforms, fed by a torch DataLoader
(``--loader torch``) or by stoker.Loader (``--loader stoker``): the migration of docs/user-guide.md,
as a script that runs. Checkpoints every ``--checkpoint-every`` steps (model, optimizer and the
loader's position) and ``--resume`` continues from the last one at the next unseen batch.

    python examples/train_imagefolder.py /data/train --loader stoker --epochs 2 --checkpoint run.pt
    python examples/train_imagefolder.py /data/train --loader stoker --epochs 2 --checkpoint run.pt --resume

Both loaders read the folder packed once by stoker (into ~/.cache/stoker/packs; ``--loader torch``
reads it with ShardDataset + QuasiRandomSampler in DataLoader workers, which is what makes its
position resumable). ``stoker.watch`` logs the share of time the loop waits for data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torchvision.transforms as T
from torch import nn
from torch.utils.data import DataLoader

import stoker
from stoker.pack.cache import pack_once

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False), nn.BatchNorm2d(outputs),
                                  nn.ReLU(inplace=True), nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(outputs))
        self.shortcut = nn.Identity() if stride == 1 and inputs == outputs else nn.Sequential(
            nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet(classes: int, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2)) -> nn.Module:
    """ResNet-18 with ``width=64``; narrower for a CPU."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    channels = width
    for stage, count in enumerate(blocks):
        outputs = width * 2**stage
        for i in range(count):
            layers.append(Block(channels, outputs, 2 if i == 0 and stage > 0 else 1))
            channels = outputs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="ImageFolder tree: DATA/<class>/<image>")
    parser.add_argument("--loader", choices=["torch", "stoker"], default="stoker")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="crop size")
    parser.add_argument("--width", type=int, default=16, help="ResNet width (64: ResNet-18)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (--loader torch)")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps in all (0: no limit)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    train = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                       T.ToTensor(), T.Normalize(MEAN, STD)])
    shards = pack_once(args.data)  # once; later runs reuse the pack
    if args.loader == "torch":  # before: the transform in DataLoader worker processes
        dataset = stoker.ShardDataset(shards, transform=train)
        sampler = stoker.QuasiRandomSampler(dataset, seed=args.seed)
        loader = DataLoader(dataset, args.batch_size, sampler=sampler, num_workers=args.workers,
                            pin_memory=device.type == "cuda")
        position = sampler
    else:  # after: the same transform, fused and batched by stoker's threads
        dataset = stoker.ShardDataset(shards)
        loader = stoker.Loader(dataset, args.batch_size, transform=train, seed=args.seed,
                               device=device if device.type == "cuda" else None)
        position = loader
        print(loader.explain())

    # channels_last on CUDA only: on the CPU here (torch 2.13 and 2.14) its convolution backward gave
    # different weights from run to run, and crashed the process with one intra-op thread
    memory = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    model = resnet(len(dataset.classes), args.width).to(device, memory_format=memory)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    step, epoch, steps_in_pass = 0, 0, 0
    if args.resume:
        state = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        position.load_state_dict(state["loader"])
        step, epoch = state["step"], state["loader"]["epoch"]
        print(f"resumed at step {step}, epoch {epoch}")

    def save() -> None:
        # the DataLoader path counts what the model trained on; the Loader knows what it yielded
        where = position.state_dict(steps_in_pass * args.batch_size) if args.loader == "torch" else position.state_dict()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": where, "step": step},
                   args.checkpoint)

    loss_fn = nn.CrossEntropyLoss()
    while epoch < args.epochs:
        position.set_epoch(epoch)  # keeps a resumed position within this epoch
        steps_in_pass = 0
        for images, labels in stoker.watch(loader, every=50, log=print):
            images = images.to(device, non_blocking=True, memory_format=memory)
            loss = loss_fn(model(images), labels.to(device, non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, steps_in_pass = step + 1, steps_in_pass + 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
            if step % args.checkpoint_every == 0 or step == args.max_steps:
                save()
            if step == args.max_steps:
                print(f"stopped at step {step}; --resume continues")
                return
        epoch += 1
    save()
    print(f"done: {step} steps, {args.epochs} epochs")


if __name__ == "__main__":
    main()
