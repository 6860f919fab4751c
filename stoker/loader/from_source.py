"""``stoker.loader_for``: a Loader from whatever a training script has, packing it once.

    loader_for("/data/train", transform, 256)          a folder of loose images: packed once into
                                                       ~/.cache/stoker/packs/<hash>, then read
    loader_for(ImageFolder("/data/train", transform))  the same folder, and its transform
    loader_for(hf["train"], transform, 256)            a Hugging Face Dataset, a DataFrame, an Arrow
                                                       Table, a map-style Dataset: packed once, by identity
    loader_for("/fast/train-shards", transform, 256)   a packed stoker data set (a folder or a URL)

The pack is resumable (stoker.pack keeps finished shards), so an interrupted first run continues
where it stopped. A source at a path is listed again by a later run, and every file it reads is
stat'ed (no file is read): the pack is reused while the listing (paths, labels), the pack options
and each file's size, modification and status-change time are what it was made from
(stoker/loader/source_stamps.py); otherwise a warning says what changed and it is packed again
into the same cache folder. A Dataset or table held in Python has no files to stat: its pack is
kept in a folder named by its identity (type, length, labels, the bytes of 16 items spread over
it, a Hugging Face Dataset's fingerprint) and the options, so other content gets a pack of its
own; a change that leaves all of these as they were is not seen.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch.utils.data

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix
from stoker.errors import OptionError, PackMismatchError
from stoker.format.layout import MANIFEST_NAME, WORK_DIR_NAME
from stoker.loader.loader import Loader
from stoker.loader.source_stamps import (
    FileStamps,
    compare,
    listed_files,
    load_stamps,
    same,
    save_stamps,
    stamp_files,
    stamps_path,
)
from stoker.sources.columns import SourceOptions
from stoker.sources.kinds import PACK_TAKES, not_a_source, refusal, table_kind
from stoker.sources.listing import Source
from stoker.storage.remote import cache_root, is_url

LOADER_FOR_TAKES = f"a packed stoker data set (a folder or URL), a ShardDataset, a Mix, or what stoker.pack takes: {PACK_TAKES}"
_SOURCE_OPTIONS = ("image_column", "label_column", "unlabelled", "split")

_log = logging.getLogger(__name__)


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
    :func:`stoker.pack`, and reused while it is what the pack was made from (see the module's
    docstring). ``split``, ``image_column``, ``label_column`` and ``unlabelled`` say what to pack,
    as for :func:`stoker.pack`. A Dataset's own ``transform`` (torchvision's datasets, timm's
    ImageDataset, an ImageFolder's) is taken off before packing and run by the Loader, unless one
    is given here. ``loader_options`` go to the Loader (``device``, ``threads``, ``seed``, ...).
    Anything else is refused (OptionError) in one line naming what is taken."""
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
    elif isinstance(source, (str, os.PathLike)):
        dataset = ShardDataset(pack_once(Path(source), pack_dir, options, progress))
    else:
        if (why := not_a_source(source)) is not None:
            raise OptionError(refusal("stoker.loader_for", why, LOADER_FOR_TAKES))
        _refuse_own_format(source)
        dataset = ShardDataset(pack_object(source, pack_dir, options, progress))
    if folder is not None:
        assert isinstance(dataset, ShardDataset)  # packed from the folder
        _check_same_samples(folder, dataset)
    return Loader(dataset, batch_size, transform=transform, **loader_options)


def _is_packed(source: str | os.PathLike) -> bool:
    return is_url(source) or (Path(source) / MANIFEST_NAME).exists()


def pack_cache_dir(source: str | os.PathLike, pack_options: dict[str, Any] | None = None) -> Path:
    """Where :func:`loader_for` packs the source at path ``source``: ``$XDG_CACHE_HOME/stoker/packs/<hash>``
    (else ``~/.cache/...``), the hash of the resolved path and the options, so each source and set
    of options gets a pack of its own."""
    return _cache_dir([str(Path(source).resolve()), pack_options or {}])


def _cache_dir(key: Any) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return cache_root() / "packs" / hashlib.sha256(text.encode()).hexdigest()[:16]


def _listing(source: Any, options: dict[str, Any]) -> Source:
    """``source`` listed as :func:`stoker.pack` lists it with ``options``."""
    from stoker.sources import open_source  # only for what is packed: a packed data set needs none of it

    chosen = SourceOptions(**{name: options[name] for name in _SOURCE_OPTIONS if name in options})
    return open_source(source, videos=options.get("video_mode") is not None, extensions=options.get("extensions"),
                       options=chosen)


