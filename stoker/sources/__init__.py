"""What can be packed or read as loose files, listed into plain arrays before anything is read.

    listing.py   Source (refs, keys, labels, classes), extensions, key and label rules
    files.py     ImageFolder trees and CSV/TSV path lists
    archives.py  Parquet (Hugging Face layout), WebDataset tar shards, map-style Datasets
    inputs.py    Inputs: how a job reads the bytes behind each ref (files, row groups, tar members, items)

Used by packing (stoker/pack) and by the loose-file baseline of the benchmarks (stoker/bench/folder.py); imports neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stoker.errors import OptionError, PackError
from stoker.sources import archives
from stoker.sources.files import list_image_folder, read_path_list
from stoker.sources.inputs import BadInput, file_kind
from stoker.sources.listing import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Source, choose_extensions

__all__ = ["IMAGE_EXTENSIONS", "VIDEO_EXTENSIONS", "BadInput", "Source", "list_image_folder", "open_source",
           "read_path_list"]


def open_source(src: Any, videos: bool = False, extensions: str | Iterable[str] | None = None) -> Source:
    """List ``src``: a folder of class folders is read as ImageFolder (of video files with
    ``videos``), a ``.csv``/``.tsv``/``.txt`` file as a path list, ``.parquet`` files (or a folder
    of them) and ``.tar`` files (or a folder of them) as archives of images, and any object with
    ``__getitem__`` and ``__len__`` as a map-style Dataset. ``extensions`` (see
    :func:`choose_extensions`) picks the files of a folder and the image members of tar files;
    the other sources are refused with it, since they pack every input they hold."""
    chosen = choose_extensions(extensions, VIDEO_EXTENSIONS if videos else IMAGE_EXTENSIONS)
    if not isinstance(src, (str, os.PathLike)):
        if videos:
            raise PackError("a Dataset source holds images; pack videos from files")
        _refuse_extensions(extensions, "a Dataset")
        return archives.list_dataset(src)
    src = Path(src).resolve()  # the plan's digest must not depend on how the path was spelled
    found = archives.archives_in(src, chosen)
    if found and videos:
        raise PackError(f"{src}: Parquet and tar sources hold images; pack videos from files")
    if found:
        if found[0].suffix.lower() == ".parquet":
            _refuse_extensions(extensions, "Parquet files")
        return archives.list_archives(src, found, chosen)
    if src.is_dir():
        return list_image_folder(src, chosen, videos)
    if src.is_file() and src.suffix.lower() in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS:
        raise PackError(f"{src}: a single {'video' if videos else 'image'} file; SRC is a folder of class folders "
                        "(SRC/<class>/<files>) or a CSV/TSV list of path,label rows")
    if src.is_file():
        _refuse_extensions(extensions, "a path list")
        return read_path_list(src, videos)
    if os.path.lexists(src):
        raise PackError(f"{src}: not a folder or a list file but {file_kind(src)}")
    raise PackError(f"{src}: no such folder or list file")


def _refuse_extensions(extensions: Any, source: str) -> None:
    if extensions is not None:
        raise OptionError(f"extensions={extensions!r} (--extensions) applies to folders of class folders and to "
                          f"tar shards; {source} is packed whole")
