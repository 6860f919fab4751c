"""The pack cache of ``stoker.loader_for``: a source packed once into ~/.cache/stoker/packs/<hash>,
then reused.

The pack is resumable (stoker.pack keeps finished shards), so an interrupted first run continues
where it stopped. A source at a path is listed again by a later run, and every file it reads is
stat'ed (no file is read): the pack is reused while the listing (paths, labels), the pack options
and each file's size, modification and status-change time are what it was made from
(source_stamps.py); otherwise a warning says what changed and it is packed again into the same
cache folder. A Dataset or table held in Python has no files to stat: its pack is kept in a folder
named by its identity (type, length, labels, the bytes of 16 items spread over it, a Hugging Face
Dataset's fingerprint) and the options, so other content gets a pack of its own; a change that
leaves all of these as they were is not seen.
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

from stoker.errors import PackMismatchError
from stoker.format.layout import MANIFEST_NAME, WORK_DIR_NAME
from stoker.pack.destination import pack_lock
from stoker.pack.packer import pack
from stoker.pack.source_stamps import (
    FileStamps,
    compare,
    listed_files,
    load_stamps,
    same,
    save_stamps,
    stamp_files,
    stamps_path,
)
from stoker.sources import open_source
from stoker.sources.columns import SourceOptions
from stoker.sources.listing import Source
from stoker.storage.remote import cache_root

_SOURCE_OPTIONS = ("image_column", "label_column", "unlabelled", "split")

_log = logging.getLogger(__name__)


def pack_cache_dir(source: str | os.PathLike, pack_options: dict[str, Any] | None = None) -> Path:
    """Where :func:`pack_once` packs the source at path ``source``: ``$XDG_CACHE_HOME/stoker/packs/<hash>``
    (else ``~/.cache/...``), the hash of the resolved path and the options, so each source and set
    of options gets a pack of its own."""
    return _cache_dir([str(Path(source).resolve()), pack_options or {}])


def _cache_dir(key: Any) -> Path:
    text = json.dumps(key, sort_keys=True, default=str)
    return cache_root() / "packs" / hashlib.sha256(text.encode()).hexdigest()[:16]


def _listing(source: Any, options: dict[str, Any]) -> Source:
    """``source`` listed as :func:`stoker.pack` lists it with ``options``."""
    chosen = SourceOptions(**{name: options[name] for name in _SOURCE_OPTIONS if name in options})
    return open_source(source, videos=options.get("video_mode") is not None, extensions=options.get("extensions"),
                       options=chosen)


def pack_once(source: Path, pack_dir: str | os.PathLike | None = None, pack_options: dict[str, Any] | None = None,
              progress: bool = True) -> Path:
    """The source at path ``source`` packed into ``pack_dir`` (default :func:`pack_cache_dir`): reused
    when it was made from the same listing and options and no file changed since (size,
    modification or status-change time: see stoker/pack/source_stamps.py), resumed when a pack
    was interrupted, made again (with a warning saying why) when anything differs."""
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
