"""Helpers that damage a packed data set on disk as a failing disk or a hostile tool would."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from stoker.format import file_checksum, read_manifest, write_manifest
from stoker.format.index import HEADER_DTYPE, MEMBER_DTYPE, SAMPLE_DTYPE


def index_sections(data: bytearray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Writable views of an index's bytes: the samples with the closing row, the members, the key table."""
    buffer = np.frombuffer(data, np.uint8)
    header = buffer[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)[0]
    n, m = int(header["num_samples"]), int(header["num_members"])
    rows_end = HEADER_DTYPE.itemsize + (n + 1) * SAMPLE_DTYPE.itemsize
    members_at = rows_end + (-rows_end % 8)
    return (buffer[HEADER_DTYPE.itemsize : rows_end].view(SAMPLE_DTYPE),
            buffer[members_at : members_at + m * MEMBER_DTYPE.itemsize].view(MEMBER_DTYPE),
            buffer[len(data) - int(header["keys_nbytes"]) :])


def edit_index(path: Path, edit) -> None:
    """Apply ``edit(rows, members, keys)`` (the views of :func:`index_sections`) to the index file at ``path``."""
    data = bytearray(path.read_bytes())
    edit(*index_sections(data))
    path.write_bytes(bytes(data))


def insert_gap(shard: bytes, index: bytearray, sample: int, gap: bytes) -> bytes:
    """``shard`` with ``gap`` inserted where sample ``sample`` starts, and ``index`` edited to match
    (the later rows and members moved by its length, the header's shard size grown), as a tool that
    splices bytes into a tar and fixes the index after it would leave them."""
    rows, members, _ = index_sections(index)
    at = int(rows[sample]["start"])
    rows["start"][sample:] += len(gap)
    members["offset"][int(rows[sample]["first_member"]) :] += len(gap)
    np.frombuffer(index, np.uint8)[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)["shard_bytes"] += len(gap)
    return shard[:at] + gap + shard[at:]


def reseal(root: Path) -> None:
    """Recompute the manifest's sizes and checksums over the files as they are now, as a tool that
    "repairs" checksums would: only the files themselves can tell the damage then."""
    manifest = read_manifest(root, check=False)
    manifest.shards = [replace(s, bytes=(root / s.name).stat().st_size, checksum=file_checksum(root / s.name),
                               index_checksum=file_checksum(root / s.index), index_bytes=(root / s.index).stat().st_size)
                       for s in manifest.shards]
    write_manifest(root, manifest)
