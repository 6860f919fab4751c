"""The listing of a source: parallel arrays of refs, keys and labels, and the rules that make
keys and labels from what a source gives (paths, label cells).

A source is listed once, up front, into plain arrays; the shard plan is computed from that listing,
so a rerun after a kill sees the same plan and can resume.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError
from stoker.format import NO_LABEL
from stoker.sources.inputs import BadInput, Files, Inputs

# The extensions torchvision's ImageFolder accepts, so both list the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
_UNSAFE_KEY_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
CONTENT_SAMPLE = 16  # inputs spread over a Dataset or table whose content is part of its identity


@dataclass
class Source:
    """A listed source: parallel sequences of refs (where each input's bytes are: a path for
    files, see stoker/sources/inputs.py for the others), keys and labels, plus class names."""

    kind: str
    root: Path
    refs: list[Any]
    keys: list[str]
    labels: np.ndarray
    classes: list[str] | None
    spans: np.ndarray | None = None  # videos: (start, end) seconds per path, NaN where not given
    inputs: Inputs = field(default_factory=Files)
    identity: Any = None  # what the plan's digest holds for the source, when not its refs (a Dataset)
    skipped_extensions: dict[str, int] = field(default_factory=dict)  # folders: files not listed, per extension
    repeated_folders: int = 0  # folders: links to a folder already listed, not listed again
    missing_labels: str = ""  # why no label was found (a pack refuses it unless told the source is unlabelled)
    files: list[str] | None = None  # the files read, where the refs do not name them (a save_to_disk folder's)

    def __len__(self) -> int:
        return len(self.refs)


def choose_extensions(extensions: str | Iterable[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """The file extensions to list: ``default`` for None; else the given ones (``gif``, ``.GIF``
    and ``.gif`` alike; a comma-separated string too), each marked ``+`` (``+gif``) added to
    ``default`` instead of replacing it. OptionError for an empty list or a name that is not an extension."""
    if extensions is None:
        return default
    given = extensions.split(",") if isinstance(extensions, str) else list(extensions)
    chosen: list[str] = []
    for item in given:
        text = str(item).strip().lower()
        if text.startswith("+"):
            text = text[1:]
            chosen.extend(e for e in default if e not in chosen)
        text = "." + text.lstrip(".")
        if not re.fullmatch(r"\.[a-z0-9_][a-z0-9_.-]*", text):
            raise OptionError(f"extensions={extensions!r} (--extensions): {item!r} is not a file extension "
                              "(give them as jpg,png,gif; +gif adds to the default list)")
        if text not in chosen:
            chosen.append(text)
    if not chosen:
        raise OptionError(f"extensions={extensions!r} (--extensions): no extension given")
    return tuple(chosen)


def counted_extensions(counts: dict[str, int]) -> str:
    """Counts of files per extension in words: ``2 .gif, 1 .txt, 3 without extension``."""
    ordered = sorted(counts.items(), key=lambda item: (item[0] == "", item[0]))
    return ", ".join(f"{n} {extension or 'without extension'}" for extension, n in ordered)


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


def make_keys(relative_paths: list[str], seen: set[str] | None = None) -> list[str]:
    """WebDataset keys from relative paths: extension dropped, no dots in the last part, unique
    (also against ``seen``, the keys already given, which is updated: a shard written in parts).

    WebDataset splits ``<key>.<field>`` at the first dot of the last path component, and tar
    readers extract names as paths, so keys never hold ``..``, a leading ``/`` or control characters.
    """
    keys: list[str] = []
    seen = set() if seen is None else seen
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


def content_digest(inputs: Inputs, count: int) -> str:
    """A digest of the inputs (bytes, and labels where they come with them) at ``CONTENT_SAMPLE``
    indices spread over ``range(count)``: with the type, length and labels, the identity by which
    a resumed pack of a Dataset or table notices other content (and starts over instead of mixing
    old and new shards), and by which loader_for keeps a cached pack of it."""
    spread = np.unique(np.linspace(0, count - 1, min(CONTENT_SAMPLE, count)).astype(int)).tolist()
    digest = hashlib.sha256()
    for read in inputs.read(spread):
        digest.update(read.reason.encode() if isinstance(read, BadInput) else read[0] + str(read[1]).encode())
    return digest.hexdigest()
