"""The binary index stored beside each shard: numpy structured arrays, memory-mapped when read.

Layout (little endian, every section 8-byte aligned)::

    header    HEADER_DTYPE, 64 bytes
    samples   SAMPLE_DTYPE x (num_samples + 1)   label, first member, key offset, byte start;
                                                 a last sentinel row closes every range
    members   MEMBER_DTYPE x num_members          data offset, size, xxh3-64 and field of each member
    fields    field names, UTF-8, each followed by NUL
    keys      NUL, then each sample key, UTF-8, followed by NUL

Sample i's members are ``members[first_member[i]:first_member[i + 1]]``, its key is
``keys[key_offset[i]:key_offset[i + 1] - 1]`` and its bytes in the tar are
``start[i]:start[i + 1]``: ends are the next row's starts, so nothing is stored twice (about
90 bytes per image sample with its class member). The index gives O(1) access to any member without scanning the tar,
and labels and keys without touching shard data. Worker processes share the mapped pages
instead of copying Python objects, and map only the pages they touch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from stoker.errors import FormatError

INDEX_MAGIC = b"STKIDX\x00\x01"
INDEX_VERSION = 1
NO_LABEL = -1

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("flags", "<u4"),
        ("num_samples", "<u8"),
        ("num_members", "<u8"),
        ("fields_nbytes", "<u8"),
        ("keys_nbytes", "<u8"),
        ("shard_bytes", "<u8"),
        ("reserved", "<u8"),
    ]
)
SAMPLE_DTYPE = np.dtype(
    [
        ("label", "<i8"),
        ("first_member", "<u4"),  # counts within one shard: 32 bits are plenty
        ("key_offset", "<u4"),
        ("start", "<u8"),  # first byte of the sample's first tar header
    ]
)
MEMBER_DTYPE = np.dtype(
    [
        ("offset", "<u8"),  # first byte of the member's data, past its header
        ("size", "<u8"),
        ("checksum", "<u8"),
        ("field", "<u4"),
    ]
)


def _aligned(n: int) -> int:
    return n + (-n % 8)


class ShardIndex:
    """Read access to one shard's index; arrays are views of the mapped file.

    Opening checks only what is O(1) (magic, version, section sizes, the sentinel row), so a
    worker maps just the pages it reads; :meth:`check` validates every row (``stoker verify``).
    """

    def __init__(self, buffer: np.ndarray, source: str) -> None:
        self.source = source
        # A plain ndarray view of the mapping: indexing np.memmap costs several times more per call.
        self.buffer = buffer = buffer.view(np.ndarray)
        if buffer.nbytes < HEADER_DTYPE.itemsize:
            raise FormatError(f"{source}: index too short ({buffer.nbytes} bytes)")
        header = buffer[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)[0]
        if header["magic"] != INDEX_MAGIC:
            raise FormatError(f"{source}: not a stoker index (bad magic)")
        if header["version"] != INDEX_VERSION:
            raise FormatError(f"{source}: index version {header['version']} is not supported (want {INDEX_VERSION})")
        n, m = int(header["num_samples"]), int(header["num_members"])
        fields_nbytes, keys_nbytes = int(header["fields_nbytes"]), int(header["keys_nbytes"])
        pos = HEADER_DTYPE.itemsize
        sections = []
        for nbytes in ((n + 1) * SAMPLE_DTYPE.itemsize, m * MEMBER_DTYPE.itemsize, fields_nbytes, keys_nbytes):
            sections.append((pos, pos + nbytes))
            pos = _aligned(pos + nbytes)
        if sections[-1][1] != buffer.nbytes:
            raise FormatError(f"{source}: index is {buffer.nbytes} bytes, header describes {sections[-1][1]}")
        (s0, s1), (m0, m1), (f0, f1), (k0, k1) = sections
        self.shard_bytes = int(header["shard_bytes"])
        self.rows = buffer[s0:s1].view(SAMPLE_DTYPE)
        self.samples = self.rows[:-1]
        self._first_member = self.rows["first_member"]
        self.members = buffer[m0:m1].view(MEMBER_DTYPE)
        try:
            self.fields: tuple[str, ...] = tuple(x.decode("utf-8") for x in buffer[f0:f1].tobytes().split(b"\0")[:-1])
        except UnicodeDecodeError:
            raise FormatError(f"{source}: corrupt index: field names are not UTF-8") from None
        self._keys = buffer[k0:k1]
        self._first_members: dict[tuple[str, ...], np.ndarray] = {}
        end = self.rows[-1]
        if int(end["first_member"]) != m or int(end["key_offset"]) != keys_nbytes or int(end["start"]) > self.shard_bytes:
            raise FormatError(f"{source}: corrupt index: the closing row does not match the header")

    @classmethod
    def open(cls, path: str | os.PathLike) -> ShardIndex:
        """Memory-map the index file at ``path``."""
        path = os.fspath(path)
        try:
            size = os.path.getsize(path)
            buffer = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        except OSError as e:
            raise FormatError(f"{path}: cannot open index: {e.strerror or e}") from e
        return cls(buffer, path)

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> ShardIndex:
        """An index held in memory (``source`` names it in errors)."""
        return cls(np.frombuffer(data, dtype=np.uint8), source)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label (a view of the mapped file)."""
        return self.samples["label"]

    def key(self, i: int) -> str:
        """Key of sample ``i`` of this shard."""
        start, end = int(self.rows[i]["key_offset"]), int(self.rows[i + 1]["key_offset"]) - 1
        return self._keys[start:end].tobytes().decode("utf-8")

    def find(self, key: str) -> int:
        """Position of the sample with this key in the shard, or -1 (a linear search in C)."""
        pos = self._keys.tobytes().find(b"\0" + key.encode("utf-8") + b"\0")
        if pos < 0:
            return -1
        return int(np.searchsorted(self.samples["key_offset"], pos + 1))

    def sample_members(self, i: int) -> np.ndarray:
        """The member rows of sample ``i``, in tar order."""
        return self.members[int(self._first_member[i]) : int(self._first_member[i + 1])]

    def first_members(self, fields: tuple[str, ...]) -> np.ndarray:
        """For each sample, the row in :attr:`members` of its first member whose field is one of
        ``fields``, or -1 (int64, computed once per ``fields``): lets a reader find many samples'
        members with one array lookup instead of a search per sample."""
        cached = self._first_members.get(fields)
        if cached is None:
            wanted = np.flatnonzero(np.isin(self.members["field"],
                                            [i for i, name in enumerate(self.fields) if name in fields]))
            # each sample's range [start, end) as sample_members slices it, whatever a damaged
            # (unverified) index says: ranges out of order or past the end give what the slice gives
            start, end = self._first_member[:-1].astype(np.int64), self._first_member[1:].astype(np.int64)
            at = np.searchsorted(wanted, start)  # the first wanted row at or after each start
            rows = wanted[np.minimum(at, len(wanted) - 1)] if len(wanted) else np.zeros(len(start), np.int64)
            cached = np.where((at < len(wanted)) & (rows < end), rows, -1).astype(np.int64)
            self._first_members[fields] = cached
        return cached

    def span(self, first: int, last: int) -> tuple[int, int]:
        """Byte range in the shard of samples ``first..last`` (inclusive), headers included."""
        return int(self.rows[first]["start"]), int(self.rows[last + 1]["start"])

    def check(self) -> None:
        """Validate every row, so a damaged index fails here and not as a wild read later."""
        rows, m = self.rows, self.members
        bad = None
        if np.any(np.diff(rows["first_member"].astype(np.int64)) < 0):
            bad = "member ranges are not in order"
        elif np.any(np.diff(rows["key_offset"].astype(np.int64)) <= 0) or (len(rows) > 1 and rows[0]["key_offset"] != 1):
            bad = "key table offsets are not in order"
        elif np.any(np.diff(rows["start"].astype(np.int64)) < 0):
            bad = "sample byte spans are not in order"
        elif len(m) and (np.any(m["offset"] > self.shard_bytes) or np.any(m["size"] > self.shard_bytes - m["offset"])):
            bad = "member extends past the end of the shard"
        elif len(m) and m["field"].max() >= len(self.fields):
            bad = "member refers to an unknown field"
        if bad:
            raise FormatError(f"{self.source}: corrupt index: {bad}")


