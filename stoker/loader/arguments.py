"""What stoker.Loader takes, checked before any work: the data set (a ShardDataset, a Mix or a
VideoClipDataset; anything else is refused in one line that points to stoker.loader_for) and
what its plan needs to know of it, the device, the crop and the transform. Each numeric or
one-of-a-few option is checked through stoker/ranges.py where the Loader takes it; what does not
go together, by the plan (plan.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix, is_clip_set
from stoker.data.readable import fetches_per_process, storage_of
from stoker.decode.crops import CropSpec
from stoker.errors import OptionError
from stoker.loader.plan import Description
from stoker.sources.kinds import described


def describe(dataset: Any) -> Description:
    """What the plan needs of ``dataset``: images (a ShardDataset, a Mix of them), or video clips
    (a VideoClipDataset, a Mix of them). Anything else, or a data set with its own transform:
    OptionError saying what the Loader reads."""
    if isinstance(dataset, Mix):
        clips = dataset.clips
    elif isinstance(dataset, ShardDataset) or is_clip_set(dataset):
        clips = not isinstance(dataset, ShardDataset)
    else:
        raise OptionError(_refusal(dataset))
    if dataset.transform is not None or getattr(dataset, "target_transform", None) is not None:
        raise OptionError("Loader decodes and crops itself and runs per-sample transforms after the crop: "
                          "pass Loader(transform=...) and a data set without transform/target_transform")
    storage = storage_of(dataset)
    return Description(clips, isinstance(dataset, Mix), dataset.layout if clips else None, fetches_per_process(dataset),
                       bool(storage.remotes), storage.reads_in_flight, storage.cached)


def _refusal(dataset: Any) -> str:
    """One line: what the Loader was given, what it reads, and where the rest goes."""
    if isinstance(dataset, (str, os.PathLike)):
        how = (f"stoker.Loader(stoker.ShardDataset({os.fspath(dataset)!r}), ...) reads a packed data set there, "
               f"stoker.loader_for({os.fspath(dataset)!r}, transform, batch_size) a folder of images too")
    else:
        source = "its .dataset" if isinstance(dataset, torch.utils.data.DataLoader) else "it"
        how = f"stoker.loader_for({source}, transform, batch_size) takes what else it can, packed once"
    return (f"stoker.Loader reads a stoker.ShardDataset, a stoker.Mix or a stoker.VideoClipDataset, "
            f"got {described(dataset)}: {how}")


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


def check_transform(transform: Any) -> Any:
    """``transform`` when it is callable or None; else OptionError (an int there was meant as a batch
    size: stoker.loader_for takes the transform second)."""
    if transform is not None and not callable(transform):
        hint = f"; for a batch size, pass batch_size={transform!r}" if isinstance(transform, int) else ""
        raise OptionError(f"transform={transform!r}: must be callable (a torchvision pipeline or a function of "
                          f"one sample) or None{hint}")
    return transform
