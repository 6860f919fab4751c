"""What can be packed or read as loose files, listed into plain arrays before anything is read.

    listing.py   Source (refs, keys, labels, classes), extensions, key and label rules
    columns.py   SourceOptions (image and label columns, unlabelled, split); a table's columns and labels
    kinds.py     which kind of Python object a source is; the one-line refusal of what is not one
    files.py     ImageFolder trees and CSV/TSV path lists
    archives.py  Parquet files and WebDataset tar shards
    tables.py    DataFrames, Arrow Tables, Hugging Face Datasets (DatasetDict splits, save_to_disk folders)
    items.py     map-style Datasets: their items, read by __getitem__
    inputs.py    Inputs: how a job reads the bytes behind each ref (files, tar members); rows.py: rows of tables

Used by packing (stoker/pack) and by the loose-file baseline of the benchmarks (stoker/bench/folder.py); imports neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL
from stoker.sources import archives
from stoker.sources.columns import NO_OPTIONS, UNLABELLED_HINT, SourceOptions
from stoker.sources.files import list_image_folder, read_path_list
from stoker.sources.inputs import BadInput, file_kind
from stoker.sources.items import list_dataset
from stoker.sources.kinds import PACK_TAKES, not_a_source, refusal, table_kind
from stoker.sources.listing import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Source, choose_extensions
from stoker.sources.tables import list_table, saved_dataset

__all__ = ["IMAGE_EXTENSIONS", "PACK_TAKES", "VIDEO_EXTENSIONS", "BadInput", "Source", "SourceOptions",
           "list_image_folder", "not_a_source", "open_source", "read_path_list", "refusal"]


def open_source(src: Any, videos: bool = False, extensions: str | Iterable[str] | None = None,
                options: SourceOptions = NO_OPTIONS) -> Source:
    """List ``src``: a folder of class folders is read as ImageFolder (of video files with
    ``videos``), a ``.csv``/``.tsv``/``.txt`` file as a path list, ``.parquet`` files (or a folder
    of them) and ``.tar`` files (or a folder of them) as archives of images, a Hugging Face
    ``save_to_disk`` folder, DataFrame, Arrow Table or Hugging Face Dataset as a table, and any
    other object with ``__getitem__`` and ``__len__`` as a map-style Dataset. ``extensions`` (see
    :func:`choose_extensions`) picks the files of a folder and the image members of tar files;
    the other sources are refused with it, since they pack every input they hold. ``options``
    name the image and label columns (see SourceOptions). A source where no label was found is
    refused, naming where it looked, unless ``options.unlabelled``."""
    chosen = choose_extensions(extensions, VIDEO_EXTENSIONS if videos else IMAGE_EXTENSIONS)
    if not isinstance(src, (str, os.PathLike)):
        if (why := not_a_source(src)) is not None:
            raise OptionError(refusal("stoker.pack", why, PACK_TAKES))
        if videos:
            raise PackError("a Dataset or table source holds images; pack videos from files")
        _refuse_extensions(extensions, "a Dataset or table")
        return _labelled(list_table(src, options) if table_kind(src) else list_dataset(src, options), options)
    src = Path(src).resolve()  # the plan's digest must not depend on how the path was spelled
    if src.is_dir() and (saved := saved_dataset(src)) is not None:
        if videos:
            raise PackError(f"{src}: a Hugging Face dataset holds images; pack videos from files")
        _refuse_extensions(extensions, "a Hugging Face dataset")
        return _labelled(list_table(saved, options, root=src), options)
    found = archives.archives_in(src, chosen, options.split)
    if found and videos:
        raise PackError(f"{src}: Parquet and tar sources hold images; pack videos from files")
    if found:
        if found[0].suffix.lower() == ".parquet":
            _refuse_extensions(extensions, "Parquet files")
        return _labelled(archives.list_archives(src, found, chosen, options), options)
    if src.is_dir():
        options.refuse_except((), "a folder of class folders (its labels are the folders)")
        return list_image_folder(src, chosen, videos)
    if src.is_file() and src.suffix.lower() in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS:
        raise PackError(f"{src}: a single {'video' if videos else 'image'} file; SRC is a folder of class folders "
                        "(SRC/<class>/<files>) or a CSV/TSV list of path,label rows")
    if src.is_file():
        _refuse_extensions(extensions, "a path list")
        options.refuse_except(("unlabelled",) if videos else ("image_column", "label_column", "unlabelled"),
                              "a list of videos" if videos else "a path list")
        return _labelled(read_path_list(src, videos, options.image_column, options.label_column), options)
    if os.path.lexists(src):
        raise PackError(f"{src}: not a folder or a list file but {file_kind(src)}")
    raise PackError(f"{src}: no such folder or list file")


def _labelled(source: Source, options: SourceOptions) -> Source:
    """``source`` without labels where ``options.unlabelled``; refused where no label was found."""
    if options.unlabelled:
        return replace(source, labels=np.full(len(source), NO_LABEL, np.int64), classes=None, missing_labels="")
    if source.missing_labels:
        raise PackError(f"{source.root}: {source.missing_labels}; {UNLABELLED_HINT}")
    return source


def _refuse_extensions(extensions: Any, source: str) -> None:
    if extensions is not None:
        raise OptionError(f"extensions={extensions!r} (--extensions) applies to folders of class folders and to "
                          f"tar shards; {source} is packed whole")
