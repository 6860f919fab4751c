"""Full integrity scan of a data set: every file against the manifest, every member against the index."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from stoker.errors import StokerError
from stoker.format.checksum import FileChecksum, file_checksum
from stoker.format.index import ShardIndex
from stoker.format.layout import MANIFEST_NAME
from stoker.format.manifest import ShardEntry, checksum_problem, read_manifest
from stoker.format.tar import BLOCK, framed

_CHUNK = 1 << 22  # bytes read at a time: the shard is read once, in order


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
    """One shard and its index: every row of the index (on open), then one sequential read of
    the shard checks every member's bytes against its checksum, the tar headers around them and
    the whole file's checksum. So a shard verify finds intact is one every reader reads, tar
    readers too, even where the manifest's checksums were recomputed over damaged files.

    A checksum in the manifest that does not match files found intact by every other check
    names the manifest instead."""
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
    scan = _Scan(tar_path, index, size)
    shard_matches = size == entry.bytes and scan.checksum == entry.checksum
    problems = []
    if size != entry.bytes:
        problems.append(Problem(str(tar_path), None, f"shard is {size} bytes, manifest says {entry.bytes} (truncated?)"))
    if first := int(index.rows[0]["start"]):
        problems.append(Problem(str(tar_path), None, f"{first} bytes before the first sample, which the index "
                                "does not describe (tar readers read them as members)"))
    problems += [Problem(str(tar_path), index.key(i), reason) for i, reason in scan.damaged_samples()]
    if problems:
        return problems if index_matches else [Problem(str(idx_path), None, "index checksum does not match the "
                                                       "manifest, and the shard does not match the index")] + problems
    if not index_matches and not shard_matches:  # both files agree with each other: the manifest is wrong
        return [Problem(manifest, None, f"checksums of {entry.name} and {entry.index} do not match these files, "
                        "which agree with each other (the manifest was edited?)")]
    if not index_matches:
        return [Problem(manifest, None, f"index checksum of {entry.index} does not match the index, whose every "
                        f"entry matches {entry.name} (the manifest was edited?)")]
    if not scan.clean_end:
        return [Problem(str(tar_path), None, "non-zero bytes after the last sample (end-of-archive padding)")]
    if not shard_matches:
        return [Problem(manifest, None, f"checksum of {entry.name} does not match the shard, whose every sample, tar "
                        "header and end-of-archive block matches its index (the manifest was edited?)")]
    return []


class _Scan:
    """One sequential read of a shard: its whole-file checksum, each member's bytes against its
    checksum (and whether the file ends before a member does), whether the header block before
    each member frames it as the index says (see :func:`framed`), and whether everything after
    the last sample is zeros (tar's end-of-archive blocks). Memory: one chunk, a few flags per member."""

    def __init__(self, path: Path, index: ShardIndex, size: int) -> None:
        self.path, self.index = path, index
        members = index.members
        self.offsets = members["offset"].astype(np.int64)  # below 2**62: the index checked its rows
        self.sizes = members["size"].astype(np.int64)
        m = len(members)
        self.names = _member_names(index)
        self.mismatch = np.zeros(m, bool)  # bytes that do not match the checksum
        self.past_end = np.ones(m, bool)  # cleared for each member read whole
        self.framed = np.zeros(m, bool)
        end_of_samples = int(index.rows[-1]["start"])
        self.clean_end = size > end_of_samples
        digest = FileChecksum()
        buffer = memoryview(bytearray(_CHUNK))
        offsets, ends, checksums = self.offsets.tolist(), (self.offsets + self.sizes).tolist(), members["checksum"].tolist()
        j, member_hash, pos = 0, xxhash.xxh3_64(), 0
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                chunk, top = buffer[:n], pos + n
                digest.update(chunk)
                while j < m and offsets[j] < top:  # member j starts before this chunk ends
                    member_hash.update(chunk[max(offsets[j], pos) - pos : min(ends[j], top) - pos])
                    if ends[j] > top:
                        break  # the rest is in the next chunk
                    self.mismatch[j] = member_hash.intdigest() != checksums[j]
                    self.past_end[j] = False
                    member_hash.reset()
                    j += 1
                self._check_headers(f.fileno(), np.frombuffer(chunk, np.uint8), pos)
                if top > end_of_samples and np.frombuffer(chunk[max(end_of_samples - pos, 0) :], np.uint8).any():
                    self.clean_end = False
                pos = top
        self.checksum = digest.hexdigest()

    def _check_headers(self, fd: int, chunk: np.ndarray, pos: int) -> None:
        """Check the header blocks of the members whose data starts in ``chunk`` (the bytes at ``pos``)."""
        lo, hi = np.searchsorted(self.offsets, [pos, pos + len(chunk)], side="right")
        inside = min(int(np.searchsorted(self.offsets, pos + BLOCK)), hi)  # headers from here on lie in the chunk
        straddling = [np.frombuffer(os.pread(fd, BLOCK, offset - BLOCK), np.uint8)  # begun in the last chunk
                      for offset in self.offsets[lo:inside].tolist()]
        blocks = chunk[(self.offsets[inside:hi] - BLOCK - pos)[:, None] + np.arange(BLOCK)]
        if straddling:
            blocks = np.concatenate([np.stack(straddling), blocks])
        self.framed[lo:hi] = framed(blocks, self.names[lo:hi], self.sizes[lo:hi])

    def damaged_samples(self) -> list[tuple[int, str]]:
        """(sample, why) of every sample whose members' bytes or tar headers do not match the index."""
        index, offsets = self.index, self.offsets
        first = index.rows["first_member"].astype(np.int64)
        starts = index.rows["start"].astype(np.int64)
        owner = np.repeat(np.arange(len(index)), np.diff(first))  # each member's sample
        padded_ends = (offsets + self.sizes + BLOCK - 1) // BLOCK * BLOCK
        # each header right after the previous member's padding, a sample's first at the sample's start
        header_at = np.where(first[owner] == np.arange(len(owner)), starts[owner], np.roll(padded_ends, 1))
        bad_members = ~self.framed | (offsets - BLOCK != header_at) | self.mismatch | self.past_end
        bad = np.bincount(owner, bad_members, len(index)) > 0
        last = first[1:] - 1  # each sample's bytes end where its last member's padding does (none: it has none)
        ends = np.where(last >= first[:-1], padded_ends[last] if len(owner) else 0, starts[:-1])
        gaps = starts[1:] - ends  # bytes between a sample's end and the next one's start: 0 as the writer leaves them
        bad |= gaps != 0
        damaged = []
        with open(self.path, "rb") as f:
            for i in np.flatnonzero(bad).tolist():
                if reason := self._sample_damage(f, i) or _gap_damage(int(gaps[i])):
                    damaged.append((i, reason))
        return damaged

    def _sample_damage(self, f, i: int) -> str | None:
        """Why sample ``i`` is damaged: its members' bytes, then its tar members as Python's
        tarfile reads them from the sample's bytes; None where those are valid tar of another
        layout than the one :func:`framed` checks (pax headers for long or non-ASCII names)."""
        index = self.index
        rows = range(int(index.rows[i]["first_member"]), int(index.rows[i + 1]["first_member"]))
        for j in rows:
            field = index.fields[int(index.members[j]["field"])]
            if self.past_end[j]:
                return f"member '{field}' lies past the end of the shard (truncated)"
            if self.mismatch[j]:
                return f"checksum mismatch in member '{field}'"
        start, end = index.span(i, i)
        f.seek(start)
        try:
            with tarfile.open(fileobj=io.BytesIO(f.read(end - start) + bytes(2 * BLOCK)), mode="r:") as tar:
                found = tar.getmembers()
        except tarfile.TarError as e:
            return f"damaged tar header ({e})"
        for j, member in zip(rows, found):
            name, size, offset = self.names[j].decode("utf-8"), int(self.sizes[j]), int(self.offsets[j])
            if not member.isreg():
                return f"tar member '{member.name}' is not a regular file"
            if (member.name, member.size, start + member.offset_data) != (name, size, offset):
                return (f"tar header names '{member.name}' ({member.size} bytes at {start + member.offset_data}), "
                        f"index says '{name}' ({size} at {offset})")
        if len(found) != len(rows):
            return f"the tar holds {len(found)} member(s) in this sample's bytes, the index lists {len(rows)}"
        return None


def _gap_damage(gap: int) -> str | None:
    """Why ``gap`` bytes between a sample's last member (with its padding) and the next sample
    are damage: tar readers read what the index skips, or find a header where padding should be."""
    if gap > 0:
        return (f"{gap} bytes after this sample that the index does not describe "
                "(tar readers read them as members or the end of the archive)")
    if gap < 0:
        return f"the next sample starts {-gap} bytes before this sample's last member's tar padding ends"
    return None


def _member_names(index: ShardIndex) -> list[bytes]:
    """Each member's tar name as the index gives it (``<key>.<field>``, UTF-8), in member order."""
    fields = [name.encode("utf-8") for name in index.fields]
    counts = np.diff(index.rows["first_member"].astype(np.int64)).tolist()
    keys = index.key_table()
    return [b"%s.%s" % (key, fields[field]) for key, field in
            zip((key for key, count in zip(keys, counts) for _ in range(count)), index.members["field"].tolist())]
