"""Where things live in a data set folder, and the checks that keep every path inside it."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from stoker.errors import FormatError

FORMAT_VERSION = 1
# Additions within a format version that readers of that version read correctly, ignoring them
# (docs/format.md, "Versioning"). 1.1: the manifest's own checksum, what a folder source left out;
# 1.2: JPEG members may carry a restart table (pack --restart-rows).
FORMAT_MINOR = 2
MANIFEST_NAME = "stoker.json"
REJECTED_NAME = "rejected.tsv"
WORK_DIR_NAME = ".stoker-pack"
LOCK_NAME = ".stoker-pack.lock"
DEFAULT_SHARD_BYTES = 256 << 20

# Video samples (see stoker/pack/videos.py): frame i of a frames-mode sample is member
# frame_field(i); both modes store the frame table as member FRAME_TABLE_FIELD.
FRAME_TABLE_FIELD = "frames.json"
_FRAME_FIELD = re.compile(r"\d{6}\.jpg")

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def shard_name(number: int) -> str:
    """File name of shard ``number`` (its index sits beside it, see :func:`index_name`)."""
    return f"shard-{number:06d}.tar"


def frame_field(i: int) -> str:
    """The member name of frame ``i`` of a frames-mode video sample."""
    return f"{i:06d}.jpg"


def is_frame_field(name: str) -> bool:
    """Whether a member name is a frame of a frames-mode video sample."""
    return _FRAME_FIELD.fullmatch(name) is not None


def index_name(shard: str) -> str:
    """File name of the index that belongs to the shard named ``shard``."""
    return shard.removesuffix(".tar") + ".idx"


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain file name inside the data set folder, else raise.

    Manifests come from untrusted sources: a name with a separator, ``..``, a leading dot or an
    absolute path could make a reader open a file outside the data set.
    """
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise FormatError(f"unsafe file name in manifest: {name!r} (must be a plain name inside the data set)")
    return name


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    # Unique per thread too: two threads of one process may write the same file at once.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
