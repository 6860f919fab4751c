"""Inputs that are rows of a table: row groups of Parquet files, or rows of a table held in memory
or mapped (a pyarrow Table, a pandas DataFrame converted to one, a Hugging Face Dataset).

A row's image is its encoded bytes as stored (never decoded and encoded again) or, where the
row holds a path instead (Hugging Face's ``Image(decode=False)`` items, ``to_parquet`` output of
images that were files, a column of file paths), the file at that path, read as CSV path lists
are read. Only the image column is read here; the labels were read when the source was listed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.sources.columns import TableColumns
from stoker.sources.inputs import BadInput, Read, read_regular_file

_ROWS_PER_READ = 64  # rows of an in-memory table taken at once: a bounded copy of their images
_SIZE_SAMPLE = 32  # rows read to estimate the mean image size where the file's metadata cannot say
_NO_BYTES = 16  # mean stored bytes per row below which a Parquet image column holds paths, not images


def image_at(data: bytes | None, path: str | None, base: str) -> Read:
    """A row's image: its ``data``, else the file at ``path`` (relative to ``base``)."""
    if data:
        return bytes(data), None
    if path:
        full = os.path.join(base, path)
        try:
            return read_regular_file(full), None
        except BadInput as e:
            return BadInput(f"{full}: {e.reason}")
    return BadInput("no image in this row (no bytes, no path)")


def _cells(table: Any, columns: TableColumns) -> tuple[list, list]:
    """The bytes and the paths of a table's rows (None where the column has none)."""
    if columns.kind == "binary":
        data = table.column(columns.image).to_pylist()
        return data, [None] * len(data)
    if columns.kind == "path":
        paths = table.column(columns.image).to_pylist()
        return [None] * len(paths), paths
    flat = table.select([columns.image]).flatten()
    data = flat.column(f"{columns.image}.bytes").to_pylist()
    has_path = f"{columns.image}.path" in flat.column_names
    return data, flat.column(f"{columns.image}.path").to_pylist() if has_path else [None] * len(data)


@dataclass(frozen=True)
class ParquetRows:
    """Images in a Parquet column; a ref is (file, row group, row in the group). Each job reads
    every row group it needs once, and only the image column; a relative path is relative to
    the Parquet file's folder."""

    columns: TableColumns
    named = False

    def name(self, ref: Sequence) -> str:
        file, group, row = ref
        return f"{file}[row group {group}, row {row}]"

    def read(self, refs: Sequence[Sequence]) -> Iterator[Read]:
        import pyarrow.parquet as pq

        # Each row group this job needs is read once, when its first row is due, and the rows the
        # job wants from it kept until yielded: refs in listing order hold one group at a time,
        # refs of a shuffled pack at most the job's own rows (a shard's worth).
        wanted: dict[tuple[str, int], list[int]] = {}
        for position, (file, group, _) in enumerate(refs):
            wanted.setdefault((file, group), []).append(position)
        ready: dict[int, Read] = {}
        opened: dict[str, Any] = {}  # each file's footer parsed once per job, not once per row group
        try:
            for position, (file, group, _) in enumerate(refs):
                if position not in ready:
                    try:
                        if file not in opened:
                            opened[file] = pq.ParquetFile(file)
                        data, paths = _cells(opened[file].read_row_group(group, columns=[self.columns.image]),
                                             self.columns)
                        for p in wanted[file, group]:
                            row = refs[p][2]
                            ready[p] = image_at(data[row], paths[row], os.path.dirname(file))
                    except (OSError, ValueError, KeyError, IndexError) as e:  # pyarrow's errors derive from the first two
                        for p in wanted[file, group]:
                            ready[p] = BadInput(f"cannot read row group {group}: {type(e).__name__}: {e}")
                yield ready.pop(position)
        finally:
            for parquet in opened.values():
                parquet.close()

    def mean_size(self, refs: Sequence[Sequence]) -> float:
        """From the files' metadata; from a few rows read where the rows hold paths, not images."""
        import pyarrow.parquet as pq

        leaf = f"{self.columns.image}.bytes" if self.columns.kind == "struct" else self.columns.image
        total = rows = 0
        for file in sorted({ref[0] for ref in refs}):
            meta = pq.ParquetFile(file).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                rows += group.num_rows
                total += sum(group.column(c).total_uncompressed_size for c in range(group.num_columns)
                             if group.column(c).path_in_schema == leaf)
        if rows and total / rows >= _NO_BYTES:
            return total / rows
        return _mean_read_size(self, refs)


@dataclass(frozen=True)
class TableRows:
    """Images in a column of a pyarrow Table or a Hugging Face Dataset (read through Arrow, so the
    stored bytes come as they are and the Dataset's format and transform do not apply); a ref is
    the row. ``what`` names the table in messages, ``base`` is where relative paths are. The table
    goes to each worker process once (Ray: once into its object store), not with every job."""

    table: Any
    columns: TableColumns
    what: str
    base: str
    named = False

    def name(self, ref: int) -> str:
        return f"{self.what}[{ref}]"

    def read(self, refs: Sequence[int]) -> Iterator[Read]:
        for start in range(0, len(refs), _ROWS_PER_READ):
            rows = [int(ref) for ref in refs[start : start + _ROWS_PER_READ]]
            try:
                data, paths = _cells(self._take(rows), self.columns)
            except (OSError, ValueError, KeyError, IndexError) as e:  # pyarrow's errors derive from the first two
                for _ in rows:
                    yield BadInput(f"cannot read the row: {type(e).__name__}: {e}")
                continue
            for cell, path in zip(data, paths):
                yield image_at(cell, path, self.base)

    def _take(self, rows: list[int]) -> Any:
        import pyarrow as pa

        if isinstance(self.table, pa.Table):
            return self.table.select([self.columns.image]).take(pa.array(rows, pa.int64()))
        return self.table.with_format("arrow", columns=[self.columns.image])[rows]  # a Hugging Face Dataset

    def mean_size(self, refs: Sequence[int]) -> float:
        return _mean_read_size(self, refs)


def _mean_read_size(inputs: ParquetRows | TableRows, refs: Sequence[Any]) -> float:
    """The mean size of the images of a few rows spread over ``refs``."""
    spread = [refs[i] for i in np.unique(np.linspace(0, len(refs) - 1, min(_SIZE_SAMPLE, len(refs))).astype(int))]
    sizes = [len(read[0]) for read in inputs.read(spread) if not isinstance(read, BadInput)]
    return float(np.mean(sizes)) if sizes else 1.0
