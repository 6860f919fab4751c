"""stoker: keep the GPU fed. Pack image data sets into sequential shards and read them fast.

    stoker pack SRC DST  ──>  DST/stoker.json + shard-*.tar + shard-*.idx
    ShardDataset(DST)    ──>  (image, label) items for torch.utils.data.DataLoader
    QuasiRandomSampler   ──>  a shuffle that reads each block of a shard once, in one piece
    Mix({name: ds}, w)   ──>  several data sets as one, each batch stratified to the weights
    Loader(dataset, B)   ──>  (images, labels) batches decoded and cropped by threads
    loader_for(PATH, T)  ──>  a Loader from a folder (packed once), an ImageFolder and its torchvision transform
    doctor(PATH)         ──>  where input time goes (storage, decode, transform, loader) and what to do
    watch(loader)        ──>  per-step data wait against step time, inside a training loop
    echo(loader)         ──>  batches from data already in memory while the input pipeline lags
    pack_spark(df, DST)  ──>  shards from a Spark DataFrame, one per partition, each written by its executor
    ShardDatasink(DST)   ──>  shards from a Ray Dataset: ds.write_datasink(ShardDatasink(DST))
    ShardDatasource(DST) ──>  a data set as Ray Data rows, for Ray Train: ray.data.read_datasource(...)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

from stoker.version import __version__

# Public names and the modules that define them, imported on first use: `stoker pack`, its worker
# processes and Ray tasks never need torch, whose import alone takes ~1.7 s here.
_EXPORTS = {
    "ShardDataset": "stoker.data.dataset",
    "QuasiRandomSampler": "stoker.data.sampler",
    "Mix": "stoker.data.mix",
    "DoctorReport": "stoker.doctor",
    "doctor": "stoker.doctor",
    "watch": "stoker.watch",  # its own module: wrapping a DataLoader imports neither the doctor nor the decoder
    "EchoStats": "stoker.echo",
    "echo": "stoker.echo",
    "CorruptDataError": "stoker.errors",
    "FormatError": "stoker.errors",
    "OptionError": "stoker.errors",
    "PackError": "stoker.errors",
    "StokerError": "stoker.errors",
    "CropSpec": "stoker.loader",
    "Loader": "stoker.loader",
    "loader_for": "stoker.loader",
    "PackResult": "stoker.pack",
    "pack": "stoker.pack",
    "pack_spark": "stoker.pack.spark_writer",  # pyspark, the `spark` extra
    "ShardDatasink": "stoker.pack.ray_datasink",  # Ray Data, the `ray-data` extra
    "ShardDatasource": "stoker.data.ray_datasource",
    "VideoClipDataset": "stoker.video",  # PyAV, the `video` extra
}

if TYPE_CHECKING:
    from stoker.data.dataset import ShardDataset
    from stoker.data.mix import Mix
    from stoker.data.ray_datasource import ShardDatasource
    from stoker.data.sampler import QuasiRandomSampler
    from stoker.doctor import DoctorReport, doctor
    from stoker.echo import EchoStats, echo
    from stoker.errors import CorruptDataError, FormatError, OptionError, PackError, StokerError
    from stoker.loader import CropSpec, Loader, loader_for
    from stoker.pack import PackResult, pack
    from stoker.pack.ray_datasink import ShardDatasink
    from stoker.pack.spark_writer import pack_spark
    from stoker.video import VideoClipDataset
    from stoker.watch import watch


def __getattr__(name: str):
    """Import a public name's module when the name is first used; ``stoker.errors`` and the other
    subpackages work as attributes, as they did when everything was imported at once."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Stoker(types.ModuleType):
    """``stoker.pack``, ``stoker.doctor``, ``stoker.echo`` and ``stoker.watch`` are functions named like
    the package or module that defines them, and importing it (``import stoker.doctor.run``,
    ``import stoker.watch``) sets the attribute to the module: the function is returned all the same."""

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if name in ("pack", "doctor", "echo", "watch") and isinstance(value, types.ModuleType):
            return getattr(value, name)
        return value


sys.modules[__name__].__class__ = _Stoker


__all__ = [
    "CorruptDataError",
    "CropSpec",
    "DoctorReport",
    "EchoStats",
    "FormatError",
    "Loader",
    "Mix",
    "OptionError",
    "PackError",
    "PackResult",
    "QuasiRandomSampler",
    "ShardDataset",
    "ShardDatasink",
    "ShardDatasource",
    "StokerError",
    "VideoClipDataset",
    "__version__",
    "doctor",
    "echo",
    "loader_for",
    "pack",
    "pack_spark",
    "watch",
]
