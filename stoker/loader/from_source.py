"""``stoker.loader_for``: a Loader from whatever a training script has, packing it once.

    loader_for("/data/train", transform, 256)          a folder of loose images: packed once into
                                                       ~/.cache/stoker/packs/<hash>, then read
    loader_for(ImageFolder("/data/train", transform))  the same folder, and its transform
    loader_for(hf["train"], transform, 256)            a Hugging Face Dataset, a DataFrame, an Arrow
                                                       Table, a map-style Dataset: packed once, by identity
    loader_for("/fast/train-shards", transform, 256)   a packed stoker data set (a folder or a URL)

A source that is not packed yet goes through the pack cache (stoker/pack/cache.py): packed once,
reused while it is what the pack was made from. This module takes what a training script has,
finds the source and the transform in it, and makes the Loader.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix
from stoker.errors import OptionError
from stoker.format.layout import MANIFEST_NAME
from stoker.loader.arguments import check_transform
from stoker.loader.loader import Loader
from stoker.sources.columns import SourceOptions
from stoker.sources.kinds import PACK_TAKES, not_a_source, refusal, table_kind
from stoker.storage.remote import is_url

LOADER_FOR_TAKES = f"a packed stoker data set (a folder or URL), a ShardDataset, a Mix, or what stoker.pack takes: {PACK_TAKES}"


def loader_for(source: str | os.PathLike | Any, transform: Any = None, batch_size: int = 256, *,
               split: str | None = None, image_column: str | None = None, label_column: str | None = None,
               unlabelled: bool = False, pack_dir: str | os.PathLike | None = None,
               pack_options: dict[str, Any] | None = None, progress: bool = True, **loader_options: Any) -> Loader:
    """A :class:`stoker.Loader` over ``source`` with ``transform`` (a torchvision pipeline or any
    callable; see Loader). ``source`` is a packed stoker data set (a folder or URL), a ShardDataset
    or a :class:`stoker.Mix`, read as it is; or anything :func:`stoker.pack` takes (a folder of
    images, a path list, Parquet or tar files, a Hugging Face Dataset, DatasetDict or save_to_disk
    folder, a pandas DataFrame, a pyarrow Table, a map-style Dataset), packed once into ``pack_dir``
    (default: a folder of its own under ``~/.cache/stoker/packs``) with ``pack_options`` for
    :func:`stoker.pack`, and reused while it is what the pack was made from (see
    stoker/pack/cache.py). ``split``, ``image_column``, ``label_column`` and ``unlabelled`` say what
    to pack, as for :func:`stoker.pack`. A Dataset's own ``transform`` (torchvision's datasets, timm's
    ImageDataset, an ImageFolder's) is taken off before packing and run by the Loader, unless one
    is given here. ``loader_options`` go to the Loader (``device``, ``threads``, ``seed``, ...).
    Anything else is refused (OptionError) in one line naming what is taken."""
    check_transform(transform)  # before anything is packed
    described = SourceOptions(image_column, label_column, unlabelled, split).given()
    if overlap := set(described) & set(pack_options or {}):
        raise OptionError(f"pack_options holds {', '.join(sorted(overlap))}: give them to loader_for itself")
    options = {**(pack_options or {}), **described}
    folder = None
    if type(source).__name__ in ("ImageFolder", "DatasetFolder") and hasattr(source, "root"):
        folder, transform = source, _transform_of(source, transform)
        source = source.root
    elif isinstance(source, torch.utils.data.Dataset) and getattr(source, "transform", None) is not None:
        transform, source = _transform_of(source, transform), _without_transform(source)
    dataset: ShardDataset | Mix
    if isinstance(source, (ShardDataset, Mix)) or (isinstance(source, (str, os.PathLike)) and _is_packed(source)):
        if described:
            raise OptionError(f"{', '.join(f'{k}={v!r}' for k, v in described.items())}: these say what to pack; "
                              f"{getattr(source, 'root', source)} is packed already")
        dataset = source if isinstance(source, (ShardDataset, Mix)) else ShardDataset(source)
    else:
        dataset = ShardDataset(_packed(source, pack_dir, options, progress))
    if folder is not None:
        assert isinstance(dataset, ShardDataset)  # packed from the folder
        _check_same_samples(folder, dataset)
    return Loader(dataset, batch_size, transform=transform, **loader_options)


def _is_packed(source: str | os.PathLike) -> bool:
    return is_url(source) or (Path(source) / MANIFEST_NAME).exists()


def _packed(source: Any, pack_dir: str | os.PathLike | None, options: dict[str, Any], progress: bool) -> Path:
    """Where the pack cache holds ``source`` (a path, or a Dataset or table), packed there first where
    it is not yet; anything else is refused. The pack cache is imported only here: a packed data set
    needs none of it."""
    if isinstance(source, (str, os.PathLike)):
        from stoker.pack.cache import pack_once

        return pack_once(Path(source), pack_dir, options, progress)
    if (why := not_a_source(source)) is not None:
        raise OptionError(refusal("stoker.loader_for", why, LOADER_FOR_TAKES))
    _refuse_own_format(source)
    from stoker.pack.cache import pack_object

    return pack_object(source, pack_dir, options, progress)


def _transform_of(dataset: Any, transform: Any) -> Any:
    """The transform to use for a Dataset that has one of its own (an ImageFolder, torchvision's
    and timm's datasets): the one given, else the Dataset's."""
    if getattr(dataset, "target_transform", None) is not None:
        raise OptionError(f"{type(dataset).__name__}(target_transform=...) is not carried over: labels come from the "
                          "pack as the Dataset gives them; apply it to the labels in the training loop")
    if transform is not None and dataset.transform is not None and transform is not dataset.transform:
        raise OptionError(f"two transforms given: the {type(dataset).__name__}'s and loader_for(transform=...); "
                          "give one of them")
    return transform if transform is not None else dataset.transform


def _without_transform(dataset: Any) -> Any:
    """A shallow copy of ``dataset`` whose items are not transformed: what is packed is the stored
    image, and the Loader runs the transform on every read (a random one differs each epoch)."""
    bare = copy.copy(dataset)
    bare.transform = None
    if getattr(bare, "transforms", None) is not None:  # torchvision's VisionDataset: transform and target_transform
        bare.transforms = None
    return bare


def _refuse_own_format(source: Any) -> None:
    """A Hugging Face Dataset with a transform of its own (set_transform, with_transform) is refused:
    the pack reads the stored images, so the transform would be left out silently."""
    splits = source.values() if table_kind(source) == "hf_dataset_dict" else [source]
    if table_kind(source) in ("hf_dataset", "hf_dataset_dict") and any(s.format["type"] == "custom" for s in splits):
        raise OptionError("stoker.loader_for got a Hugging Face Dataset with a transform of its own (set_transform / "
                          "with_transform), which would not run: give the per-image transform as "
                          "loader_for(dataset, transform=T) (T gets a PIL image) and the Dataset without its own "
                          "(dataset.reset_format())")


def _check_same_samples(folder: Any, dataset: ShardDataset) -> None:
    """The pack holds what the ImageFolder lists, or the difference is named."""
    if list(folder.classes) != list(dataset.classes):
        raise OptionError(f"{folder.root}: the ImageFolder's classes {list(folder.classes)[:5]}... differ from the "
                         f"pack's {list(dataset.classes)[:5]}...")
    if len(folder) != len(dataset):
        raise OptionError(f"{folder.root}: the ImageFolder lists {len(folder)} images, the pack holds {len(dataset)} "
                         "(files it could not read are in rejected.tsv of the pack; a custom is_valid_file or loader "
                         "is not carried over)")
