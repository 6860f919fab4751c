"""File sources: an ImageFolder-style tree of class folders, or a CSV/TSV list of ``path,label``."""

from __future__ import annotations

import codecs
import csv
import io
import os
from collections import Counter
from pathlib import Path

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.sources.columns import LABEL_COLUMNS
from stoker.sources.listing import IMAGE_EXTENSIONS, Source, counted_extensions, make_keys, parse_labels


def list_image_folder(root: Path, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, videos: bool = False) -> Source:
    """Class folders below ``root`` and the files with ``extensions`` (images; videos with
    ``videos``) anywhere below them, listed exactly as torchvision's ImageFolder lists them (same classes, indices
    and order of samples), except that links are followed into each real folder once (see
    :func:`_folders_below`). Files with other extensions are counted per extension in
    ``Source.skipped_extensions``, links not followed again in ``Source.repeated_folders``."""
    classes = sorted(entry.name for entry in _entries(root) if _is_dir(entry))
    if not classes:
        raise PackError(f"{root}: no class folders found (expected ROOT/<class>/<image files>)")
    paths: list[str] = []
    labels: list[int] = []
    skipped: Counter[str] = Counter()
    seen = {_identity(os.stat(root))}
    repeated = 0
    for label, name in enumerate(classes):
        folders, again = _folders_below(root / name, seen)
        repeated += again
        for folder, files in sorted(folders):
            for file in sorted(files):
                if file.lower().endswith(extensions):
                    paths.append(os.path.join(folder, file))
                    labels.append(label)
                else:
                    skipped[os.path.splitext(file)[1].lower()] += 1
    what = "video" if videos else "image"
    if not paths:
        found = f"; found only {counted_extensions(skipped)}" if skipped else ""
        raise PackError(f"{root}: no {what} files ({', '.join(extensions)}) found in the class folders{found}")
    keys = make_keys([os.path.relpath(p, root) for p in paths])
    return Source(f"{what}_folder", root.resolve(), paths, keys, np.array(labels, dtype=np.int64), classes,
                  skipped_extensions=dict(sorted(skipped.items())), repeated_folders=repeated)


def _folders_below(top: Path, seen: set[tuple[int, int]]) -> tuple[list[tuple[str, list[str]]], int]:
    """Every folder below ``top`` (itself included) with the names of the non-folders in it, as
    ``os.walk(top, followlinks=True)`` finds them, and how many links were not followed.

    Links are followed, but each real folder (device and inode) is listed once per pack: the
    first time a walk in sorted order reaches it. A link back to a folder already listed (a
    cycle, or a second way to the same folder) is counted and not followed, so a cycle ends and
    no file is listed twice through folder links. ``seen`` holds the folders already listed.
    A folder that cannot be listed stops the pack, naming it: nothing is left out silently."""
    found: list[tuple[str, list[str]]] = []
    repeated = 0
    stack = [(str(top), _identity(os.stat(top)))]
    while stack:
        folder, identity = stack.pop()
        if identity in seen:
            repeated += 1
            continue
        seen.add(identity)
        files, below = [], []
        for entry in sorted(_entries(folder), key=lambda e: e.name):
            if _is_dir(entry):
                below.append((entry.path, _identity(entry.stat())))
            else:
                files.append(entry.name)
        found.append((folder, files))
        stack.extend(reversed(below))
    return found, repeated


