"""Where the bytes of each input come from: files, rows of Parquet files, members of tar shards,
or items of a map-style Dataset.

A source listing (stoker/sources/) gives each sample a *ref*, a small JSON-able value
that says where its bytes are (a path; a (file, row group, row) triple; a (tar, offset, size, member)
tuple; an index). Shard jobs carry the refs and an ``Inputs`` object, which a worker process or
Ray task uses to read them: ``read`` yields each input's bytes, with its label where the input
carries one, or a BadInput naming what is wrong.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image


class BadInput(Exception):
    """The input cannot be packed; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What a read gives for one input: its bytes and label (None: the listing's label), or why not.
Read = tuple[bytes, int | None] | BadInput

# The JPEG quality of images a Dataset returns decoded (PIL images, arrays), when they are stored.
DATASET_JPEG_QUALITY = 90
IMAGE_KEYS = ("image", "img", "jpg", "png")  # dict items: where the image is (Hugging Face: "image")
LABEL_KEYS = ("label", "labels", "cls")


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
class ParquetRows:
    """Encoded images in a Parquet column (Hugging Face layout: a struct of ``bytes`` and ``path``,
    or plain binary); a ref is (file, row group, row in the group). Each job reads every row
    group it needs once, and only the image column."""

    column: str  # the leaf column holding the bytes, e.g. "image.bytes"
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
                        table = opened[file].read_row_group(group, columns=[self.column]).flatten()
                        column = table.column(self.column)
                        for p in wanted[file, group]:
                            value = column[refs[p][2]].as_py()
                            ready[p] = (bytes(value), None) if value else BadInput("no image bytes in this row")
                    except (OSError, ValueError, KeyError, IndexError) as e:  # pyarrow's errors derive from the first two
                        for p in wanted[file, group]:
                            ready[p] = BadInput(f"cannot read row group {group}: {type(e).__name__}: {e}")
                yield ready.pop(position)
        finally:
            for parquet in opened.values():
                parquet.close()

    def mean_size(self, refs: Sequence[Sequence]) -> float:
        import pyarrow.parquet as pq

        total = rows = 0
        for file in sorted({ref[0] for ref in refs}):
            meta = pq.ParquetFile(file).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                rows += group.num_rows
                total += sum(group.column(c).total_uncompressed_size for c in range(group.num_columns)
                             if group.column(c).path_in_schema == self.column)
        return total / rows if rows else 1.0


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


@dataclass(frozen=True)
class DatasetItems:
    """Items of a map-style Dataset returning ``image``, ``(image, label)`` or a dict with an
    ``image`` (or ``img``) and a ``label`` (or ``labels``) entry, as Hugging Face datasets do; a
    ref is the index.

    The image may be encoded bytes (kept as they are), a PIL image, or a uint8 array or tensor
    (HW, HWC or CHW), which are stored as JPEG (quality ``DATASET_JPEG_QUALITY``; PNG for modes
    JPEG cannot hold). The dataset goes to each worker process once (Ray: once into its object
    store), not with every job.
    """

    dataset: Any
    named = False

    def name(self, ref: int) -> str:
        return f"{type(self.dataset).__name__}[{ref}]"

    def read(self, refs: Sequence[int]) -> Iterator[Read]:
        for index in refs:
            try:
                item = self.dataset[index]
            except Exception as e:  # noqa: BLE001 -- the user's __getitem__ may raise anything
                yield BadInput(f"__getitem__ raised {type(e).__name__}: {e}")
                continue
            try:
                image, label = _image_and_label(item)
                yield encoded(image), _label(label)
            except BadInput as e:
                yield e
            except (OSError, ValueError, TypeError) as e:  # Pillow refusing to encode what it was given
                yield BadInput(f"cannot encode the image ({type(e).__name__}: {e})")

    def mean_size(self, refs: Sequence[int]) -> float:
        sizes = [len(read[0]) for read in self.read(refs[:: max(1, len(refs) // 32)]) if not isinstance(read, BadInput)]
        return float(np.mean(sizes)) if sizes else 1.0


def encoded(image: Any) -> bytes:
    """The image as encoded bytes: bytes as they are; PIL images and uint8 arrays/tensors encoded."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if not isinstance(image, Image.Image):
        image = Image.fromarray(_hwc_uint8(image))
    out = io.BytesIO()
    if image.mode in ("RGB", "L", "CMYK"):
        image.save(out, format="JPEG", quality=DATASET_JPEG_QUALITY)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def _image_and_label(item: Any) -> tuple[Any, Any]:
    if isinstance(item, dict):
        image = next((item[k] for k in IMAGE_KEYS if k in item), None)
        if image is None:
            raise BadInput(f"the item is a dict without an image entry ({', '.join(IMAGE_KEYS)}); it has {sorted(item)}")
        return image, next((item[k] for k in LABEL_KEYS if k in item), None)
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    return item, None


def _hwc_uint8(image: Any) -> np.ndarray:
    array = image.numpy() if hasattr(image, "numpy") else np.asarray(image)
    if array.dtype != np.uint8:
        raise BadInput(f"image array of {array.dtype}: expected uint8 (or PIL images, or encoded bytes)")
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[2] not in (1, 3):
        array = array.transpose(1, 2, 0)  # CHW, as torchvision tensors are
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise BadInput(f"image array of shape {tuple(array.shape)}: expected HW, HWC or CHW with 1 or 3 channels")
    return np.ascontiguousarray(array)


def _label(label: Any) -> int | None:
    if label is None:
        return None
    try:
        return int(label)
    except (TypeError, ValueError):
        raise BadInput(f"label {label!r} is not an integer") from None
