"""``stoker.loader_for``: a Loader from whatever a training script has, packing loose images once.

    loader_for("/data/train", transform, 256)          a folder of loose images: packed once into
                                                       ~/.cache/stoker/packs/<hash>, then read
    loader_for(ImageFolder("/data/train", transform))  the same folder, and its transform
    loader_for("/fast/train-shards", transform, 256)   a packed stoker data set (a folder or a URL)

The pack is resumable (stoker.pack keeps finished shards), so an interrupted first run continues
where it stopped; a later run lists the folder again and reuses the pack while the listing (paths,
labels) and the pack options are the same, or repacks into the same cache folder when they differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from stoker.data.dataset import ShardDataset
from stoker.errors import PackError
from stoker.format.layout import MANIFEST_NAME
from stoker.loader.loader import Loader
from stoker.storage.remote import cache_root, is_url

_log = logging.getLogger(__name__)


def loader_for(source: str | os.PathLike | Any, transform: Any = None, batch_size: int = 256, *,
               pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
               progress: bool = True, **loader_options: Any) -> Loader:
    """A :class:`stoker.Loader` over ``source`` with ``transform`` (a torchvision pipeline or any
    callable; see Loader): ``source`` is a folder of loose images (ImageFolder layout; packed first
    into ``pack_dir``, default ``pack_cache_dir(source, pack_options)``, with ``pack_options`` for
    :func:`stoker.pack`), a torchvision ImageFolder (its root, and its transform unless one is
    given here), a packed stoker data set (folder or URL) or a ShardDataset. ``loader_options``
    go to the Loader (``device``, ``threads``, ``seed``, ``processes``, ...)."""
    folder = None
    if type(source).__name__ in ("ImageFolder", "DatasetFolder") and hasattr(source, "root"):
        folder, transform = source, _transform_of(source, transform)
        source = source.root
    if isinstance(source, ShardDataset):
        dataset = source
    elif is_url(source) or (Path(source) / MANIFEST_NAME).exists():
        dataset = ShardDataset(source)
    else:
        dataset = ShardDataset(pack_once(Path(source), pack_dir, pack_options, progress))
    if folder is not None:
        _check_same_samples(folder, dataset)
    return Loader(dataset, batch_size, transform=transform, **loader_options)


def pack_cache_dir(source: str | os.PathLike, pack_options: dict[str, Any] | None = None) -> Path:
    """Where :func:`loader_for` packs ``source``: ``$XDG_CACHE_HOME/stoker/packs/<hash>`` (else
    ``~/.cache/...``), the hash of the resolved path and the options, so each folder and set of
    options gets a pack of its own."""
    key = json.dumps([str(Path(source).resolve()), pack_options or {}], sort_keys=True, default=str)
    return cache_root() / "packs" / hashlib.sha256(key.encode()).hexdigest()[:16]


def pack_once(source: Path, pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
              progress: bool = True) -> Path:
    """``source`` packed into ``pack_dir`` (default :func:`pack_cache_dir`): reused when it was made
    from the same listing and options, resumed when a pack was interrupted, made again when the
    folder changed since."""
    from stoker.pack import pack  # only for loose folders: a packed data set needs none of it

    if not source.is_dir():
        raise FileNotFoundError(f"{source}: not a folder of images nor a packed stoker data set (no {MANIFEST_NAME})")
    dst = Path(pack_dir) if pack_dir is not None else pack_cache_dir(source, pack_options)
    options = {"progress": progress, **(pack_options or {})}
    if progress and not (dst / MANIFEST_NAME).exists():
        print(f"stoker: packing {source} into {dst} (once; an interrupted pack resumes)", file=sys.stderr, flush=True)
    try:
        result = pack(source, dst, **options)
    except PackError as e:
        if not (dst / MANIFEST_NAME).exists() or "other input or options" not in str(e):
            raise
        _log.warning("%s changed since it was packed into %s: packing it again", source, dst)
        (dst / MANIFEST_NAME).unlink()  # the old shards are removed as leftovers of another plan
        result = pack(source, dst, **options)
    if result.rejected:
        _log.warning("%d files of %s were not packed (see %s/rejected.tsv)", len(result.rejected), source, dst)
    return dst


def _transform_of(folder: Any, transform: Any) -> Any:
    """The transform to use for a torchvision ImageFolder: the one given, else the folder's own."""
    if getattr(folder, "target_transform", None) is not None:
        raise ValueError("ImageFolder(target_transform=...) is not carried over: labels come from the pack as "
                         "ImageFolder numbers them; apply it to the labels in the training loop")
    if transform is not None and folder.transform is not None and transform is not folder.transform:
        raise ValueError("two transforms given: the ImageFolder's and loader_for(transform=...); give one of them")
    return transform if transform is not None else folder.transform


def _check_same_samples(folder: Any, dataset: ShardDataset) -> None:
    """The pack holds what the ImageFolder lists, or the difference is named."""
    if list(folder.classes) != list(dataset.classes):
        raise ValueError(f"{folder.root}: the ImageFolder's classes {list(folder.classes)[:5]}... differ from the "
                         f"pack's {list(dataset.classes)[:5]}...")
    if len(folder) != len(dataset):
        raise ValueError(f"{folder.root}: the ImageFolder lists {len(folder)} images, the pack holds {len(dataset)} "
                         "(files it could not read are in rejected.tsv of the pack; a custom is_valid_file or loader "
                         "is not carried over)")
