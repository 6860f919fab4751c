"""Train a small network with PyTorch Lightning's Trainer fed by stoker.Loader; checkpoint mid-epoch and resume.

    stoker pack /data/train /fast/train                                  # once
    python examples/train_lightning.py /fast/train --devices 2 --checkpoints runs/1
    python examples/train_lightning.py /fast/train --devices 2 --checkpoints runs/1 --resume   # after a failure

Lightning keeps the train dataloader's ``state_dict()`` in every checkpoint (rank 0's, under the fit
loop's ``combined_loader``) and gives it back to ``load_state_dict()`` when it resumes: stoker.Loader
has both, so a run resumed from a mid-epoch checkpoint trains on the batches it had not trained on
and on no other. The Loader is made in ``train_dataloader()``, after Lightning has started the
process group, so it takes its rank and world size from torch.distributed. Lightning sets each
epoch through ``loader.sampler.set_epoch``, as for a DataLoader; a Loader returned by
``val_dataloader()`` is read whole at every validation, its sanity check's two batches
notwithstanding. On the CPU, ``ddp`` runs over gloo.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

import stoker


class Images(L.LightningDataModule):
    """A packed data set read by stoker.Loader, ``batch_size`` images per rank and step."""

    def __init__(self, data: Path, batch_size: int, size: int, threads: int | None, seed: int) -> None:
        super().__init__()
        self.data, self.batch_size, self.size, self.threads, self.seed = data, batch_size, size, threads, seed

    def train_dataloader(self) -> stoker.Loader:
        # drop_last: every rank makes the same number of steps (DDP all-reduces each one)
        return stoker.Loader(stoker.ShardDataset(self.data), self.batch_size, crop=stoker.CropSpec(size=(self.size, self.size)),
                             threads=self.threads, seed=self.seed, drop_last=True)


class Classifier(L.LightningModule):
    """A small convolutional network on the Loader's uint8 NCHW batches."""

    def __init__(self, classes: int, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                 nn.Conv2d(width, 2 * width, 3, 2, 1), nn.ReLU(inplace=True),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images.float() / 255), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Callback] = ()) -> None:
    """Fit as the command line says; ``callbacks`` are added to the Trainer's."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a packed data set (stoker pack SRC DST)")
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs, or CPU processes over gloo)")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--size", type=int, default=64, help="crop size")
    parser.add_argument("--threads", type=int, default=None, help="Loader threads (default: the Loader chooses)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoints", type=Path, default=Path("checkpoints"))
    parser.add_argument("--every", type=int, default=100, help="checkpoint every this many steps")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoints/last.ckpt")
    args = parser.parse_args(argv)
    L.seed_everything(args.seed)
    data = Images(args.data, args.batch_size, args.size, args.threads, args.seed)
    model = Classifier(len(stoker.ShardDataset(args.data).classes))
    checkpoint = ModelCheckpoint(dirpath=args.checkpoints, every_n_train_steps=args.every, save_last=True)
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_epochs=args.epochs, callbacks=[checkpoint, *callbacks], logger=False,
                        enable_model_summary=False)
    trainer.fit(model, data, ckpt_path=args.checkpoints / "last.ckpt" if args.resume else None)


if __name__ == "__main__":
    main()
