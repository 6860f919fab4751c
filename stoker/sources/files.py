"""File sources: an ImageFolder-style tree of class folders, or a CSV/TSV list of ``path,label``."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from stoker.errors import PackError
from stoker.sources.listing import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Source, make_keys, parse_labels


def list_image_folder(root: Path, extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> Source:
    """Class folders below ``root`` and image files (or files with other ``extensions``) anywhere
    below them, listed exactly as torchvision's ImageFolder lists them (same classes, indices
    and order of samples)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise PackError(f"{root}: no class folders found (expected ROOT/<class>/<image files>)")
    paths, labels = [], []
    for label, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(root / name, followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(extensions):
                    paths.append(os.path.join(folder, file))
                    labels.append(label)
    what = "video" if extensions == VIDEO_EXTENSIONS else "image"
    if not paths:
        raise PackError(f"{root}: no {what} files found in the class folders")
    keys = make_keys([os.path.relpath(p, root) for p in paths])
    return Source(f"{what}_folder", root.resolve(), paths, keys, np.array(labels, dtype=np.int64), classes)


def read_path_list(list_file: Path, videos: bool = False) -> Source:
    """A CSV or TSV of ``path[,label]`` rows (for videos ``path,label[,start,end]``, the part of
    the video to keep, in seconds; either may be empty); an optional header row starts with ``path``.

    Relative paths are relative to the list's folder. Integer labels are kept as given; other
    labels are class names, indexed in sorted order as ImageFolder does.
    """
    delimiter = "\t" if list_file.suffix.lower() == ".tsv" else ","
    base = list_file.parent
    rows, lines, spans = [], [], []
    with open(list_file, newline="", encoding="utf-8-sig") as f:
        for line, row in enumerate(csv.reader(f, delimiter=delimiter), 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            if not rows and row[0].strip().lower() == "path":
                continue
            if len(row) > (4 if videos else 2):
                expected = f"path{delimiter}label{delimiter}start{delimiter}end" if videos else f"path{delimiter}label"
                raise PackError(f"{list_file}:{line}: expected '{expected}', got {len(row)} columns")
            rows.append((row[0].strip(), row[1].strip() if len(row) >= 2 else ""))
            spans.append(_span(row[2:], list_file, line))
            lines.append(line)
    if not rows:
        raise PackError(f"{list_file}: the list holds no paths")
    labels, classes = parse_labels([label for _, label in rows], lambda i: f"{list_file}:{lines[i]}")
    paths = [str(base / p) for p, _ in rows]
    rel = [os.path.relpath(p, base) if not os.path.isabs(raw) else raw for p, (raw, _) in zip(paths, rows)]
    given = np.array(spans, dtype=np.float64).reshape(-1, 2)
    return Source("path_list", list_file.resolve(), paths, make_keys(rel), labels, classes,
                  given if videos and not np.isnan(given).all() else None)


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
