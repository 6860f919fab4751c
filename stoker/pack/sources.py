"""What can be packed: an ImageFolder-style tree, a CSV/TSV list of ``path,label``, Parquet
files or WebDataset tar shards (stoker/pack/archive_sources.py), or a map-style Dataset.

A source is listed once, up front, into plain arrays; the shard plan is computed from that listing,
so a rerun after a kill sees the same plan and can resume.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import PackError
from stoker.format import NO_LABEL
from stoker.pack.inputs import Files, Inputs

# The extensions torchvision's ImageFolder accepts, so both list the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
_UNSAFE_KEY_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass
class Source:
    """A listed source: parallel sequences of refs (where each input's bytes are: a path for
    files, see stoker/pack/inputs.py for the others), keys and labels, plus class names."""

    kind: str
    root: Path
    refs: list[Any]
    keys: list[str]
    labels: np.ndarray
    classes: list[str] | None
    spans: np.ndarray | None = None  # videos: (start, end) seconds per path, NaN where not given
    inputs: Inputs = field(default_factory=Files)
    identity: Any = None  # what the plan's digest holds for the source, when not its refs (a Dataset)

    def __len__(self) -> int:
        return len(self.refs)


def open_source(src: Any, videos: bool = False) -> Source:
    """List ``src``: a folder of class folders is read as ImageFolder (of video files with
    ``videos``), a ``.csv``/``.tsv``/``.txt`` file as a path list, ``.parquet`` files (or a folder
    of them) and ``.tar`` files (or a folder of them) as archives of images, and any object with
    ``__getitem__`` and ``__len__`` as a map-style Dataset."""
    from stoker.pack import archive_sources

    if not isinstance(src, (str, os.PathLike)):
        if videos:
            raise PackError("a Dataset source holds images; pack videos from files")
        return archive_sources.list_dataset(src)
    src = Path(src).resolve()  # the plan's digest must not depend on how the path was spelled
    archives = archive_sources.archives_in(src)
    if archives and videos:
        raise PackError(f"{src}: Parquet and tar sources hold images; pack videos from files")
    if archives:
        return archive_sources.list_archives(src, archives)
    if src.is_dir():
        return list_image_folder(src, VIDEO_EXTENSIONS if videos else IMAGE_EXTENSIONS)
    if src.is_file():
        return read_path_list(src, videos)
    raise PackError(f"{src}: no such folder or list file")


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


def parse_labels(raw: list[str], where: Callable[[int], str]) -> tuple[np.ndarray, list[str] | None]:
    """All empty: no labels. All integers: kept. Otherwise class names, indexed in sorted order.
    ``where(i)`` names label i's place, for error messages only (not built for every label)."""
    empty = [label == "" for label in raw]
    if all(empty):
        return np.full(len(raw), NO_LABEL, dtype=np.int64), None
    if any(empty):
        raise PackError(f"{where(empty.index(True))}: no label while others have one; label every sample or none")
    numeric = [re.fullmatch(r"-?\d+", label) is not None for label in raw]
    if all(numeric):
        return np.array([int(label) for label in raw], dtype=np.int64), None
    if any(numeric):
        raise PackError(f"{where(numeric.index(not numeric[0]))}: labels mix integers and class names; use one kind")
    classes = sorted(set(raw))
    index = {name: i for i, name in enumerate(classes)}
    return np.array([index[label] for label in raw], dtype=np.int64), classes


def make_keys(relative_paths: list[str]) -> list[str]:
    """WebDataset keys from relative paths: extension dropped, no dots in the last part, unique.

    WebDataset splits ``<key>.<field>`` at the first dot of the last path component, and tar
    readers extract names as paths, so keys never hold ``..``, a leading ``/`` or control characters.
    """
    keys, seen = [], set()
    for rel in relative_paths:
        parts = [p for p in Path(rel).with_suffix("").as_posix().split("/") if p not in ("", ".")]
        parts = ["_" if p == ".." else p for p in parts] or ["_"]
        parts[-1] = parts[-1].replace(".", "_")
        key = _UNSAFE_KEY_CHARS.sub("_", "/".join(parts)).encode("utf-8", "replace").decode("utf-8")
        unique, n = key, 1
        while unique in seen:
            n += 1
            unique = f"{key}_{n}"
        seen.add(unique)
        keys.append(unique)
    return keys
