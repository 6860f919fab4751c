"""Full integrity scan of a data set: every file against the manifest, every member against the index."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stoker.errors import StokerError
from stoker.format.checksum import file_checksum, member_checksum
from stoker.format.index import ShardIndex
from stoker.format.layout import MANIFEST_NAME
from stoker.format.manifest import ShardEntry, checksum_problem, read_manifest
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
    """Check the manifest against its own checksum, then every shard and index of the data set
    at ``root``; return the problems found (empty if intact)."""
    root = Path(root)
    manifest_path = str(root / MANIFEST_NAME)
    manifest = read_manifest(root, check=False)
    problems: list[Problem] = []
    if problem := checksum_problem(json.loads(Path(manifest_path).read_bytes())):
        problems.append(Problem(manifest_path, None, problem))
    for entry in manifest.shards:
        problems += verify_shard(root, entry)
        if on_shard:
            on_shard(entry)
    return problems


def verify_shard(root: Path, entry: ShardEntry) -> list[Problem]:
    """Whole-file checksums first (one sequential read); on a mismatch, find the damaged samples.
    A checksum that does not match files found intact by every other check (each member
    against the index, every tar header, the end of the archive) names the manifest instead."""
    tar_path, idx_path, manifest = root / entry.name, root / entry.index, str(root / MANIFEST_NAME)
    for path in (tar_path, idx_path):
        if not path.is_file():
            return [Problem(str(path), None, "missing")]
    index_matches = file_checksum(idx_path) == entry.index_checksum
    try:
        index = ShardIndex.open(idx_path)
    except StokerError as e:
        return [Problem(str(idx_path), None, str(e))]
    if len(index) != entry.count or index.shard_bytes != entry.bytes:  # the manifest is wrong if the index is intact
        return [Problem(manifest if index_matches else str(idx_path), None, f"{entry.index} describes {len(index)} "
                        f"samples in {index.shard_bytes} bytes, manifest says {entry.count} in {entry.bytes}")]
    size = tar_path.stat().st_size
    shard_matches = size == entry.bytes and file_checksum(tar_path) == entry.checksum
    if shard_matches and index_matches:
        return []
    problems = []
    if size != entry.bytes:
        problems.append(Problem(str(tar_path), None, f"shard is {size} bytes, manifest says {entry.bytes} (truncated?)"))
    with open(tar_path, "rb") as f:
        damaged = [(i, reason) for i in range(len(index)) if (reason := _sample_damage(f, index, i, size))]
        clean_end = _clean_end(f, index, size)
    problems += [Problem(str(tar_path), index.key(i), reason) for i, reason in damaged]
    if problems:
        return problems if index_matches else [Problem(str(idx_path), None, "index checksum does not match the "
                                                       "manifest, and the shard does not match the index")] + problems
    if not index_matches and not shard_matches:  # both files agree with each other: the manifest is wrong
        return [Problem(manifest, None, f"checksums of {entry.name} and {entry.index} do not match these files, "
                        "which agree with each other (the manifest was edited?)")]
    if not index_matches:
        return [Problem(manifest, None, f"index checksum of {entry.index} does not match the index, whose every "
                        f"entry matches {entry.name} (the manifest was edited?)")]
    if not clean_end:
        return [Problem(str(tar_path), None, "checksum mismatch outside sample data (end-of-archive padding)")]
    return [Problem(manifest, None, f"checksum of {entry.name} does not match the shard, whose every sample, tar "
                    "header and end-of-archive block matches its index (the manifest was edited?)")]


def _clean_end(f, index: ShardIndex, size: int) -> bool:
    """Whether everything after the last sample is zeros (tar's end-of-archive blocks and padding)."""
    end = int(index.rows[-1]["start"])
    f.seek(end)
    while chunk := f.read(1 << 20):
        if chunk.count(0) != len(chunk):
            return False
    return size > end


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
