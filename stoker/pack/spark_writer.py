"""pack_spark: a Spark DataFrame of images written as stoker shards, one per partition, each by the
executor that holds it: what Databricks' ``dataframe_to_mds`` does for MosaicML Streaming.

    driver     column types checked; class names (one distinct() job, for string labels); destination
    executors  rdd.mapPartitionsWithIndex: partition i's rows ──> shard-<i>.tar + .idx (stoker/pack/rows.py)
    driver     the records in partition order ──> rejected.tsv, stoker.json last (stoker/pack/engine_writes.py)

pyspark is imported here only: ``import stoker`` never loads it (the ``spark`` extra).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

try:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
except ModuleNotFoundError as e:
    raise ModuleNotFoundError("stoker.pack_spark needs pyspark: pip install 'stoker[spark]'", name=e.name) from None

from stoker.errors import OptionError, StokerError
from stoker.pack.engine_writes import EngineWrite
from stoker.pack.finish import PackResult
from stoker.pack.rows import RowLayout, RowShards, row_image_options
from stoker.pack.shard_job import ShardRecord
from stoker.sources.listing import parse_labels


def pack_spark(df: DataFrame, dst: str | os.PathLike, *, image_column: str = "image",
               label_column: str | None = "label", key_column: str | None = None,
               classes: Sequence[str] | None = None, max_side: int | None = None, quality: int | None = None,
               verify_decode: bool = False, restart_rows: bool = False, strict: bool = False,
               storage_options: dict[str, Any] | None = None) -> PackResult:
    """Write the rows of ``df`` as a stoker data set in ``dst``, one shard per partition (choose
    the shards' size with ``df.repartition(n)``), in partition order: the shards `stoker pack`
    writes from the same rows (the same checks, members and index; the options are pack's).

    ``image_column`` holds encoded images (binary, kept as they are) or paths every executor can
    read (string); a struct's field is named with a dot (``image.bytes``, as Hugging Face writes).
    ``label_column`` holds integers or class names (string: indexed in sorted order, as `stoker
    pack` indexes them, unless ``classes`` gives their order); None for unlabelled rows.
    ``key_column``: each sample's key (default: its path, or ``shard-NNNNNN/<row>``).

    ``dst`` must be a folder every executor shares, or an fsspec URL (``s3://...``,
    ``storage_options`` for fsspec). Bad images are left out and listed in ``rejected.tsv``
    (``strict``: the first stops the write). The manifest is written last, by the driver; a
    rerun after a failure writes every shard again. OptionError before anything runs, PackError
    naming the partition and row, or the folder, after.
    """
    started = time.perf_counter()
    image = row_image_options(max_side, quality, verify_decode, restart_rows)
    layout = RowLayout.of(_kinds(df, (image_column, label_column, key_column)), image_column, label_column,
                          key_column, "the DataFrame")
    layout, names = _labels(df, layout, tuple(classes) if classes is not None else None)
    write = EngineWrite(os.fspath(dst), "spark_dataframe", "pyspark.sql.DataFrame", "the DataFrame",
                        dict(storage_options or {}))
    options = write.options("spark", (image_column, label_column, key_column), image)
    with write.opened():
        shards = RowShards(layout, names, str(write.local), image, strict, write.upload, "partition")

        def partition(number: int, rows: Iterable[Any]) -> list[ShardRecord | StokerError]:
            return [shards.write(number, rows)]

        cells = [F.col(name) if name else F.lit(None) for name in (layout.image, layout.label, layout.key)]
        results = df.select(*cells).rdd.mapPartitionsWithIndex(partition).collect()
        return write.commit(results, names, options, strict, started)


def _kinds(df: DataFrame, wanted: Iterable[str | None]) -> dict[str, str]:
    """The kind of each column (see RowLayout.of), and of each wanted struct field (``image.bytes``)."""
    kinds = {f.name: _kind(f.dataType) for f in df.schema.fields}
    for name in wanted:
        if name is not None and name not in kinds:
            data_type: T.DataType = df.schema
            for part in name.split("."):
                if not isinstance(data_type, T.StructType) or part not in data_type.names:
                    break  # not a column: RowLayout.of says so
                data_type = data_type[part].dataType
            else:
                kinds[name] = _kind(data_type)
    return kinds


def _kind(data_type: T.DataType) -> str:
    if isinstance(data_type, T.BinaryType):
        return "bytes"
    if isinstance(data_type, T.StringType):
        return "text"
    if isinstance(data_type, T.IntegralType):
        return "integer"
    return data_type.simpleString()


def _labels(df: DataFrame, layout: RowLayout, given: tuple[str, ...] | None) -> tuple[RowLayout, tuple[str, ...] | None]:
    """The class names, and the layout as the label cells turn out: string labels that are all
    integers are integers, all null is unlabelled (as `stoker pack` reads a list's labels)."""
    column = layout.label
    if column is None or not layout.label_names:
        layout.check_classes(given)
        return layout, given
    found = [row[0] for row in df.select(column).distinct().collect()]
    _, names = parse_labels(["" if value is None else value for value in found],
                            lambda i: f"the DataFrame's column {column!r}")
    if names is None:
        unlabelled = all(value is None for value in found)
        layout = replace(layout, label=None if unlabelled else column, label_names=False)
        layout.check_classes(given)
        return layout, given
    if given is None:
        return layout, tuple(names)
    missing = sorted(set(names) - set(given))
    if missing:
        raise OptionError(f"classes= lacks {', '.join(map(repr, missing[:5]))}, found in the DataFrame's column "
                          f"{column!r}; give every class name, in label order")
    return layout, given
