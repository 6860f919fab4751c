"""Where the bytes of each input come from: the Inputs protocol, files and members of tar shards
(rows of tables: stoker/sources/rows.py; items of a map-style Dataset: stoker/sources/items.py).

A source listing (stoker/sources/) gives each sample a *ref*, a small JSON-able value
that says where its bytes are (a path; a (file, row group, row) triple; a (tar, offset, size, member)
tuple; an index). Shard jobs carry the refs and an ``Inputs`` object, which a worker process or
Ray task uses to read them: ``read`` yields each input's bytes, with its label where the input
carries one, or a BadInput naming what is wrong.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class BadInput(Exception):
    """The input cannot be packed; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What a read gives for one input: its bytes and label (None: the listing's label), or why not.
Read = tuple[bytes, int | None] | BadInput


class Inputs(Protocol):
    """How a shard job reads its inputs."""

    named: bool  # whether name(ref) ends in the input's own file extension (a member field is named after it)

    def name(self, ref: Any) -> str:
        """How messages and the rejected-input report name the input."""

    def read(self, refs: Sequence[Any]) -> Iterator[Read]:
        """The inputs, in order; one BadInput per input that cannot be read."""

    def mean_size(self, refs: Sequence[Any]) -> float:
        """Mean stored size of a spread sample of inputs, to plan shard sizes."""


@dataclass(frozen=True)
class Files:
    """Inputs that are files; a ref is the path."""

    named = True

    def name(self, ref: str) -> str:
        return ref

    def read(self, refs: Sequence[str]) -> Iterator[Read]:
        for path in refs:
            try:
                yield read_regular_file(path), None
            except BadInput as e:
                yield e

    def mean_size(self, refs: Sequence[str]) -> float:
        sizes = [os.path.getsize(path) for path in refs if os.path.isfile(path)]
        return float(np.mean(sizes)) if sizes else 1.0


def read_regular_file(path: str | os.PathLike) -> bytes:
    """The bytes of the file at ``path``; BadInput when it cannot be read, or is not a regular
    file: a FIFO, socket or device, or a link to one, is refused after a stat, without being
    opened (reading a FIFO waits forever for a writer, /dev/zero never ends, opening some
    devices acts on them)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise BadInput(f"not a regular file: {file_kind(path)}")
        with open(path, "rb") as f:
            return f.read()
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path (a Dataset's or a Parquet file's)
        raise BadInput(f"cannot read: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None


def file_kind(path: str | os.PathLike) -> str:
    """What ``path`` is, in words, for a message: ``a FIFO (named pipe)``, ``a symbolic link to a
    character device (/dev/zero)``, ``missing`` ..."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot stat: {e.strerror or e}"
    kinds = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    kind = next((name for test, name in kinds if test(mode)), "not a file")
    return f"a symbolic link to {kind} ({os.path.realpath(path)})" if os.path.islink(path) else kind


@dataclass(frozen=True)
class TarMembers:
    """Images inside tar files (WebDataset shards); a ref is (tar path, data offset, size, member
    name), with offset -1 for a sample that has no image member."""

    named = True

    def name(self, ref: Sequence) -> str:
        return f"{ref[0]}:{ref[3]}"

    def read(self, refs: Sequence[Sequence]) -> Iterator[Read]:
        handles: dict[str, Any] = {}
        try:
            for tar, offset, size, _ in refs:
                if offset < 0:
                    yield BadInput("the sample has no image member")
                    continue
                try:
                    if tar not in handles:
                        handles[tar] = open(tar, "rb")
                    handles[tar].seek(offset)
                    data = handles[tar].read(size)
                except OSError as e:
                    yield BadInput(f"cannot read: {e.strerror or e}")
                    continue
                yield (data, None) if len(data) == size else BadInput(f"truncated tar: {len(data)} of {size} bytes")
        finally:
            for handle in handles.values():
                handle.close()

    def mean_size(self, refs: Sequence[Sequence]) -> float:
        sizes = [size for _, offset, size, _ in refs if offset >= 0]
        return float(np.mean(sizes)) if sizes else 1.0
