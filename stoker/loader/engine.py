"""The batch engine a plan calls for: the plan's decisions (plan.py) as the strategies that
BatchMaker (batches.py) is given, for one pass.

    plan.clips       Clips (clips.py)            else Images (images.py)
    plan.decode      native: NativeChunk (native_chunk.py), python: PerImage (batches.py),
                     gpu: GpuDecode (gpu_decode.py)
    plan.augment     native: NativeAugment, opencv: OpenCvAugment (thread_augment.py); none and
                     device: none in the engine (device: delivery.py)
    the transform's per-sample rest   PerSample (torchvision_plan.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from stoker.data.dataset import ShardDataset
from stoker.data.epoch import RankBatches
from stoker.data.mix import Mix
from stoker.loader.batches import Augmentation, BatchMaker, Decode, OnError, PerImage, Samples
from stoker.loader.images import Images
from stoker.loader.native_chunk import NativeChunk
from stoker.loader.plan import LoaderPlan
from stoker.loader.thread_augment import NativeAugment, OpenCvAugment
from stoker.transforms.torchvision_plan import PerSample

if TYPE_CHECKING:
    from stoker.video.dataset import VideoClipDataset


def engine_for(plan: LoaderPlan, dataset: ShardDataset | Mix | VideoClipDataset, seed: int, batches: RankBatches,
               on_error: OnError) -> BatchMaker:
    """The engine of a pass over ``dataset`` as ``plan`` says, its draws keyed by ``seed`` and by
    where ``batches`` puts each batch in the epoch."""
    steps = plan.transform
    samples: Samples
    if plan.clips:
        from stoker.loader.clips import Clips  # PyAV only for video data sets

        assert not isinstance(dataset, ShardDataset)  # the plan's clips: a VideoClipDataset or a Mix of them
        samples = Clips(dataset)
    else:
        assert isinstance(dataset, (ShardDataset, Mix))
        samples = Images(dataset)
    decode: Decode = PerImage()
    if plan.decode == "gpu":
        from stoker.loader.gpu_decode import GpuDecode  # torchvision only for decode="gpu"

        assert isinstance(dataset, ShardDataset) and plan.device is not None  # the plan refused the rest
        decode = GpuDecode(dataset, plan.device)
    elif plan.decode == "native":
        assert isinstance(dataset, (ShardDataset, Mix))
        decode = NativeChunk(dataset)
    augment: Augmentation | None = None
    if plan.augment in ("native", "opencv"):
        per_image = OpenCvAugment(steps.ops, seed, torch.uint8 if steps.stage == "uint8" else steps.dtype)
        augment = NativeAugment(per_image) if plan.augment == "native" else per_image
    transform = PerSample(steps.per_sample, steps.given) if steps.per_sample else None
    return BatchMaker(samples, decode, steps.crop, seed, batches, on_error, augment, transform)
