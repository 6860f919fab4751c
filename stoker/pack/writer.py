"""ShardWriter: writes one shard and its index under temporary names, then renames both into place."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from stoker.format import FileChecksum, IndexBuilder, ShardEntry, index_name, member_checksum
from stoker.format.tar import end_of_archive, member_header, padding


@dataclass(frozen=True)
class WrittenShard:
    """What a committed shard holds; ``entry.start`` is filled in when the manifest is assembled."""

    entry: ShardEntry
    fields: tuple[str, ...]


class ShardWriter:
    """Appends samples to ``directory/name`` as tar members and builds the index alongside.

    Nothing appears under the final names until :meth:`commit`; a crash or :meth:`abort` leaves
    only temporary files (``.<name>.<pid>-<random>.tmp``), which the next pack removes. The index is renamed
    before the shard, and a reader trusts a shard only once the manifest lists it.
    """

    def __init__(self, directory: str | os.PathLike, name: str) -> None:
        self.directory = Path(directory)
        self.name = name
        # A name of its own per writer: a task orphaned by a killed driver (Ray kills them, but not
        # at once) cannot rename a rerun's half-written file into place, and its own was deleted.
        self._unique = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._tmp = self.directory / f".{name}.{self._unique}.tmp"
        self._file = open(self._tmp, "wb")
        self._offset = 0
        self._checksum = FileChecksum()
        self._index = IndexBuilder()
        self._fields: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._index)

    def add(self, key: str, label: int, members: list[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` holds (field, bytes); they are stored adjacent, in this order."""
        start = self._offset
        rows = []
        for field, data in members:
            header = member_header(f"{key}.{field}", len(data))
            self._write(header)
            rows.append((field, self._offset, len(data), member_checksum(data)))
            self._write(data)
            self._write(padding(len(data)))
            self._fields.setdefault(field)
        self._index.add(key, label, rows, start)

    def commit(self) -> WrittenShard:
        """Finish the tar, write the index, fsync both and rename them into place."""
        samples_end = self._offset
        self._write(end_of_archive(self._offset))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        index_bytes = self._index.to_bytes(samples_end, self._offset)
        index_checksum = FileChecksum()
        index_checksum.update(index_bytes)
        index_tmp = self.directory / f".{index_name(self.name)}.{self._unique}.tmp"
        try:
            with open(index_tmp, "wb") as f:
                f.write(index_bytes)
                f.flush()
                os.fsync(f.fileno())
            os.replace(index_tmp, self.directory / index_name(self.name))
            os.replace(self._tmp, self.directory / self.name)
        except BaseException:
            index_tmp.unlink(missing_ok=True)
            self._tmp.unlink(missing_ok=True)
            raise
        entry = ShardEntry(self.name, 0, len(self._index), self._offset, self._checksum.hexdigest(),
                           len(index_bytes), index_checksum.hexdigest())
        return WrittenShard(entry, tuple(self._fields))

    def abort(self) -> None:
        """Close and delete the temporary file; safe to call more than once, and on a full disk."""
        try:
            self._file.close()
        except OSError:
            pass  # closing flushes the buffer, which fails again on a full disk; the file goes anyway
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._checksum.update(data)
        self._offset += len(data)
