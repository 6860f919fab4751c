"""``stoker.loader_for``: a Loader from whatever a training script has, packing loose images once.

    loader_for("/data/train", transform, 256)          a folder of loose images: packed once into
                                                       ~/.cache/stoker/packs/<hash>, then read
    loader_for(ImageFolder("/data/train", transform))  the same folder, and its transform
    loader_for("/fast/train-shards", transform, 256)   a packed stoker data set (a folder or a URL)

The pack is resumable (stoker.pack keeps finished shards), so an interrupted first run continues
where it stopped. A later run lists the folder again and stats every file (no file is read): the
pack is reused while the listing (paths, labels), the pack options and each file's size,
modification and status-change time are what it was made from (stoker/loader/source_stamps.py);
otherwise a warning says what changed and the folder is packed again into the same cache folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix
from stoker.errors import PackMismatchError
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
from stoker.storage.remote import cache_root, is_url

_log = logging.getLogger(__name__)


def loader_for(source: str | os.PathLike | Any, transform: Any = None, batch_size: int = 256, *,
               pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
               progress: bool = True, **loader_options: Any) -> Loader:
    """A :class:`stoker.Loader` over ``source`` with ``transform`` (a torchvision pipeline or any
    callable; see Loader): ``source`` is a folder of loose images (ImageFolder layout; packed first
    into ``pack_dir``, default ``pack_cache_dir(source, pack_options)``, with ``pack_options`` for
    :func:`stoker.pack`), a torchvision ImageFolder (its root, and its transform unless one is
    given here), a packed stoker data set (folder or URL), a ShardDataset or a :class:`stoker.Mix`.
    ``loader_options`` go to the Loader (``device``, ``threads``, ``seed``, ``processes``, ...)."""
    folder = None
    if type(source).__name__ in ("ImageFolder", "DatasetFolder") and hasattr(source, "root"):
        folder, transform = source, _transform_of(source, transform)
        source = source.root
    dataset: ShardDataset | Mix
    if isinstance(source, (ShardDataset, Mix)):
        dataset = source
    elif is_url(source) or (Path(source) / MANIFEST_NAME).exists():
        dataset = ShardDataset(source)
    else:
        dataset = ShardDataset(pack_once(Path(source), pack_dir, pack_options, progress))
    if folder is not None:
        assert isinstance(dataset, ShardDataset)  # packed from the folder
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
    from the same listing and options and no file changed since (size, modification or
    status-change time: see stoker/loader/source_stamps.py), resumed when a pack was interrupted,
    made again (with a warning saying why) when anything differs."""
    from stoker.pack import pack  # only for loose folders: a packed data set needs none of it
    from stoker.pack.destination import pack_lock
    from stoker.sources import open_source

    if not source.is_dir():
        raise FileNotFoundError(f"{source}: not a folder of images nor a packed stoker data set (no {MANIFEST_NAME})")
    dst = Path(pack_dir) if pack_dir is not None else pack_cache_dir(source, pack_options)
    options = {"progress": progress, **(pack_options or {})}
    # listed as pack() lists it, and stat'ed before anything is read: a file written after its stat
    # differs from its stamp the next time, whether the pack read it before or after the write
    files = listed_files(open_source(source, videos=options.get("video_mode") is not None,
                                     extensions=options.get("extensions")))
    stamps = stamp_files(files)
    dst.mkdir(parents=True, exist_ok=True)
    with pack_lock(dst):  # not while another process packs into dst
        _forget_what_changed(source, dst, stamps, files)
    if progress and not (dst / MANIFEST_NAME).exists():
        print(f"stoker: packing {source} into {dst} (once; an interrupted pack resumes)", file=sys.stderr, flush=True)
    try:
        result = pack(source, dst, **options)
    except PackMismatchError:  # made with other options into this pack_dir
        _log.warning("%s holds a pack of %s made with other options: packing it again", dst, source)
        (dst / MANIFEST_NAME).unlink(missing_ok=True)  # the old shards are removed as leftovers of another plan
        result = pack(source, dst, **options)
    if result.rejected:
        _log.warning("%d files of %s were not packed (see %s/rejected.tsv)", len(result.rejected), source, dst)
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
