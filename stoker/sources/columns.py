"""What the user says about a source's columns, and which columns of a table hold the image and the
label; the labels of a label column as an array.

Shared by the tabular sources: Parquet files, pyarrow Tables, pandas DataFrames and Hugging Face
Datasets (all with Arrow schemas), CSV/TSV path lists with a header row, and, by the same names,
the keys of a Dataset's dict items and the members of a WebDataset sample.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL

LABEL_COLUMNS = ("label", "labels")  # found without being named: Hugging Face names its ClassLabel column so
PATH_COLUMNS = ("path", "file_name", "image_path", "filepath")  # string columns found as image paths
IMAGE_COLUMN_KINDS = ("encoded bytes (binary), a struct of bytes and path (a Hugging Face Image) or file paths "
                      "(strings)")
UNLABELLED_HINT = "or pack it without labels: --unlabelled (unlabelled=True)"

# Where each option applies, said when it is given for a source it does not apply to.
_APPLIES = {
    "image_column": "applies to tables (Parquet, CSV/TSV with a header row, DataFrames, Arrow tables, Hugging Face "
                    "datasets) and to a Dataset's dict items",
    "label_column": "applies to tables (Parquet, CSV/TSV with a header row, DataFrames, Arrow tables, Hugging Face "
                    "datasets), to a Dataset's dict items and to WebDataset samples (the label's member)",
    "unlabelled": "applies to sources that may have no labels; a folder's labels are its class folders",
    "split": "applies to a Hugging Face DatasetDict, a save_to_disk folder of one, and a folder of Parquet splits",
}


@dataclass(frozen=True)
class SourceOptions:
    """What the user says about a source: the column (a dict item's key, a tar sample's member)
    holding the image and the one holding the label (None: found by their usual names),
    ``unlabelled`` (pack no labels, and look for none), and ``split`` (one split of several)."""

    image_column: str | None = None
    label_column: str | None = None
    unlabelled: bool = False
    split: str | None = None

    def __post_init__(self) -> None:
        for name in ("image_column", "label_column", "split"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise OptionError(f"{_named(name, value)}: must be a column or split name (a non-empty string)")
        if not isinstance(self.unlabelled, bool):
            raise OptionError(f"{_named('unlabelled', self.unlabelled)}: must be True or False")
        if self.unlabelled and self.label_column is not None:
            raise OptionError(f"{_named('label_column', self.label_column)} and unlabelled=True (--unlabelled) "
                              "contradict each other: give one")

    def given(self) -> dict[str, Any]:
        """The options given (not at their defaults), for the plan's digest and the manifest."""
        return {name: value for name, value in vars(self).items() if value not in (None, False)}

    def refuse_except(self, applies: tuple[str, ...], source: str) -> None:
        """OptionError for the first option given that does not apply to ``source`` (in words)."""
        for name, value in self.given().items():
            if name not in applies:
                raise OptionError(f"{_named(name, value)} {_APPLIES[name]}; {source} takes none")


NO_OPTIONS = SourceOptions()  # nothing said: columns found by their usual names, labels required


def _named(name: str, value: Any) -> str:
    """``name=value (--flag)``, as the range messages name options."""
    return f"{name}={value!r} (--{name.replace('_', '-')})"


@dataclass(frozen=True)
class TableColumns:
    """The columns of a table a pack reads: ``image`` (a top-level column) of ``kind`` ``struct``
    (bytes and path, as Hugging Face stores an Image), ``binary`` or ``path`` (strings), and
    ``label`` (None: no labels)."""

    image: str
    kind: str
    label: str | None


def table_columns(where: str, schema: Any, options: SourceOptions) -> tuple[TableColumns, str]:
    """The image and label columns of a table with the Arrow ``schema``, and, where no label column
    was found and the user did not say the table is unlabelled, why (else ""). OptionError for a
    named column the table lacks, PackError for one of a type that cannot hold images."""
    names = list(schema.names)
    listed = ", ".join(f"{field.name} ({field.type})" for field in schema)
    if options.image_column is not None:
        image = _named_column("image_column", options.image_column, names, where)
        kind = image_kind(schema.field(image).type)
        if kind is None:
            raise PackError(f"{where}: column {image!r} holds {schema.field(image).type}; an image column holds "
                            f"{IMAGE_COLUMN_KINDS}")
    else:
        found = [(f.name, k) for f in schema if (k := image_kind(f.type)) in ("struct", "binary")]
        found += [(f.name, "path") for f in schema if f.name.lower() in PATH_COLUMNS and image_kind(f.type) == "path"]
        if not found:
            raise PackError(f"{where}: no image column among its columns ({listed}); an image column holds "
                            f"{IMAGE_COLUMN_KINDS}: name it with --image-column (image_column=)")
        image, kind = found[0]
    missing = ""
    if options.unlabelled:
        label = None
    elif options.label_column is not None:
        label = _named_column("label_column", options.label_column, names, where)
    else:
        label = next((name for name in LABEL_COLUMNS if name in names), None)
        if label is None:
            missing = (f"no label column ({', '.join(LABEL_COLUMNS)}) among its columns: {', '.join(names)}; "
                       "name it with --label-column (label_column=)")
    return TableColumns(image, kind, label), missing


def image_kind(arrow_type: Any) -> str | None:
    """How a column of ``arrow_type`` holds images: ``struct`` (with a ``bytes`` field), ``binary``
    or ``path`` (strings); None for any other type."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type) and arrow_type.get_field_index("bytes") >= 0:
        return "struct"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "binary"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "path"
    return None


def _named_column(option: str, name: str, names: list[str], where: str) -> str:
    if name not in names:
        raise OptionError(f"{_named(option, name)}: {where} has no column {name!r}; its columns: {', '.join(names)}")
    return name


def table_labels(where: str, column: Any, names: list[str] | None) -> tuple[np.ndarray, list[str] | None, str]:
    """The labels of an Arrow label ``column`` named ``where``: integers as they are (class names
    ``names``, a ClassLabel's, where given), strings as class names indexed in sorted order. The
    third value says why there are none (every row null), else "". PackError for a column of
    another type, or one labelling some rows and not others."""
    import pyarrow as pa

    column = pa.chunked_array([column]) if isinstance(column, pa.Array) else column
    arrow_type = column.type
    if pa.types.is_dictionary(arrow_type):  # a pandas Categorical
        column = column.cast(arrow_type.value_type)
        arrow_type = arrow_type.value_type
    integers = pa.types.is_integer(arrow_type)
    if not (integers or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)):
        raise PackError(f"{where} holds {arrow_type}; a label is an integer or a class name (a string)")
    if column.null_count == len(column):
        return np.full(len(column), NO_LABEL, np.int64), None, f"{where} holds no labels (every row is null)"
    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise PackError(f"{where}: row {first} has no label while others have one; label every row or none")
    values = column.to_numpy()
    if integers:
        return values.astype(np.int64), list(names) if names else None, ""
    classes, labels = np.unique(values.astype(str), return_inverse=True)
    return labels.astype(np.int64), [str(c) for c in classes], ""


def class_label_names(schema: Any, label_column: str | None) -> list[str] | None:
    """The names of a Hugging Face ClassLabel column, from the ``huggingface`` metadata of an Arrow
    ``schema`` (Parquet files and Datasets carry it), if it has them."""
    try:
        meta = json.loads((schema.metadata or {})[b"huggingface"])
        feature = meta["info"]["features"][label_column]
        return list(feature["names"]) if feature.get("_type") == "ClassLabel" else None
    except (KeyError, TypeError, ValueError):
        return None