def pack_once(source: Path, pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
              progress: bool = True) -> Path:
    """The source at path ``source`` packed into ``pack_dir`` (default :func:`pack_cache_dir`): reused
    when it was made from the same listing and options and no file changed since (size,
    modification or status-change time: see stoker/loader/source_stamps.py), resumed when a pack
    was interrupted, made again (with a warning saying why) when anything differs."""
    from stoker.pack.destination import pack_lock

    if not os.path.lexists(source) and not any(c in str(source) for c in "*?["):
        raise FileNotFoundError(f"{source}: not a folder of images, a source to pack, nor a packed stoker data set "
                                "(no such file or folder)")
    dst = Path(pack_dir) if pack_dir is not None else pack_cache_dir(source, pack_options)
    options = pack_options or {}
    # listed as pack() lists it, and stat'ed before anything is read: a file written after its stat
    # differs from its stamp the next time, whether the pack read it before or after the write
    files = listed_files(_listing(source, options))
    stamps = stamp_files(files)
    dst.mkdir(parents=True, exist_ok=True)
    with pack_lock(dst):  # not while another process packs into dst
        _forget_what_changed(source, dst, stamps, files)
    return _pack_into(source, str(source), dst, options, progress)


def pack_object(source: Any, pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
                progress: bool = True) -> Path:
    """A Dataset or table packed into ``pack_dir``, by default a cache folder of its own keyed by
    its identity (type, length, labels, the bytes of items spread over it, a Hugging Face Dataset's
    fingerprint; see stoker/sources/listing.py) and the options: reused while that identity holds."""
    options = pack_options or {}
    listed = _listing(source, options)
    dst = Path(pack_dir) if pack_dir is not None else _cache_dir([listed.identity, options])
    return _pack_into(source, str(listed.root), dst, options, progress)


def _pack_into(source: Any, name: str, dst: Path, options: dict[str, Any], progress: bool) -> Path:
    """``source`` (named ``name`` in messages) packed into ``dst``: what is there reused or resumed,
    packed again where it was made from other input or options."""
    from stoker.pack import pack  # only for what is packed: a packed data set needs none of it

    if progress and not (dst / MANIFEST_NAME).exists():
        print(f"stoker: packing {name} into {dst} (once; an interrupted pack resumes)", file=sys.stderr, flush=True)
    options = {"progress": progress, **options}
    try:
        result = pack(source, dst, **options)
    except PackMismatchError:  # made with other options or input into this pack_dir
        _log.warning("%s holds a pack of %s made with other options or input: packing it again", dst, name)
        (dst / MANIFEST_NAME).unlink(missing_ok=True)  # the old shards are removed as leftovers of another plan
        result = pack(source, dst, **options)
    if result.rejected:
        _log.warning("%d inputs of %s were not packed (see %s/rejected.tsv)", len(result.rejected), name, dst)
    return dst


def _forget_what_changed(source: Path, dst: Path, stamps: FileStamps, files: list[str]) -> None:
    """Make the pack in ``dst`` (finished, or interrupted) forget what no longer matches the files
    of ``source``, whose stamps are ``stamps``; save them. A finished pack is packed again; an
    interrupted one keeps its finished shards unless a file changed (when files were only added or
    removed, the pack itself redoes the shards whose plan that changes)."""
    path = stamps_path(dst)
    saved = load_stamps(path)
    finished, started = (dst / MANIFEST_NAME).exists(), (dst / WORK_DIR_NAME).exists()
    if finished or started:
        if saved is None:
            why, stale_shards = "no record of the files it was made from (made by an earlier stoker, or by stoker pack)", True
        else:
            changes = compare(saved, stamps, files)
            why = f"{source} changed since it was packed: {changes.describe(source.resolve())}" if changes else ""
            stale_shards = bool(changes.changed)
        if finished and why:
            _log.warning("not reusing the pack in %s: %s; packing it again", dst, why)
            (dst / MANIFEST_NAME).unlink()  # shards of another plan are removed as leftovers, the rest rewritten
        if started and stale_shards:
            _log.warning("the interrupted pack in %s starts over: %s", dst, why)
            shutil.rmtree(dst / WORK_DIR_NAME)  # its records of finished shards: they may hold the old bytes
    if not same(saved, stamps):
        save_stamps(path, stamps)


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
