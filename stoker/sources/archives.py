"""Sources whose images live inside other files: Parquet (the Hugging Face ``datasets`` layout,
or any table of images or image paths) and WebDataset tar shards.

Each is listed up front into refs (see stoker/sources/inputs.py), keys and labels, as the file
sources are, so the shard plan is fixed before any image is read and a rerun resumes.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import stat
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL
from stoker.sources.columns import SourceOptions, class_label_names, table_columns, table_labels
from stoker.sources.inputs import TarMembers, file_kind
from stoker.sources.listing import IMAGE_EXTENSIONS, Source, make_keys, parse_labels
from stoker.sources.rows import ParquetRows

log = logging.getLogger("stoker.pack")
_SPLIT_FILE = re.compile(r"(.+?)-\d{5}-of-\d{5}(?:-[0-9a-f]+)?\.parquet")  # split-NNNNN-of-NNNNN[-hash].parquet
LABEL_FIELDS = ("cls", "cls.txt", "label", "label.txt", "class")  # WebDataset label members


def archives_in(src: Path, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, split: str | None = None) -> list[Path]:
    """The Parquet or tar files that ``src`` is (a file), matches (a glob pattern such as
    ``data/train-*.parquet``) or holds (Parquet anywhere below, tar files directly in it); empty
    when it is none of these, or an image folder (class folders holding images win over a stray
    ``metadata.parquet``; images are files with ``extensions``). A folder holding several Hugging
    Face splits or configs is refused unless ``split`` names one of them."""
    if not src.exists() and any(c in str(src) for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(src)) if p.lower().endswith((".parquet", ".tar")))
        if not files:
            raise PackError(f"{src}: the pattern matches no .parquet or .tar file")
        return files
    if src.is_file():
        return [src] if src.suffix.lower() in (".parquet", ".tar") else []
    if not src.is_dir() or _holds_class_folders_of_images(src, extensions):
        return []
    parquet = sorted(src.rglob("*.parquet"))
    splits = sorted({found for p in parquet if (found := _split_of(p)) is not None})
    if split is not None and parquet:
        named = [p for p in parquet if (found := _split_of(p)) is not None and found[1] == split]
        if not named:
            held = ", ".join(sorted({name for _, name in splits})) or "none named as Hugging Face names them"
            raise OptionError(f"split={split!r} (--split): {src} holds no such split of Parquet files (its splits: {held})")
        parquet = named
        splits = sorted({found for p in parquet if (found := _split_of(p)) is not None})
    if len(splits) > 1:
        names = ", ".join(f"{folder.relative_to(src) / name}" for folder, name in splits[:4])
        raise PackError(f"{src}: holds several splits or configs ({names}); pack one: --split {splits[0][1]} "
                        f"(split=), or give its folder or a pattern such as {splits[0][0] / (splits[0][1] + '-*.parquet')}")
    return parquet or sorted(p for p in src.iterdir() if p.suffix.lower() == ".tar" and not p.is_dir())


def _split_of(parquet: Path) -> tuple[Path, str] | None:
    """(folder, split) of a file in Hugging Face's layouts: ``<folder>/<split>-NNNNN-of-NNNNN[-hash].parquet``
    or ``<folder>/<split>/NNNN.parquet``; None for other names."""
    if match := _SPLIT_FILE.fullmatch(parquet.name):
        return parquet.parent, match.group(1)
    if re.fullmatch(r"\d+\.parquet", parquet.name):
        return parquet.parent.parent, parquet.parent.name
    return None


def _holds_class_folders_of_images(src: Path, extensions: tuple[str, ...]) -> bool:
    """Whether a class folder of ``src`` holds an image file directly (the first few looked at)."""
    for folder in sorted(p for p in src.iterdir() if p.is_dir())[:8]:
        if any(entry.name.lower().endswith(extensions) for entry in os.scandir(folder)):
            return True
    return False


def list_archives(src: Path, files: list[Path], extensions: tuple[str, ...], options: SourceOptions) -> Source:
    """List Parquet files or WebDataset tar shards, by the first file's suffix; the image member
    of a tar sample is its first with one of ``extensions``. A file that is not a regular file (a
    FIFO, a device) is refused without being opened."""
    for file in files:
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise PackError(f"{file}: not a regular file but {file_kind(file)}")
    if files[0].suffix.lower() == ".parquet":
        return list_parquet(src, files, options)
    return list_tar_shards(src, files, extensions, options)


def list_parquet(src: Path, files: list[Path], options: SourceOptions) -> Source:
    """Rows of Parquet files holding images: a struct column of ``bytes`` and ``path`` (as
    Hugging Face ``datasets`` writes an Image feature; a row without bytes is read from its path),
    a binary column, or a column of paths; and a ``label`` column (or the columns ``options``
    name), of integers or class names; class names from the ClassLabel in the file's metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    options.refuse_except(("image_column", "label_column", "unlabelled", *(("split",) if src.is_dir() else ())),
                          "a Parquet file or pattern")
    refs, names, label_chunks = [], [], []
    columns = first = None
    missing = ""
    for file in files:
        try:
            parquet = pq.ParquetFile(file)
            schema = parquet.schema_arrow
            chosen, why = table_columns(str(file), schema, options)
            if columns is None:
                columns, first, missing = chosen, schema, why
            elif chosen != columns or not _same_types(schema, first, chosen):
                raise PackError(f"{file}: its image and label columns ({chosen.image}, {chosen.label}) or their types "
                                f"differ from those of {files[0]} ({columns.image}, {columns.label}); pack them apart")
            path = _path_leaf(schema, chosen)
            wanted = [c for c in (path, chosen.label) if c]
            table = parquet.read(columns=wanted).flatten() if wanted else None
        except OptionError:
            raise
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid and ArrowIOError derive from these
            raise PackError(f"{file}: not a readable Parquet file ({e})") from None
        rows = parquet.metadata.num_rows
        paths = table.column(path).to_pylist() if table is not None and path else [None] * rows
        if table is not None and chosen.label:
            label_chunks += table.column(chosen.label).chunks
        prefix = file.relative_to(src if src.is_dir() else src.parent).with_suffix("").as_posix()
        row = 0
        for group in range(parquet.metadata.num_row_groups):
            for in_group in range(parquet.metadata.row_group(group).num_rows):
                refs.append((str(file), group, in_group))
                names.append(f"{prefix}/{paths[row] or f'{row:09d}'}")
                row += 1
    if not refs or columns is None or first is None:  # None only when there are no files
        raise PackError(f"{src}: the Parquet files hold no rows")
    labels, classes = np.full(len(refs), NO_LABEL, np.int64), None
    if columns.label is not None:
        column = pa.chunked_array(label_chunks, first.field(columns.label).type)
        labels, classes, missing = table_labels(f"{src}: column {columns.label!r}", column,
                                                class_label_names(first, columns.label))
    return Source("parquet", src, refs, make_keys([f"{name}.x" for name in names]), labels, classes,
                  inputs=ParquetRows(columns), missing_labels=missing)


