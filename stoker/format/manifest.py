"""The manifest ``stoker.json``: what a data set holds and how it was made. JSON only, never pickle."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from stoker.errors import FormatError
from stoker.format.layout import FORMAT_VERSION, MANIFEST_NAME, atomic_write, check_name, index_name


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its files, its samples ``[start, start + count)`` and the checksums of both files."""

    name: str
    start: int
    count: int
    bytes: int
    checksum: str
    index_bytes: int
    index_checksum: str

    @property
    def index(self) -> str:
        """File name of this shard's index."""
        return index_name(self.name)


@dataclass
class Manifest:
    """Parsed manifest. ``schema`` maps each field name to its kind (``image``, ``class``, ``bytes``)."""

    num_samples: int
    shards: list[ShardEntry]
    schema: dict[str, str]
    classes: list[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    created_by: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def shard_starts(self) -> np.ndarray:
        """``starts[i]`` is the first global sample of shard i; the last entry is ``num_samples``."""
        return np.array([s.start for s in self.shards] + [self.num_samples], dtype=np.int64)

    def digest(self) -> str:
        """The identity of the data: a hash of every shard's name, sample count and checksums, the
        schema and the class names. A copy of the data set (``stoker stage``, an object store) has the
        same digest, other data another; a saved reader position names the data set by it."""
        shards = [(s.name, s.count, s.checksum, s.index_checksum) for s in self.shards]
        return xxhash.xxh3_64_hexdigest(json.dumps([shards, self.schema, self.classes]).encode())

    def to_json(self) -> str:
        """The manifest as written to ``stoker.json``."""
        data = {"format": "stoker", **asdict(self)}
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate; every problem is reported as a FormatError naming ``source``."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise FormatError(f"{source}: not valid JSON: {e}") from e
        if not isinstance(data, dict) or data.get("format") != "stoker":
            raise FormatError(f"{source}: not a stoker manifest")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatError(f"{source}: format version {version!r} is not supported by this stoker "
                              f"(reads version {FORMAT_VERSION})")
        try:
            if not isinstance(data["schema"], dict) or not isinstance(data.get("classes") or [], list):
                raise TypeError("schema must be an object and classes a list")
            shards = [ShardEntry(**s) for s in data["shards"]]
            manifest = cls(
                num_samples=int(data["num_samples"]),
                shards=shards,
                schema={str(k): str(v) for k, v in data["schema"].items()},
                classes=[str(c) for c in data["classes"]] if data.get("classes") is not None else None,
                source=data.get("source", {}),
                created_by=data.get("created_by", {}),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{source}: malformed manifest: {e!r}") from e
        manifest._check(source)
        return manifest

    def _check(self, source: str) -> None:
        expected = 0
        for s in self.shards:
            check_name(s.name)
            if not s.name.endswith(".tar"):
                raise FormatError(f"{source}: shard {s.name!r} is not a .tar file")
            if s.start != expected or s.count < 0:
                raise FormatError(f"{source}: shard {s.name} covers samples from {s.start}, expected {expected}")
            expected += s.count
        if expected != self.num_samples:
            raise FormatError(f"{source}: shards hold {expected} samples, manifest says {self.num_samples}")


def read_manifest(root: str | os.PathLike) -> Manifest:
    """Read and validate ``root/stoker.json``."""
    path = Path(root) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(f"{root}: no {MANIFEST_NAME} here; not a stoker data set (or packing did not finish)") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot read manifest: {e.strerror or e}") from e
    return Manifest.from_json(text, str(path))


def write_manifest(root: str | os.PathLike, manifest: Manifest) -> None:
    """Write the manifest atomically; packing does this last, once every shard is complete."""
    atomic_write(Path(root) / MANIFEST_NAME, manifest.to_json().encode("utf-8"))