def _entries(folder: str | Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as e:
        raise PackError(f"{folder}: cannot list the folder: {e.strerror or e}") from None


def _is_dir(entry: os.DirEntry) -> bool:
    """A folder, or a link to one (a broken link is not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def read_path_list(list_file: Path, videos: bool = False, image_column: str | None = None,
                   label_column: str | None = None) -> Source:
    """A CSV or TSV of ``path[,label]`` rows (for videos ``path,label[,start,end]``, the part of
    the video to keep, in seconds; either may be empty); an optional header row starts with ``path``.
    In a list of images a header row names the columns, whatever their number: the image's column
    is ``image_column`` (default ``path``), the label's ``label_column`` (default ``label`` or
    ``labels``); a header naming no label column means no labels (``path,caption``: captions are
    not class names). Other columns need a header row naming them.

    Relative paths are relative to the list's folder. Integer labels are kept as given; other
    labels are class names, indexed in sorted order as ImageFolder does. Where no row has a label,
    ``Source.missing_labels`` says so.
    """
    delimiter = "\t" if list_file.suffix.lower() == ".tsv" else ","
    expected = f"path{delimiter}label{delimiter}start{delimiter}end" if videos else f"path{delimiter}label"
    base = list_file.parent
    rows: list[tuple[str, str]] = []
    lines: list[int] = []
    spans: list[tuple[float, float]] = []
    named = image_column is not None or label_column is not None
    picked: tuple[int, int | None] | None = None  # (image, label) columns named by a header row
    header: list[str] = []
    reader = csv.reader(io.StringIO(_list_text(list_file, expected), newline=""), delimiter=delimiter)
    try:
        for line, row in enumerate(reader, 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            if not rows and not header and (named or row[0].strip().lower() == "path"):
                header = [cell.strip() for cell in row]
                if named or not videos:
                    picked = _named_columns(list_file, header, image_column, label_column)
                continue
            if picked is not None:
                image, label = picked
                if len(row) <= max(image, label or 0):
                    raise PackError(f"{list_file}:{line}: {len(row)} columns where the header names {len(header)}")
                rows.append((row[image].strip(), row[label].strip() if label is not None else ""))
                spans.append((float("nan"), float("nan")))
            else:
                if len(row) > (4 if videos else 2):
                    raise PackError(f"{list_file}:{line}: expected '{expected}', got {len(row)} columns (a list with "
                                    "more columns needs a header row naming them)")
                rows.append((row[0].strip(), row[1].strip() if len(row) >= 2 else ""))
                spans.append(_span(row[2:], list_file, line))
            lines.append(line)
    except csv.Error as e:  # a NUL byte, an unclosed quote at the end
        raise PackError(f"{list_file}:{reader.line_num}: not a CSV/TSV row ({e}); expected '{expected}' rows") from None
    if not rows:
        raise PackError(f"{list_file}: the list holds no paths (expected '{expected}' rows)")
    labels, classes = parse_labels([label for _, label in rows], lambda i: f"{list_file}:{lines[i]}")
    paths = [str(base / p) for p, _ in rows]
    rel = [os.path.relpath(p, base) if not os.path.isabs(raw) else raw for p, (raw, _) in zip(paths, rows)]
    given = np.array(spans, dtype=np.float64).reshape(-1, 2)
    missing = ""
    if picked is not None and picked[1] is None:
        missing = (f"no label column ({', '.join(LABEL_COLUMNS)}) among its columns: {', '.join(header)}; "
                   "name it with --label-column (label_column=)")
    elif not any(label for _, label in rows):
        missing = f"its rows hold no labels (expected '{expected}' rows)"
    return Source("path_list", list_file.resolve(), paths, make_keys(rel), labels, classes,
                  given if videos and not np.isnan(given).all() else None, missing_labels=missing)


def _named_columns(list_file: Path, header: list[str], image_column: str | None,
                   label_column: str | None) -> tuple[int, int | None]:
    """The positions of the image and label columns in a list's ``header`` row; OptionError for
    a named column the header lacks."""
    for option, name in (("image_column", image_column), ("label_column", label_column)):
        if name is not None and name not in header:
            raise OptionError(f"{option}={name!r} (--{option.replace('_', '-')}): the header row of {list_file} names "
                              f"no such column; its columns: {', '.join(header)}")
    image = header.index(image_column or "path") if (image_column or "path") in header else None
    if image is None:
        raise PackError(f"{list_file}: its header row names no path column ({', '.join(header)}); name the image's "
                        "with --image-column (image_column=)")
    label = label_column or next((name for name in LABEL_COLUMNS if name in header), None)
    return image, header.index(label) if label is not None else None


def _list_text(list_file: Path, expected: str) -> str:
    """The list's text: UTF-8, with or without a byte-order mark; anything else is refused naming
    the file, the line and the form expected."""
    try:
        raw = list_file.read_bytes()
    except OSError as e:
        raise PackError(f"{list_file}: cannot read the list: {e.strerror or e}") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise PackError(f"{list_file}: UTF-16 text; save the list as UTF-8 ('{expected}' rows)")
    if (nul := raw.find(b"\0")) >= 0:  # no path holds one, and the csv module lets it through
        line = raw.count(b"\n", 0, nul) + 1
        raise PackError(f"{list_file}:{line}: holds a NUL byte: binary data, not a UTF-8 "
                        f"CSV/TSV of '{expected}' rows")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise PackError(f"{list_file}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); a path list is a UTF-8 "
                        f"CSV/TSV of '{expected}' rows") from None


def _span(cells: list[str], list_file: Path, line: int) -> tuple[float, float]:
    """(start, end) seconds from the optional columns of a video list row; NaN where empty."""
    values = [cell.strip() for cell in cells] + ["", ""]
    try:
        start, end = (float(v) if v else float("nan") for v in values[:2])
    except ValueError:
        raise PackError(f"{list_file}:{line}: start and end must be seconds, got {cells}") from None
    if start < 0 or end <= start:
        raise PackError(f"{list_file}:{line}: need 0 <= start < end, got start {start}, end {end}")
    return start, end
