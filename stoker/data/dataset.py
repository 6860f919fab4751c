"""ShardDataset: a map-style torch Dataset over a stoker data set, a drop-in for ImageFolder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch.utils.data

from stoker.data.decode import DecodeMode, decode_image
from stoker.data.readers import ReadBuffer
from stoker.data.shards import DEFAULT_BLOCK_BYTES, DEFAULT_MAX_OPEN_SHARDS, ShardSet
from stoker.data.skips import Skips
from stoker.errors import CorruptDataError, OptionError, StokerError
from stoker.format.manifest import complete_classes
from stoker.ranges import DATASET_DECODE, DATASET_ON_ERROR
from stoker.sources.kinds import described
from stoker.storage.remote import DEFAULT_READ_TIMEOUT
from stoker.storage.settings import StorageSettings


@dataclass(frozen=True)
class ImageReads:
    """The image members of a run of samples (see :meth:`ShardDataset.image_reads`), one entry each."""

    fds: np.ndarray  # int32: the open shard file
    offsets: np.ndarray  # uint64: the member's first byte in it
    sizes: np.ndarray  # uint64
    checksums: np.ndarray | None  # uint64 (xxh3-64, as the index stores it); None: the data set is not verified
    labels: np.ndarray  # int64
    covered: np.ndarray  # bool: described here; the others are read the usual way


class ShardDataset(torch.utils.data.Dataset):
    """Items are ``(image, label)``, as torchvision's ImageFolder gives, read from packed shards.

    ``decode`` picks the image type: ``"pil"`` (RGB PIL image), ``"rgb"`` (HWC uint8 numpy),
    ``"tensor"`` (CHW uint8 tensor) or ``"raw"`` (stored bytes). ``transform`` and
    ``target_transform`` apply as in ImageFolder. Files open lazily in each process and pickling
    carries only the path, so it works with DataLoader workers under fork and spawn.

    Damaged data raises CorruptDataError naming shard and sample. With ``on_error="skip"`` the
    next readable sample is returned instead (stoker/data/skips.py: the Loader's rule too; each
    damaged shard named in one warning per process) and ``skipped`` counts the items so replaced
    (per process). An image above the pixel budget (stoker/pixels.py) is damaged data. Only
    damaged data is skipped: storage that fails (an object store down after every retry, denied
    access: RemoteError) always raises, naming the URL.
    ``verify=False`` skips the per-read checksums. ``field`` picks the image member when samples
    hold several; ``block_bytes`` sets the read-ahead block (see QuasiRandomSampler); at most
    ``max_open_shards`` shards are open per process.

    ``path`` may be an fsspec URL (``s3://bucket/prefix``, ``gs://``, ``https://``): the manifest
    and indexes are fetched once into a local metadata folder and each sample is read by range;
    ``storage_options`` go to fsspec (credentials, ``endpoint_url``). A read cut short is resumed
    from its last good byte and failures retried for up to ``read_timeout`` seconds (an outage
    shorter than that is ridden out; ``inf``: for ever), then a RemoteError names the object, range
    and attempts.
    ``reads_in_flight`` ranged reads run at once per process, ahead of the order, and as parts of
    each whole shard the node cache downloads (``stoker doctor URL`` measures how many fill the link;
    default 16, which a stoker.Loader tunes while it reads: a number given is kept).

    ``cache_dir`` (``/dev/shm/stoker``, a local SSD folder) keeps whole shards on the node, at
    most ``cache_limit`` bytes (default: half the free space there), shared by every worker and
    rank on the node: reads come from a cached copy once it is there. QuasiRandomSampler and
    stoker.Loader stage shards into it ahead, in the order they will read them (``cache_ahead``
    shards at most; default as far as the limit allows); with any other sampler a shard is
    fetched whole on its first read while there is room. Works for a slow local disk as well as
    a URL. When the limit holds only part of the data set, the sampler and Loader shuffle whole
    shards instead of 8 MiB blocks, with as many open at once as fill half the limit. A copy in
    the cache is a local file: stoker.Loader reads it on its native path as it reads local disk.
    These storage arguments are checked once and kept as one ``StorageSettings`` record
    (``shards.settings``), which worker processes receive as one value.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        decode: DecodeMode = "pil",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        verify: bool = True,
        on_error: Literal["raise", "skip"] = "raise",
        field: str | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        cache_ahead: int | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        reads_in_flight: int | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"ShardDataset takes the path or URL of a packed stoker data set, got {described(path)}; "
                              "to read a folder of images, a Dataset or a table, pack it first: "
                              "stoker.loader_for(source, transform, batch_size) packs it once and reads it, "
                              "stoker.pack(source, dst) writes the data set ShardDataset reads")
        DATASET_DECODE.check(decode)
        DATASET_ON_ERROR.check(on_error)
        self.root = os.fspath(path)
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self.on_error = on_error
        self.skipped = 0
        settings = StorageSettings(storage_options=storage_options or {}, read_timeout=read_timeout,
                                   reads_in_flight=reads_in_flight, cache_dir=cache_dir, cache_limit=cache_limit,
                                   cache_ahead=cache_ahead)
        self.shards = ShardSet(path, verify=verify, block_bytes=block_bytes, max_open_shards=max_open_shards,
                               settings=settings)
        schema = self.shards.manifest.schema
        if field is not None and field not in schema:
            raise StokerError(f"{self.root}: no field {field!r} in this data set (fields: {', '.join(schema)})")
        self._image_fields = (field,) if field else tuple(f for f, kind in schema.items() if kind == "image")
        if not self._image_fields:
            raise StokerError(f"{self.root}: the data set has no image field (schema: {schema})")
        self._targets: np.ndarray | None = None
        self._classes: list[str] | None = None
        # packed with --restart-rows: JPEGs carry a restart table the Loader decodes strips with
        self.restart_rows = bool(self.shards.manifest.source.get("options", {}).get("restart_rows"))
        self._skips = Skips(self.shards.starts)

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        n = len(self)
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a data set of {n} samples")
        if self.on_error == "raise":
            return self._load(index)
        found, item = self._skips.first_readable(index, self._load, self.root)
        self.skipped += found != index
        return item

    def read_image(self, index: int, into: ReadBuffer | None = None) -> tuple[bytes | memoryview, int]:
        """The stored (undecoded) image bytes of sample ``index`` and its label; no transform.
        With ``into``, the bytes are read into that reused buffer when they fit (see
        :meth:`ShardReader.read_member`) and a view of it is returned."""
        shard, local = self.shards.locate(index)
        reader = self.shards.reader(shard)
        members = reader.index.sample_members(local)
        fields = reader.index.fields
        member = next((m for m in members if fields[m["field"]] in self._image_fields), None)
        if member is None:
            names = [fields[m["field"]] for m in members]
            raise CorruptDataError(reader.path, reader.index.key(local), f"no image member among {names}")
        return reader.read_member(local, member, into), int(reader.index.labels[local])

    @contextmanager
    def image_reads(self, indices: np.ndarray) -> Iterator[ImageReads]:
        """Where the image bytes of samples ``indices`` are, as arrays, with their shard files held
        open while the block runs: for native code that reads and checks many samples without the
        GIL (stoker/decode/decode_chunk.c). A shard on local disk and a node-cache copy that is
        there are such files (a copy is pinned: one evicted meanwhile is still the copy read).
        Samples it cannot describe so (shards read by range, or not in the node cache yet;
        samples without an image member; a shard that cannot be opened) are left out of
        ``covered`` for the caller to read the usual way, which raises or skips as it says."""
        indices = np.asarray(indices, np.int64)
        n = len(indices)
        reads = ImageReads(np.full(n, -1, np.int32), np.zeros(n, np.uint64), np.zeros(n, np.uint64),
                           np.zeros(n, np.uint64) if self.shards.verify else None, np.zeros(n, np.int64),
                           np.zeros(n, bool))
        shards = np.searchsorted(self.shards.starts, indices, side="right") - 1
        with ExitStack() as held:
            for shard in np.unique(shards):
                try:
                    reader = self.shards.reader(int(shard))
                    fd = held.enter_context(reader.pinned_file())
                except StokerError:  # the usual read names it (and on_error decides)
                    continue
                if fd is None:
                    continue
                mine = np.flatnonzero(shards == shard)
                local = indices[mine] - self.shards.starts[shard]
                rows = reader.index.first_members(self._image_fields)[local]
                found = rows >= 0
                mine, local, members = mine[found], local[found], reader.index.members[rows[found]]
                reads.fds[mine] = fd
                reads.offsets[mine], reads.sizes[mine] = members["offset"], members["size"]
                if reads.checksums is not None:
                    reads.checksums[mine] = members["checksum"]
                reads.labels[mine] = reader.index.labels[local]
                reads.covered[mine] = True
            yield reads

    def decode_error(self, index: int, error: Exception) -> CorruptDataError:
        """The error to raise when sample ``index``'s image does not decode: it names shard and key."""
        shard, _ = self.shards.locate(index)
        return CorruptDataError(self.shards.reader(shard).path, self.key(index),
                                f"image does not decode ({type(error).__name__}: {error})")

    def _load(self, index: int) -> tuple[Any, Any]:
        data, label = self.read_image(index)
        try:
            image = decode_image(data, self.decode)
        except Exception as e:  # Pillow raises many types for bad data
            raise self.decode_error(index, e) from None
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def classes(self) -> list[str]:
        """Class names; index i is label i, as ImageFolder assigns them (sorted folder names). Never
        shorter than the labels need: a label past the manifest's names (none where an earlier
        stoker packed integer labels) is named by its number, label i ``"i"``; a data set without
        labels has none."""
        if self._classes is None:
            self._classes = complete_classes(self.shards.manifest.classes, int(self.targets.max(initial=-1))) or []
        return list(self._classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label, as ImageFolder has it."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label (int64 array), read from the indexes without touching shard data."""
        if self._targets is None:
            self._targets = self.shards.column("label")
        return self._targets

    def key(self, index: int) -> str:
        """The key (WebDataset ``__key__``) of sample ``index``."""
        shard, local = self.shards.locate(index)
        return self.shards.index(shard).key(local)

    def index_of(self, key: str) -> int:
        """Global index of the sample with ``key``; KeyError if there is none."""
        for shard, start in enumerate(self.shards.starts[:-1]):
            local = self.shards.index(shard).find(key)
            if local >= 0:
                return int(start) + local
        raise KeyError(key)

    def read_sample(self, index: int) -> dict[str, bytes]:
        """Every stored member of sample ``index`` as bytes, keyed by field (``jpg``, ``cls``, ...)."""
        return self.shards.read_members(index)

    def close(self) -> None:
        """Close this process's open shard files now (a dataset dropped unclosed closes them when
        collected); reading again opens them again."""
        self.shards.close()

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_targets"] = None
        return state

    def __repr__(self) -> str:
        return f"ShardDataset({self.root!r}, decode={self.decode!r}, samples={len(self)}, classes={len(self.classes)})"
