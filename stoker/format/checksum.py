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


def file_checksum(path: str | os.PathLike) -> str:
    """Whole-file checksum as written in the manifest (``xxh3_128:<hex>``)."""
    digest = FileChecksum()
    buffer = memoryview(bytearray(_CHUNK))  # one buffer, reused: no private memory grows per call
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(buffer[:n])
    return digest.hexdigest()
