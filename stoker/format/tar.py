"""Tar member framing. Shards are POSIX (pax/ustar) tar files that any tar reader accepts.

We frame members ourselves rather than through ``tarfile.TarFile.addfile`` because the writer must
know each member's data offset for the index; the headers themselves come from ``tarfile.TarInfo``.
Headers are deterministic (mtime 0, uid/gid 0, mode 0644) so that the same input gives the same bytes.
"""

from __future__ import annotations

import tarfile

import numpy as np

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


def member_header(name: str, size: int) -> bytes:
    """Header block(s) for a regular file member; pax extended headers only for long or non-ASCII names."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def padding(size: int) -> bytes:
    """Zero bytes that round a member of ``size`` bytes up to a whole block."""
    return b"\0" * (-size % BLOCK)


def end_of_archive(offset: int) -> bytes:
    """Two zero blocks, then zeros up to a whole record, as tar writers do."""
    end = offset + 2 * BLOCK
    return b"\0" * (2 * BLOCK + (-end % RECORD))


def framed(headers: np.ndarray, names: list[bytes], sizes: np.ndarray) -> np.ndarray:
    """Which header blocks (rows of ``headers``, uint8, 512 wide) frame a member named
    ``names[i]`` (UTF-8) of ``sizes[i]`` bytes as :func:`member_header` writes it, as far as a tar
    reader cares: that name and size, a regular file, an intact header checksum. Vectorised
    over a shard's members. A False may still be valid tar of another layout (pax headers for
    long or non-ASCII names, another writer's number format) for :mod:`tarfile` to judge."""
    sizes = sizes.astype(np.int64)
    plain = np.array([len(name) <= 100 and name.isascii() for name in names], bool)  # else pax headers
    name_fields = np.array(names, dtype="S100").view(np.uint8).reshape(-1, 100)
    size_digits = ((sizes[:, None] >> (3 * np.arange(10, -1, -1))) & 7) + ord("0")  # "%011o\0"
    stored_sum = headers[:, 148:154].astype(np.int64) - ord("0")  # "%06o\0 "
    header_sum = headers.sum(1, dtype=np.int64) - headers[:, 148:156].sum(1, dtype=np.int64) + 8 * ord(" ")
    return (plain & (sizes < 8**11) & (headers[:, :100] == name_fields).all(1)
            & (headers[:, 124:135] == size_digits).all(1) & (headers[:, 135] == 0)
            & (headers[:, 156] == ord(tarfile.REGTYPE)) & (headers[:, 345] == 0)  # no ustar name prefix
            & ((stored_sum >= 0) & (stored_sum < 8)).all(1) & (headers[:, 154] == 0)
            & (stored_sum @ (8 ** np.arange(5, -1, -1)) == header_sum))
