"""Rows of a data engine written as shards: one Spark partition, or the blocks one Ray Data write
task is given, become one shard, written by the code `stoker pack` runs for each of its shards
(stoker/pack/shard_job.py: the same image checks, members, tar, index and checksums).

    rows of (image, label, key) cells ──> items, CHUNK_ROWS at a time ──> run_shard_job ──> shard-NNNNNN.tar + .idx
                                                                                      └──> its ShardRecord, to the driver

An image cell holds encoded bytes, or the path of a file the worker reads (as `stoker pack` reads a
CSV list's paths). A label cell holds an integer, or a class name mapped through the class names
the driver fixed before any row was written. A sample's key is its key cell, else its path, else
``shard-NNNNNN/<row>`` (as a Parquet file's rows are keyed ``<file>/<row>``), made safe and unique
within the shard by the rule every source follows (stoker/sources/listing.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError, StokerError
from stoker.format import NO_LABEL, shard_name
from stoker.format.layout import WORK_DIR_NAME
from stoker.pack.options import ImageOptions, pack_options
from stoker.pack.restarts import check_available
from stoker.pack.shard_job import ShardJob, ShardRecord, run_shard_job
from stoker.sources.inputs import BadInput, Files, Read, read_regular_file
from stoker.sources.listing import make_keys
from stoker.storage.publish import Upload

CHUNK_ROWS = 64  # rows a worker holds at once
IMAGE_KINDS = ("bytes", "text")
LABEL_KINDS = ("integer", "text")


def row_image_options(max_side: int | None, quality: int | None, verify_decode: bool,
                      restart_rows: bool) -> ImageOptions:
    """What an engine's write does to each image, each option checked as `stoker pack` checks it."""
    image, _ = pack_options(None, max_side, quality, verify_decode, None, None, None, None, restart_rows)
    if restart_rows:
        check_available()
    return image


@dataclass(frozen=True)
class RowLayout:
    """Which column holds what, and what its cells are: ``paths`` (image cells are paths, else
    encoded bytes), ``label_names`` (label cells are class names, else integers)."""

    image: str
    label: str | None
    key: str | None
    paths: bool
    label_names: bool

    @classmethod
    def of(cls, kinds: dict[str, str], image: str, label: str | None, key: str | None, what: str) -> RowLayout:
        """The layout of rows whose columns have ``kinds`` (``bytes``, ``text``, ``integer``, or the
        type in words); ``what`` names the rows' holder (``the DataFrame``). OptionError names the
        option, the column and what it accepts."""
        for option, name in (("image_column", image), ("label_column", label), ("key_column", key)):
            if name is not None and name not in kinds:
                unlabelled = "; pass label_column=None for unlabelled rows" if option == "label_column" else ""
                raise OptionError(f"{option}={name!r}: {what} has no such column (it has {', '.join(kinds)})"
                                  f"{unlabelled}")
        if kinds[image] not in IMAGE_KINDS:
            raise OptionError(f"image_column={image!r}: a column of {kinds[image]}; it must hold encoded images "
                              "(binary: a file's bytes, kept as they are) or their paths (string)")
        if label is not None and kinds[label] not in LABEL_KINDS:
            raise OptionError(f"label_column={label!r}: a column of {kinds[label]}; it must hold integer labels "
                              "or class names (string)")
        return cls(image, label, key, kinds[image] == "text", label is not None and kinds[label] == "text")

    def check_classes(self, classes: Sequence[str] | None) -> None:
        """OptionError where the labels and ``classes`` do not go together: class names in the
        label column need ``classes`` (their order is the labels'), and ``classes`` needs labels."""
        if self.label is None and classes is not None:
            raise OptionError("classes= names the labels, but label_column=None: give the label column too")
        if self.label_names and classes is None:
            raise OptionError(f"label_column={self.label!r} holds class names: give classes=, the names in label "
                              f"order (e.g. classes=sorted(ds.unique({self.label!r})))")


@dataclass(frozen=True)
class RowBytes:
    """Encoded images in the rows' image cells; a ref is (where the row is, its cell)."""

    named = False

    def name(self, ref: tuple[str, Any]) -> str:
        return ref[0]

    def read(self, refs: Sequence[tuple[str, Any]]) -> Iterator[Read]:
        for _, cell in refs:
            yield (bytes(cell), None) if cell else BadInput("no image bytes in this row (null or empty)")

    def mean_size(self, refs: Sequence[tuple[str, Any]]) -> float:
        sizes = [len(cell) for _, cell in refs if cell]
        return float(np.mean(sizes)) if sizes else 1.0


