"""Sources whose images live inside other files: Parquet (the Hugging Face ``datasets`` layout)
and WebDataset tar shards, plus map-style Datasets given through the Python API.

Each is listed up front into refs (see stoker/sources/inputs.py), keys and labels, as the file
sources are, so the shard plan is fixed before any image is read and a rerun resumes.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import stat
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import PackError
from stoker.format import NO_LABEL
from stoker.sources.inputs import BadInput, DatasetItems, ParquetRows, TarMembers, file_kind
from stoker.sources.listing import IMAGE_EXTENSIONS, Source, make_keys, parse_labels

log = logging.getLogger("stoker.pack")
_SPLIT_FILE = re.compile(r"(.+?)-\d{5}-of-\d{5}(?:-[0-9a-f]+)?\.parquet")  # split-NNNNN-of-NNNNN[-hash].parquet
LABEL_COLUMNS = ("label", "labels")  # Hugging Face names its ClassLabel column one of these
LABEL_FIELDS = ("cls", "cls.txt", "label", "label.txt", "class")  # WebDataset label members


def archives_in(src: Path, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> list[Path]:
    """The Parquet or tar files that ``src`` is (a file), matches (a glob pattern such as
    ``data/train-*.parquet``) or holds (Parquet anywhere below, tar files directly in it); empty
    when it is none of these, or an image folder (class folders holding images win over a stray
    ``metadata.parquet``; images are files with ``extensions``). A folder holding several Hugging
    Face splits or configs is refused."""
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
    splits = sorted({split for p in parquet if (split := _split_of(p)) is not None})
    if len(splits) > 1:
        names = ", ".join(f"{folder.relative_to(src) / name}" for folder, name in splits[:4])
        raise PackError(f"{src}: holds several splits or configs ({names}); pack one: give its folder or a pattern "
                        f"such as {splits[0][0] / (splits[0][1] + '-*.parquet')}")
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


def list_archives(src: Path, files: list[Path], extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> Source:
    """List Parquet files or WebDataset tar shards, by the first file's suffix; the image member
    of a tar sample is its first with one of ``extensions``. A file that is not a regular file (a
    FIFO, a device) is refused without being opened."""
    for file in files:
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise PackError(f"{file}: not a regular file but {file_kind(file)}")
    return list_parquet(src, files) if files[0].suffix.lower() == ".parquet" else list_tar_shards(src, files, extensions)


def list_parquet(src: Path, files: list[Path]) -> Source:
    """Rows of Parquet files holding encoded images: a struct column of ``bytes`` and ``path``
    (as Hugging Face ``datasets`` writes an Image feature) or a binary column, and an optional
    integer or string ``label`` column; class names from the ClassLabel in the file's metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    refs, names, labels = [], [], []
    image = path_column = label_column = None
    classes = None
    for file in files:
        try:
            parquet = pq.ParquetFile(file)
            schema = parquet.schema_arrow
            columns = _parquet_columns(file, schema, pa)
            if image is None:
                (image, path_column, label_column), first = columns, schema
                classes = _class_names(schema, label_column)
            elif columns != (image, path_column, label_column) or not _same_types(schema, first, columns):
                raise PackError(f"{file}: its image, path and label columns ({', '.join(map(str, columns))}) or their "
                                f"types differ from those of {files[0]} ({image}, {path_column}, {label_column}); "
                                "pack them apart")
            wanted = [c for c in (path_column, label_column) if c]
            table = parquet.read(columns=wanted).flatten() if wanted else None
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid and ArrowIOError derive from these
            raise PackError(f"{file}: not a readable Parquet file ({e})") from None
        paths = table.column(path_column).to_pylist() if table is not None and path_column else [None] * parquet.metadata.num_rows
        if table is not None and label_column:
            labels += ["" if v is None else str(v) for v in table.column(label_column).to_pylist()]
        prefix = file.relative_to(src if src.is_dir() else src.parent).with_suffix("").as_posix()
        row = 0
        for group in range(parquet.metadata.num_row_groups):
            for in_group in range(parquet.metadata.row_group(group).num_rows):
                refs.append((str(file), group, in_group))
                names.append(f"{prefix}/{paths[row] or f'{row:09d}'}")
                row += 1
    if not refs or image is None:  # image is None only when there are no files
        raise PackError(f"{src}: the Parquet files hold no rows")
    keys = make_keys([f"{name}.x" for name in names])
    label_array, listed_classes = _labels(labels, refs, ParquetRows(image))
    return Source("parquet", src, refs, keys, label_array, classes if classes else listed_classes,
                  inputs=ParquetRows(image))


