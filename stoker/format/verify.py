"""Full integrity scan of a data set: every file against the manifest, every member against the index."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stoker.errors import StokerError
from stoker.format.checksum import file_checksum, member_checksum
from stoker.format.index import ShardIndex
from stoker.format.manifest import ShardEntry, read_manifest
from stoker.format.tar import BLOCK


@dataclass(frozen=True)
class Problem:
    """One piece of damage: the file, the sample key (None for whole-file damage) and the reason."""

    path: str
    key: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.path}" + (f", sample {self.key!r}" if self.key is not None else "") + f": {self.reason}"


def verify_dataset(root: str | os.PathLike, on_shard: Callable[[ShardEntry], None] | None = None) -> list[Problem]:
    """Check every shard and index of the data set at ``root``; return the problems found (empty if intact)."""
    root = Path(root)
    problems: list[Problem] = []
    for entry in read_manifest(root).shards:
        problems += verify_shard(root, entry)
        if on_shard:
            on_shard(entry)
    return problems


def verify_shard(root: Path, entry: ShardEntry) -> list[Problem]:
    """Whole-file checksums first (one sequential read); on a mismatch, find the damaged samples."""
    tar_path, idx_path = root / entry.name, root / entry.index
    for path in (tar_path, idx_path):
        if not path.is_file():
            return [Problem(str(path), None, "missing")]
    if file_checksum(idx_path) != entry.index_checksum:
        return [Problem(str(idx_path), None, "index checksum does not match the manifest")]
    try:
        index = ShardIndex.open(idx_path)
        index.check()
    except StokerError as e:
        return [Problem(str(idx_path), None, str(e))]
    if len(index) != entry.count or index.shard_bytes != entry.bytes:
        return [Problem(str(idx_path), None, f"index describes {len(index)} samples in {index.shard_bytes} bytes, "
                        f"manifest says {entry.count} in {entry.bytes}")]
    size = tar_path.stat().st_size
    if size == entry.bytes and file_checksum(tar_path) == entry.checksum:
        return []
    problems = []
    if size != entry.bytes:
        problems.append(Problem(str(tar_path), None, f"shard is {size} bytes, manifest says {entry.bytes} (truncated?)"))
    with open(tar_path, "rb") as f:
        damaged = [(i, reason) for i in range(len(index)) if (reason := _sample_damage(f, index, i, size))]
    problems += [Problem(str(tar_path), index.key(i), reason) for i, reason in damaged]
    if not problems:
        problems.append(Problem(str(tar_path), None, "checksum mismatch outside sample data (end-of-archive padding)"))
    return problems


def _sample_damage(f, index: ShardIndex, i: int, size: int) -> str | None:
    """Why sample ``i`` is damaged, or None: its members' bytes, then the tar headers in its span."""
    key = index.key(i)
    members = index.sample_members(i)
    for m in members:
        field = index.fields[int(m["field"])]
        offset, length = int(m["offset"]), int(m["size"])
        if offset + length > size:
            return f"member '{field}' lies past the end of the shard (truncated)"
        f.seek(offset)
        if member_checksum(f.read(length)) != int(m["checksum"]):
            return f"checksum mismatch in member '{field}'"
    position = int(index.samples[i]["start"])
    for m in members:
        f.seek(position)
        expected = f"{key}.{index.fields[int(m['field'])]}"
        try:
            info = tarfile.TarInfo.frombuf(f.read(BLOCK), "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            return f"damaged tar header for '{expected}' ({e})"
        if info.type != tarfile.XHDTYPE and (info.name != expected or info.size != int(m["size"])):
            return f"tar header names '{info.name}' ({info.size} bytes), index says '{expected}' ({int(m['size'])})"
        position = int(m["offset"]) + int(m["size"]) + (-int(m["size"]) % BLOCK)
    return None