@dataclass(frozen=True)
class RowPaths:
    """Paths of image files in the rows' image cells, read by the worker as a CSV list's paths
    are; a ref is (where the row is, its cell)."""

    named = True

    def name(self, ref: tuple[str, Any]) -> str:
        return str(ref[1]) if ref[1] else ref[0]

    def read(self, refs: Sequence[tuple[str, Any]]) -> Iterator[Read]:
        for _, cell in refs:
            try:
                yield (read_regular_file(cell), None) if cell else BadInput("no path in this row (null or empty)")
            except BadInput as e:
                yield e

    def mean_size(self, refs: Sequence[tuple[str, Any]]) -> float:
        return Files().mean_size([str(cell) for _, cell in refs if cell])


@dataclass(frozen=True)
class RowShards:
    """What a worker needs to write rows as a shard (pickled to Spark executors and Ray tasks).
    ``classes``: the class names, in label order; ``where`` names a shard's rows in messages
    (``partition`` 3, row 17); ``dst`` and ``upload`` as in a ShardJob."""

    layout: RowLayout
    classes: tuple[str, ...] | None
    dst: str
    image: ImageOptions
    strict: bool
    upload: Upload | None
    where: str

    def write(self, number: int, rows: Iterable[Sequence[Any]]) -> ShardRecord | StokerError:
        """Write ``rows`` of (image, label, key) cells as shard ``number``. A StokerError (a bad
        input under ``strict``, a label without its class, a full disk) is returned, not raised:
        the driver raises it as itself, where the engine would have wrapped it in its own error."""
        job = ShardJob(shard_name(number), [], "", self.dst, str(Path(self.dst) / WORK_DIR_NAME), self.image,
                       self.strict, upload=self.upload, inputs=RowPaths() if self.layout.paths else RowBytes())
        try:
            return run_shard_job(job, arriving=self._items(number, iter(rows)))
        except StokerError as e:
            return e

    def _items(self, number: int, rows: Iterator[Sequence[Any]]) -> Iterator[list[tuple]]:
        """The rows as shard items (ref, key, label), CHUNK_ROWS at a time."""
        stem = shard_name(number).removesuffix(".tar")
        index = {name: i for i, name in enumerate(self.classes or ())}
        seen: set[str] = set()
        start = 0
        while chunk := list(islice(rows, CHUNK_ROWS)):
            places = [f"{self.where} {number}, row {start + n}" for n in range(len(chunk))]
            keys = make_keys([self._key_text(cells, f"{stem}/{start + n:09d}") for n, cells in enumerate(chunk)], seen)
            labels = [self._label(cells[1], place, index) for cells, place in zip(chunk, places)]
            yield [((place, cells[0]), key, label) for cells, place, key, label in zip(chunk, places, keys, labels)]
            start += len(chunk)

    def _key_text(self, cells: Sequence[Any], default: str) -> str:
        """What make_keys makes the key of: the key cell or the default with an extension for it
        to drop (a key's own dots stay, as underscores), or the path."""
        if self.layout.key is not None and cells[2] is not None:
            return f"{cells[2]}.x"
        return str(cells[0]) if self.layout.paths and cells[0] else f"{default}.x"

    def _label(self, cell: Any, place: str, index: dict[str, int]) -> int:
        """The label stored for a label cell: NO_LABEL without a label column, a class name's
        index, or the integer (within ``classes`` when they are given)."""
        column = self.layout.label
        if column is None:
            return NO_LABEL
        if cell is None:
            raise PackError(f"{place}: no label (null in column {column!r}); label every row, or pass "
                            "label_column=None for unlabelled rows")
        if self.layout.label_names:
            if cell not in index:
                shown = ", ".join(list(index)[:5]) + (", ..." if len(index) > 5 else "")
                raise PackError(f"{place}: label {cell!r} is not one of the classes ({shown})")
            return index[cell]
        try:
            label = int(cell)
        except ValueError:
            raise PackError(f"{place}: label {cell!r} in column {column!r} is not an integer") from None
        if self.classes is not None and not 0 <= label < len(self.classes):
            raise PackError(f"{place}: label {label} has no class name (classes= holds {len(self.classes)})")
        return label
