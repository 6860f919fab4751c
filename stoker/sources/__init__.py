"""What can be packed or read as loose files, listed into plain arrays before anything is read.

    listing.py   Source (refs, keys, labels, classes), extensions, key and label rules
    files.py     ImageFolder trees and CSV/TSV path lists
    archives.py  Parquet (Hugging Face layout), WebDataset tar shards, map-style Datasets
    inputs.py    Inputs: how a job reads the bytes behind each ref (files, row groups, tar members, items)

Used by packing (stoker/pack) and by the loose-file baseline (stoker/data/folder.py); imports neither.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stoker.errors import PackError
from stoker.sources import archives
from stoker.sources.files import list_image_folder, read_path_list
from stoker.sources.inputs import BadInput
from stoker.sources.listing import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Source

__all__ = ["IMAGE_EXTENSIONS", "VIDEO_EXTENSIONS", "BadInput", "Source", "list_image_folder", "open_source",
           "read_path_list"]


def open_source(src: Any, videos: bool = False) -> Source:
    """List ``src``: a folder of class folders is read as ImageFolder (of video files with
    ``videos``), a ``.csv``/``.tsv``/``.txt`` file as a path list, ``.parquet`` files (or a folder
    of them) and ``.tar`` files (or a folder of them) as archives of images, and any object with
    ``__getitem__`` and ``__len__`` as a map-style Dataset."""
    if not isinstance(src, (str, os.PathLike)):
        if videos:
            raise PackError("a Dataset source holds images; pack videos from files")
        return archives.list_dataset(src)
    src = Path(src).resolve()  # the plan's digest must not depend on how the path was spelled
    found = archives.archives_in(src)
    if found and videos:
        raise PackError(f"{src}: Parquet and tar sources hold images; pack videos from files")
    if found:
        return archives.list_archives(src, found)
    if src.is_dir():
        return list_image_folder(src, VIDEO_EXTENSIONS if videos else IMAGE_EXTENSIONS)
    if src.is_file():
        return read_path_list(src, videos)
    raise PackError(f"{src}: no such folder or list file")
