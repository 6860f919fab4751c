"""Tar member framing. Shards are POSIX (pax/ustar) tar files that any tar reader accepts.

We frame members ourselves rather than through ``tarfile.TarFile.addfile`` because the writer must
know each member's data offset for the index; the headers themselves come from ``tarfile.TarInfo``.
Headers are deterministic (mtime 0, uid/gid 0, mode 0644) so that the same input gives the same bytes.
"""

from __future__ import annotations

import tarfile

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
