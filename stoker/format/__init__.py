"""The stoker shard format: tar shards, binary indexes and a JSON manifest (see docs/format.md).

This package owns the on-disk layout; everything else reads and writes through it.
"""

from stoker.format.checksum import FileChecksum, file_checksum, member_checksum
from stoker.format.index import NO_LABEL, IndexBuilder, ShardIndex
from stoker.format.layout import (
    DEFAULT_SHARD_BYTES,
    FORMAT_VERSION,
    MANIFEST_NAME,
    REJECTED_NAME,
    atomic_write,
    check_name,
    index_name,
    shard_name,
)
from stoker.format.manifest import Manifest, ShardEntry, read_manifest, write_manifest

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "NO_LABEL",
    "REJECTED_NAME",
    "FileChecksum",
    "IndexBuilder",
    "Manifest",
    "ShardEntry",
    "ShardIndex",
    "atomic_write",
    "check_name",
    "file_checksum",
    "index_name",
    "member_checksum",
    "read_manifest",
    "shard_name",
    "write_manifest",
]