@dataclass
class IndexBuilder:
    """Collects one shard's samples while it is written, then serialises the index."""

    _samples: list[tuple] = field(default_factory=list)
    _members: list[tuple] = field(default_factory=list)
    _fields: dict[str, int] = field(default_factory=dict)
    _keys: bytearray = field(default_factory=lambda: bytearray(b"\0"))

    def add(self, key: str, label: int, members: list[tuple[str, int, int, int]], start: int) -> None:
        """Record a sample starting at byte ``start``; ``members`` holds (field, data offset, size, checksum)."""
        self._samples.append((label, len(self._members), len(self._keys), start))
        self._keys += key.encode("utf-8") + b"\0"
        for name, offset, size, checksum in members:
            field_id = self._fields.setdefault(name, len(self._fields))
            self._members.append((offset, size, checksum, field_id))

    def __len__(self) -> int:
        return len(self._samples)

    def to_bytes(self, samples_end: int, shard_bytes: int) -> bytes:
        """The index file's bytes; ``samples_end`` is where the last sample ends in the shard."""
        fields = b"".join(name.encode("utf-8") + b"\0" for name in self._fields)
        header = np.zeros(1, HEADER_DTYPE)
        header[0] = (INDEX_MAGIC, INDEX_VERSION, 0, len(self._samples), len(self._members),
                     len(fields), len(self._keys), shard_bytes, 0)
        closing = (NO_LABEL, len(self._members), len(self._keys), samples_end)
        parts = [
            header.tobytes(),
            np.array(self._samples + [closing], dtype=SAMPLE_DTYPE).tobytes(),
            np.array(self._members, dtype=MEMBER_DTYPE).tobytes(),
            fields,
            bytes(self._keys),
        ]
        return b"".join(p + b"\0" * (-len(p) % 8) for p in parts[:-1]) + parts[-1]
