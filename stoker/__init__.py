"""stoker: keep the GPU fed. Pack image data sets into sequential shards and read them fast.

    stoker pack SRC DST  ──>  DST/stoker.json + shard-*.tar + shard-*.idx
    ShardDataset(DST)    ──>  (image, label) items for torch.utils.data.DataLoader
    QuasiRandomSampler   ──>  a shuffle that reads each block of a shard once, in one piece
    Loader(dataset, B)   ──>  (images, labels) batches decoded and cropped by threads
    doctor(PATH)         ──>  where input time goes (storage, decode, transform, loader) and what to do
    watch(loader)        ──>  per-step data wait against step time, inside a training loop
    echo(loader)         ──>  batches from data already in memory while the input pipeline lags
"""

from __future__ import annotations

__version__ = "0.1.0"

from stoker.data.dataset import ShardDataset
from stoker.data.sampler import QuasiRandomSampler
from stoker.doctor import DoctorReport, doctor, watch
from stoker.echo import EchoStats, echo
from stoker.errors import CorruptDataError, FormatError, PackError, StokerError
from stoker.loader import CropSpec, Loader
from stoker.pack import PackResult, pack


def __getattr__(name: str):
    """``stoker.VideoClipDataset`` imports PyAV (the ``video`` extra) only when first used."""
    if name == "VideoClipDataset":
        from stoker.video import VideoClipDataset

        return VideoClipDataset
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")


__all__ = [
    "CorruptDataError",
    "CropSpec",
    "DoctorReport",
    "EchoStats",
    "FormatError",
    "Loader",
    "PackError",
    "PackResult",
    "QuasiRandomSampler",
    "ShardDataset",
    "StokerError",
    "VideoClipDataset",
    "__version__",
    "doctor",
    "echo",
    "pack",
    "watch",
]
