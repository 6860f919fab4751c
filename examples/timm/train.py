#!/usr/bin/env python3
"""A compact timm training loop whose batches come from stoker.

Its data path is built as timm's train.py (huggingface/pytorch-image-models) builds it with
--no-prefetcher: ``create_dataset`` for the train and validation splits, the transform arguments
``create_loader`` takes, the epoch set through the loader before each epoch (train.py's
``_set_loader_epoch``), Mixup/CutMix applied in the loop, ``CheckpointSaver`` and ``resume_checkpoint``.
Written for stoker after that script; no code of it is copied. The only change from timm's own
loader is the two ``create_loader`` calls: train.py.diff shows them, and

    patch -R -o train_timm_loader.py train.py train.py.diff

writes the loop as it reads with timm's DataLoader. Run it as timm's train.py is run:

    python examples/timm/train.py /data/imagenet --model resnet50 -b 256 --epochs 90
    python examples/timm/train.py /data/imagenet --model resnet50 -b 256 --epochs 90 --resume output/last.pth.tar
    python examples/timm/train.py /tmp/tiny --model resnet10t --num-classes 24 --img-size 64 -b 8 --epochs 2
"""

import argparse
import logging
import os

import torch
import torch.nn as nn
from timm import utils
from timm.data import Mixup, create_dataset, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.models import create_model, resume_checkpoint
from timm.optim import create_optimizer_v2

import stoker

_logger = logging.getLogger("train")

parser = argparse.ArgumentParser(description="A compact timm training loop")
parser.add_argument("data_dir", metavar="DIR", help="root of the data set: an ImageFolder tree per split (DIR/train, DIR/val)")
parser.add_argument("--dataset", default="", help="timm's dataset name ('': folders of images)")
parser.add_argument("--train-split", default="train")
parser.add_argument("--val-split", default="validation", help="a folder of DIR (validation, val, ...)")
parser.add_argument("--model", default="resnet10t", help="a timm model, made without pretrained weights")
parser.add_argument("--num-classes", type=int, default=None, help="the model's outputs (default: the model's)")
parser.add_argument("--img-size", type=int, default=None, help="image size (default: the model's)")
parser.add_argument("--crop-pct", type=float, default=None, help="validation crop fraction (default: the model's)")
parser.add_argument("--interpolation", default="", help="validation resize filter (default: the model's)")
parser.add_argument("--train-interpolation", default="random", help="training crop's filter ('random': per image)")
parser.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], help="RandomResizedCrop's area range")
parser.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3], help="RandomResizedCrop's aspect range")
parser.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
parser.add_argument("--color-jitter", type=float, default=0.4, help="ColorJitter's brightness, contrast and saturation")
parser.add_argument("--mixup", type=float, default=0.0, help="mixup alpha (on where > 0)")
parser.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha (on where > 0)")
parser.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
parser.add_argument("-b", "--batch-size", type=int, default=128)
parser.add_argument("--epochs", type=int, default=300)
parser.add_argument("--opt", default="sgd", help="a timm optimizer")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--weight-decay", type=float, default=2e-5)
parser.add_argument("--seed", type=int, default=42, help="seeds torch, numpy and random, as train.py does")
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--output", default="output", help="folder of the checkpoints (last.pth.tar, checkpoint-EPOCH.pth.tar)")
parser.add_argument("--resume", default="", help="a checkpoint to resume from: training goes on at the epoch after it")
parser.add_argument("--log-interval", type=int, default=50, help="batches between log lines")


def main():
    utils.setup_default_logging()
    args = parser.parse_args()
    utils.random_seed(args.seed, 0)
    device = torch.device(args.device)

    model = create_model(args.model, pretrained=False, num_classes=args.num_classes).to(device)
    data_config = resolve_data_config(vars(args), model=model)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay,
                                    momentum=args.momentum)
    start_epoch = resume_checkpoint(model, args.resume, optimizer) if args.resume else 0

    dataset_train = create_dataset(args.dataset, root=args.data_dir, split=args.train_split, is_training=True,
                                   batch_size=args.batch_size, seed=args.seed)
    dataset_eval = create_dataset(args.dataset, root=args.data_dir, split=args.val_split, is_training=False,
                                  batch_size=args.batch_size)

    loader_train = stoker.loader_for(dataset_train, batch_size=args.batch_size, drop_last=True, transform=create_transform(
        data_config["input_size"], is_training=True,
        scale=args.scale, ratio=args.ratio, hflip=args.hflip, color_jitter=args.color_jitter,
        interpolation=args.train_interpolation, mean=data_config["mean"], std=data_config["std"]))
    loader_eval = stoker.loader_for(dataset_eval, batch_size=args.batch_size, order="sequential", transform=create_transform(
        data_config["input_size"],
        interpolation=data_config["interpolation"], mean=data_config["mean"], std=data_config["std"],
        crop_pct=data_config["crop_pct"]))

    mixup_fn = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing,
                         num_classes=model.num_classes)
        train_loss_fn = SoftTargetCrossEntropy()  # mixup's targets carry the smoothing
    elif args.smoothing:
        train_loss_fn = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    else:
        train_loss_fn = nn.CrossEntropyLoss()

    os.makedirs(args.output, exist_ok=True)
    saver = utils.CheckpointSaver(model=model, optimizer=optimizer, checkpoint_dir=args.output,
                                  recovery_dir=args.output)
    for epoch in range(start_epoch, args.epochs):
        set_loader_epoch(loader_train, epoch)
        train_one_epoch(epoch, model, loader_train, optimizer, train_loss_fn, device, mixup_fn, args.log_interval)
        metrics = validate(model, loader_eval, device)
        saver.save_checkpoint(epoch, metric=metrics["top1"])


def set_loader_epoch(loader, epoch):
    """What timm's train.py does before each epoch: the data set's set_epoch, and the batch sampler's
    (else the sampler's), so that a resumed run reads the epoch it resumes at."""
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
    if hasattr(loader.batch_sampler, "set_epoch"):
        loader.batch_sampler.set_epoch(epoch)
    elif hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, device, mixup_fn, log_interval):
    model.train()
    losses = utils.AverageMeter()
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.to(device), target.to(device)
        if mixup_fn is not None:
            input, target = mixup_fn(input, target)
        loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update(loss.item(), input.size(0))
        if batch_idx % log_interval == 0 or batch_idx == len(loader) - 1:
            _logger.info(f"Train: {epoch} [{batch_idx + 1}/{len(loader)}]  Loss: {losses.val:.4f} ({losses.avg:.4f})")
    return {"loss": losses.avg}


def validate(model, loader, device):
    model.eval()
    loss_fn = nn.CrossEntropyLoss()
    losses, top1, top5 = utils.AverageMeter(), utils.AverageMeter(), utils.AverageMeter()
    with torch.no_grad():
        for input, target in loader:
            input, target = input.to(device), target.to(device)
            output = model(input)
            acc1, acc5 = utils.accuracy(output, target, topk=(1, min(5, output.size(1))))
            losses.update(loss_fn(output, target).item(), input.size(0))
            top1.update(acc1.item(), input.size(0))
            top5.update(acc5.item(), input.size(0))
    _logger.info(f"Test: Loss: {losses.avg:.4f}  Acc@1: {top1.avg:.2f}  Acc@5: {top5.avg:.2f}")
    return {"loss": losses.avg, "top1": top1.avg, "top5": top5.avg}


if __name__ == "__main__":
    main()
