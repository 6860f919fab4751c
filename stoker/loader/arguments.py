"""What stoker.Loader takes, checked before any work: the data set (a ShardDataset, a Mix or a
VideoClipDataset; anything else is refused in one line that points to stoker.loader_for), the
device, what ``decode="gpu"`` needs, and what becomes of ``transform``. Each numeric or
one-of-a-few option is checked through stoker/ranges.py where the Loader takes it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix, is_clip_set
from stoker.errors import OptionError
from stoker.loader.batches import BatchMaker, SampleTransform
from stoker.loader.crops import CropSpec
from stoker.loader.torchvision_plan import Step, TransformPlan, plan


def maker_type(dataset: Any) -> type[BatchMaker]:
    """What makes the batches of ``dataset``: images (a ShardDataset, a Mix of them), or video clips
    (a VideoClipDataset, a Mix of them). Anything else: OptionError saying what the Loader reads."""
    if isinstance(dataset, ShardDataset) or (isinstance(dataset, Mix) and not dataset.clips):
        return BatchMaker
    if not isinstance(dataset, Mix) and not is_clip_set(dataset):
        raise OptionError(_refusal(dataset))
    from stoker.loader.clips import ClipBatchMaker  # PyAV only for video data sets

    return ClipBatchMaker


def _refusal(dataset: Any) -> str:
    """One line: what the Loader was given, what it reads, and where the rest goes."""
    kind = type(dataset)
    given = f"a {kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else f"a {kind.__name__}"
    if isinstance(dataset, (str, os.PathLike)):
        how = (f"stoker.Loader(stoker.ShardDataset({os.fspath(dataset)!r}), ...) reads a packed data set there, "
               f"stoker.loader_for({os.fspath(dataset)!r}, transform, batch_size) a folder of images too")
    else:
        source = "its .dataset" if isinstance(dataset, torch.utils.data.DataLoader) else "it"
        how = f"stoker.loader_for({source}, transform, batch_size) takes what else it can, packed once"
    return (f"stoker.Loader reads a stoker.ShardDataset, a stoker.Mix or a stoker.VideoClipDataset, "
            f"got {given}: {how}")


def device_of(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a torch.device (None: the batches stay where they are made); OptionError for
    what torch does not take as one, or a CUDA device where there is none."""
    if device is None:
        return None
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionError(f"device={device!r}: must be a torch.device or a device string such as 'cpu', 'cuda' "
                          "or 'cuda:1'") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device={device!r}: no CUDA device here (torch.cuda.is_available() is False); "
                          "leave device=None to keep the batches in memory")
    return found


def check_crop(crop: Any) -> CropSpec | None:
    """``crop`` when it is a CropSpec or None; else OptionError."""
    if crop is not None and not isinstance(crop, CropSpec):
        raise OptionError(f"crop={crop!r}: must be a stoker.CropSpec or None (a torchvision pipeline goes to "
                          "transform=)")
    return crop


def plan_transform(maker_type: type[BatchMaker], transform: SampleTransform | None,
                   crop: CropSpec | None) -> TransformPlan:
    """What becomes of ``transform``: a torchvision pipeline over images is translated
    (torchvision_plan.py); over video clips, any transform runs per clip as given."""
    if transform is not None and not callable(transform):
        raise OptionError(f"transform={transform!r}: must be callable (a torchvision pipeline or a function of "
                          "one sample) or None")
    if maker_type is BatchMaker:
        return plan(transform, crop)
    if transform is None:
        return TransformPlan(crop or CropSpec())
    steps = (Step(repr(transform), "per sample", "video clips: run as given on each (T, 3, H, W) uint8 clip"),)
    return TransformPlan(crop or CropSpec(), per_sample=(transform,), steps=steps)


def gpu_for_decoding(maker_type: type[BatchMaker], steps: TransformPlan, processes: int,
                     device: torch.device | None) -> torch.device:
    """The CUDA device that decodes with decode="gpu", or why there is none."""
    from stoker.augment.device import default_device

    if maker_type is not BatchMaker:
        raise OptionError("decode='gpu' decodes images; video clips are decoded on the CPU")
    if steps.per_sample or steps.crop is None or processes:
        raise OptionError("decode='gpu' makes batches on the GPU: no per-sample transform or worker processes "
                          "(augment the batch there with stoker.augment)")
    device = device or default_device()
    if device.type != "cuda" or not torch.cuda.is_available():
        raise OptionError(f"decode='gpu' needs a CUDA device, got {device} (no GPU here? decode='cpu' decodes with "
                          "threads)")
    return device

