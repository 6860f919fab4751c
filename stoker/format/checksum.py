"""Checksums of the format: xxh3-64 per member (checked on read), xxh3-128 per whole file."""

from __future__ import annotations

import os

import xxhash

FILE_CHECKSUM_ALGORITHM = "xxh3_128"
_CHUNK = 1 << 20


def member_checksum(data: bytes | memoryview) -> int:
    """The checksum stored in the index for one member's bytes."""
    return xxhash.xxh3_64_intdigest(data)


class FileChecksum:
    """Incremental whole-file checksum, fed while a shard is written."""

    def __init__(self) -> None:
        self._hash = xxhash.xxh3_128()

    def update(self, data: bytes | memoryview) -> None:
        """Feed the next bytes of the file."""
        self._hash.update(data)

    def hexdigest(self) -> str:
        """The checksum as the manifest writes it."""
        return f"{FILE_CHECKSUM_ALGORITHM}:{self._hash.hexdigest()}"


def file_checksum(file: str | os.PathLike | int) -> str:
    """Whole-file checksum as written in the manifest (``xxh3_128:<hex>``), of a file by path or of
    an open descriptor (read with ``pread`` from its start: its position and other readers of it are
    left alone; a file unlinked since it was opened is still the one read)."""
    if not isinstance(file, int):
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return file_checksum(fd)
        finally:
            os.close(fd)
    digest = FileChecksum()
    buffer = memoryview(bytearray(_CHUNK))  # one buffer, reused: no private memory grows per call
    offset = 0
    while n := os.preadv(file, [buffer], offset):
        digest.update(buffer[:n])
        offset += n
    return digest.hexdigest()