def _parquet_columns(file: Path, schema: Any, pa: Any) -> tuple[str, str | None, str | None]:
    """The image's leaf column, the path column (None without one), the label column (None)."""
    image = path = None
    for f in schema:
        if pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0:
            image = f"{f.name}.bytes"
            path = f"{f.name}.path" if f.type.get_field_index("path") >= 0 else None
            break
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            image = f.name
            break
    if image is None:
        raise PackError(f"{file}: no image column (a struct of bytes and path, as Hugging Face writes, or binary)")
    label = next((name for name in LABEL_COLUMNS if schema.get_field_index(name) >= 0), None)
    return image, path, label


def _same_types(schema: Any, first: Any, columns: tuple[str | None, ...]) -> bool:
    """Whether the top-level columns behind ``columns`` (``image.bytes`` is in ``image``; a
    column may have a dot in its own name) have the same types in both schemas."""
    names = {c if schema.get_field_index(c) >= 0 else c.split(".")[0] for c in columns if c}
    return all(schema.field(name).type == first.field(name).type for name in names)


def _class_names(schema: Any, label_column: str | None) -> list[str] | None:
    """ClassLabel names from the ``huggingface`` schema metadata, if the file has them."""
    try:
        meta = json.loads((schema.metadata or {})[b"huggingface"])
        feature = meta["info"]["features"][label_column]
        return list(feature["names"]) if feature.get("_type") == "ClassLabel" else None
    except (KeyError, TypeError, ValueError):
        return None


def list_tar_shards(src: Path, files: list[Path], extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> Source:
    """Samples of WebDataset tar shards: members grouped by key (the name up to the first dot
    of its last part), the first image member as the image, and a ``.cls`` (or ``.label``)
    member as the label."""
    refs, names, labels = [], [], []
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
                    label = next((fields[f] for f in LABEL_FIELDS if f in fields), None)
                    labels.append(_read(tar, archive, label).decode("utf-8", "replace").strip() if label else "")
        except (tarfile.TarError, OSError) as e:
            raise PackError(f"{tar}: not a readable tar file ({e})") from None
    if not refs:
        raise PackError(f"{src}: the tar files hold no samples")
    label_array, classes = _labels(labels, refs, TarMembers())
    return Source("webdataset", src, refs, make_keys([f"{name}.x" for name in names]), label_array, classes,
                  inputs=TarMembers())


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


def list_dataset(dataset: Any) -> Source:
    """A map-style Dataset's indices; labels come with the items when they are read, and class
    names from its ``classes`` attribute (as torchvision's datasets have)."""
    try:
        count = len(dataset)
        dataset.__getitem__  # noqa: B018 -- refused here, not in every worker
    except (TypeError, AttributeError):
        raise PackError(f"{type(dataset).__name__}: not a source: expected a path, or a Dataset with "
                        "__getitem__ and __len__") from None
    if count == 0:
        raise PackError(f"{type(dataset).__name__}: the Dataset is empty")
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    classes = getattr(dataset, "classes", None)
    return Source("dataset", Path(kind), list(range(count)), [f"{i:09d}" for i in range(count)],
                  np.full(count, NO_LABEL, dtype=np.int64), list(classes) if classes else None,
                  inputs=DatasetItems(dataset), identity=[kind, count, getattr(dataset, "_fingerprint", None),
                                                          _sampled_content(DatasetItems(dataset), count)])


def _sampled_content(inputs: DatasetItems, count: int) -> str:
    """A digest of a few items spread over the Dataset (bytes and labels), for the plan: a resumed
    pack of a Dataset whose content changed starts over instead of mixing old and new shards."""
    digest = hashlib.sha256()
    for read in inputs.read(sorted({0, count // 3, count // 2, 2 * count // 3, count - 1})):
        digest.update(read.reason.encode() if isinstance(read, BadInput) else read[0] + str(read[1]).encode())
    return digest.hexdigest()


def _labels(labels: list[str], refs: list, inputs: Any) -> tuple[np.ndarray, list[str] | None]:
    if not labels:
        return np.full(len(refs), NO_LABEL, dtype=np.int64), None
    return parse_labels(labels, lambda i: inputs.name(refs[i]))