def _path_leaf(schema: Any, columns: Any) -> str | None:
    """The column holding each row's path, for its key: the Image struct's ``path``, or the image
    column itself when it holds paths; None without one."""
    if columns.kind == "path":
        return columns.image
    image = schema.field(columns.image).type
    return f"{columns.image}.path" if columns.kind == "struct" and image.get_field_index("path") >= 0 else None


def _same_types(schema: Any, first: Any, columns: Any) -> bool:
    """Whether the image and label columns have the same types in both schemas."""
    return all(schema.field(name).type == first.field(name).type for name in (columns.image, columns.label) if name)


def list_tar_shards(src: Path, files: list[Path], extensions: tuple[str, ...], options: SourceOptions) -> Source:
    """Samples of WebDataset tar shards: members grouped by key (the name up to the first dot
    of its last part), the first image member as the image, and a ``.cls`` (or ``.label``, or
    the member ``options.label_column`` names) member as the label."""
    options.refuse_except(("label_column", "unlabelled"), "WebDataset tar files (--extensions picks the image member)")
    label_fields = () if options.unlabelled else (options.label_column.lower(),) if options.label_column else LABEL_FIELDS
    refs, names, labels = [], [], []
    seen: dict[str, None] = {}  # the members' fields, in order, to name where no label is found
    for tar in files:
        samples: dict[str, dict[str, tarfile.TarInfo]] = {}
        try:
            with tarfile.open(tar, "r:") as archive:
                for member in _members(tar, archive):
                    if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):  # not sparse, links or folders
                        folder, _, base = member.name.rpartition("/")
                        key, _, field = base.partition(".")
                        samples.setdefault(f"{folder}/{key}" if folder else key, {})[field.lower()] = member
                for key, fields in samples.items():
                    image = next((m for f, m in fields.items() if f".{f.rsplit('.', 1)[-1]}" in extensions), None)
                    refs.append((str(tar), image.offset_data if image else -1, image.size if image else 0,
                                 image.name if image else key))
                    names.append(f"{tar.stem}/{key}")
                    label = next((fields[f] for f in label_fields if f in fields), None)
                    labels.append(_read(tar, archive, label).decode("utf-8", "replace").strip() if label else "")
                    if len(seen) < 16:
                        seen.update(dict.fromkeys(fields))
        except (tarfile.TarError, OSError) as e:
            raise PackError(f"{tar}: not a readable tar file ({e})") from None
    if not refs:
        raise PackError(f"{src}: the tar files hold no samples")
    label_array, classes = parse_labels(labels, lambda i: TarMembers().name(refs[i]))
    missing = ""
    if not options.unlabelled and not any(labels):
        missing = (f"no label member ({', '.join('.' + f for f in label_fields)}) in its samples; their members: "
                   f"{', '.join('.' + f for f in seen)}; name the label's with --label-column (label_column=)")
    return Source("webdataset", src, refs, make_keys([f"{name}.x" for name in names]), label_array, classes,
                  inputs=TarMembers(), missing_labels=missing)


def _read(tar: Path, archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The bytes of a regular file member (extractfile gives None only for other kinds)."""
    file = archive.extractfile(member)
    if file is None:
        raise PackError(f"{tar}: member {member.name} is not a regular file")
    return file.read()


def _members(tar: Path, archive: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The members up to the end, or up to damage (truncation, a bad header), which is logged:
    samples before it are packed, and one cut short is rejected when read."""
    members: list[tarfile.TarInfo] = []
    try:
        for member in archive:
            members.append(member)
    except tarfile.ReadError as e:
        if not members:
            raise
        log.warning("%s: %s after member %s; the rest of this tar is not packed", tar, e, members[-1].name)
    return members
