"""Tables a user holds in Python: pandas DataFrames, pyarrow Tables and Hugging Face Datasets (a
DatasetDict's split, a ``save_to_disk`` folder), listed by row.

The image column is read as stored, through Arrow (stoker/sources/rows.py): a Hugging Face Image
keeps its encoded bytes, or is read from its path where it has none. The label column is read
here, whole, into an array, with a ClassLabel's names as the class names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL
from stoker.sources.columns import IMAGE_COLUMN_KINDS, SourceOptions, class_label_names, table_columns, table_labels
from stoker.sources.kinds import table_kind
from stoker.sources.listing import Source, content_digest
from stoker.sources.rows import TableRows

_WHAT = {"dataframe": "DataFrame", "arrow_table": "Table", "hf_dataset": "Dataset"}


def saved_dataset(folder: Path) -> Any | None:
    """The Hugging Face Dataset or DatasetDict that ``save_to_disk`` wrote into ``folder``; None
    when the folder holds none."""
    if not ((folder / "dataset_dict.json").is_file()
            or ((folder / "state.json").is_file() and (folder / "dataset_info.json").is_file())):
        return None
    try:
        import datasets
    except ImportError:
        raise PackError(f"{folder}: a Hugging Face save_to_disk folder; reading it needs the datasets package "
                        "(pip install datasets)") from None
    return datasets.load_from_disk(str(folder))


def list_table(table: Any, options: SourceOptions, root: Path | None = None) -> Source:
    """The rows of a DataFrame, Arrow Table, Hugging Face Dataset or DatasetDict (``options.split``;
    a DatasetDict of one split needs none), ``root`` the folder it was loaded from, if any."""
    kind = table_kind(table)
    if kind == "hf_dataset_dict":
        table, kind = _split(table, options.split, root), "hf_dataset"
    elif options.split is not None:
        raise OptionError(f"split={options.split!r} (--split) applies to a Hugging Face DatasetDict (or a folder of "
                          f"several Parquet splits); a {_WHAT[str(kind)]} is one split")
    what = str(root) if root is not None else _WHAT[str(kind)]
    held = root or Path(f"{type(table).__module__}.{type(table).__qualname__}")  # before a DataFrame becomes a Table
    objects: dict[str, str] = {}  # a DataFrame's columns Arrow cannot hold, and what they hold
    if kind == "dataframe":
        table, objects = _arrow_of(table)
    if options.image_column in objects:
        raise PackError(f"DataFrame: column {options.image_column!r} holds {objects[options.image_column]} objects; "
                        f"an image column holds {IMAGE_COLUMN_KINDS}")
    schema = table.data.schema if kind == "hf_dataset" else table.schema
    try:
        columns, missing = table_columns(what, schema, options)
    except PackError as e:
        others = ", ".join(f"{column} ({value} objects)" for column, value in objects.items())
        raise PackError(f"{e}{f'; besides, columns of Python objects: {others}' if others else ''}") from None
    count = len(table)
    if count == 0:
        raise PackError(f"{what}: the table holds no rows")
    labels, classes = np.full(count, NO_LABEL, np.int64), None
    if columns.label is not None:
        column = (table.with_format("arrow", columns=[columns.label])[columns.label] if kind == "hf_dataset"
                  else table.column(columns.label))
        labels, classes, missing = table_labels(f"{what}: column {columns.label!r}", column,
                                                class_label_names(schema, columns.label))
    inputs = TableRows(table, columns, _WHAT[str(kind)], str(root) if root is not None else os.getcwd())
    identity = [kind, count, table._fingerprint if kind == "hf_dataset" else None, content_digest(inputs, count), options.given()]
    files = [entry["filename"] for entry in table.cache_files] if root is not None else None
    return Source(str(kind), held, list(range(count)),
                  [f"{i:09d}" for i in range(count)], labels, classes, inputs=inputs, identity=identity,
                  missing_labels=missing, files=files)


def _split(splits: Any, split: str | None, root: Path | None) -> Any:
    """The split of a DatasetDict that ``split`` names (the only one where it holds one)."""
    names = ", ".join(splits)
    where = f"{root}: a Hugging Face DatasetDict (save_to_disk)" if root is not None else "a Hugging Face DatasetDict"
    if split is None and len(splits) == 1:
        return next(iter(splits.values()))
    if split is None:
        raise OptionError(f"{where} of splits {names}: choose one with split= (--split)")
    if split not in splits:
        raise OptionError(f"split={split!r} (--split): {where} holds no such split; its splits: {names}")
    return splits[split]


def _arrow_of(frame: Any) -> tuple[Any, dict[str, str]]:
    """A DataFrame as an Arrow Table of the columns Arrow can hold, and the others (Python objects
    such as PIL images) with the type of their first value."""
    import pyarrow as pa

    arrays, names, objects = [], [], {}
    for name in frame.columns:
        try:
            arrays.append(pa.Array.from_pandas(frame[name]))
            names.append(str(name))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            first = frame[name].iloc[0] if len(frame) else None
            objects[str(name)] = f"{type(first).__module__}.{type(first).__qualname__}"
    return pa.table(arrays, names=names), objects
