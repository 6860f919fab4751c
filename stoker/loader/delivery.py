"""A made batch as the training loop gets it, in the loop's process, as the plan says: an NCHW view
of its NHWC memory (torch.channels_last), on the plan's device (through pinned memory), augmented
there with stoker.augment's torch ops where the plan puts the batched ops on the device."""

from __future__ import annotations

import torch

from stoker.augment.pipeline import Augment
from stoker.loader.plan import LoaderPlan


def deliver(plan: LoaderPlan, images: torch.Tensor, labels: torch.Tensor, seed: int,
            step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of a batch as ``plan`` delivers them; ``step``: the batch's draw of the
    augmentation's parameters (:meth:`BatchMaker.augment_step`), from ``seed``."""
    steps, device = plan.transform, plan.device
    if (plan.layout == "NCHW" or steps.stage == "float") and not steps.per_sample:
        images = images.movedim(-1, -3)  # NCHW view of NHWC memory: torch.channels_last (per frame of a clip)
    if device is not None and device.type != "cpu":
        if images.device.type == "cpu":  # not decoded on the GPU already (decode="gpu")
            images = images.pin_memory().to(device, non_blocking=True)
        labels = labels.pin_memory().to(device, non_blocking=True)
    if plan.augment == "device":
        dtype = torch.float32 if steps.stage == "uint8" else steps.dtype
        images = Augment(*steps.ops, seed=seed, device=device, dtype=dtype, backend="torch", layout="NCHW")(images,
                                                                                                           step=step)
        if steps.stage == "uint8":  # the pipeline's batches are uint8: rounded back
            images = images.mul_(255).round_().to(torch.uint8)
    return images, labels
