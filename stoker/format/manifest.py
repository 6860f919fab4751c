"""The manifest ``stoker.json``: what a data set holds and how it was made. JSON only, never pickle.

The manifest checks itself: ``checksum`` is the xxh3-128 of its canonical content (every other
key, see :func:`canonical_json`), written with it, so an edit to class names, counts or the
checksums of the shards is caught when it is read. Manifests written before format 1.1 have
none and are read as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from stoker.errors import FormatError
from stoker.format.checksum import FILE_CHECKSUM_ALGORITHM
from stoker.format.layout import FORMAT_MINOR, FORMAT_VERSION, MANIFEST_NAME, atomic_write, check_name, index_name

CHECKSUM_KEY = "checksum"


def canonical_json(data: dict[str, Any]) -> bytes:
    """The canonical bytes of a manifest's JSON content (``data`` as parsed, or as
    :meth:`Manifest.to_dict` gives it): every key but ``checksum``, keys sorted, no whitespace,
    ASCII. Two manifests with the same content give the same bytes however they were formatted."""
    content = {key: value for key, value in data.items() if key != CHECKSUM_KEY}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def content_checksum(data: dict[str, Any]) -> str:
    """The manifest's self-checksum, ``xxh3_128:<hex>`` of :func:`canonical_json`."""
    return f"{FILE_CHECKSUM_ALGORITHM}:{xxhash.xxh3_128_hexdigest(canonical_json(data))}"


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
    format_minor: int = FORMAT_MINOR

    def shard_starts(self) -> np.ndarray:
        """``starts[i]`` is the first global sample of shard i; the last entry is ``num_samples``."""
        return np.array([s.start for s in self.shards] + [self.num_samples], dtype=np.int64)

    def digest(self) -> str:
        """The identity of the data: a hash of every shard's name, sample count and checksums, the
        schema and the class names. A copy of the data set (``stoker stage``, an object store) has the
        same digest, other data another; a saved reader position names the data set by it."""
        shards = [(s.name, s.count, s.checksum, s.index_checksum) for s in self.shards]
        return xxhash.xxh3_64_hexdigest(json.dumps([shards, self.schema, self.classes]).encode())

    def to_dict(self) -> dict[str, Any]:
        """The manifest's content as plain JSON data, without its checksum."""
        return {"format": "stoker", **asdict(self)}

    def to_json(self) -> str:
        """The manifest as written to ``stoker.json``: its content, then its checksum."""
        data = self.to_dict()
        data[CHECKSUM_KEY] = content_checksum(data)
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, source: str = MANIFEST_NAME, check: bool = True) -> Manifest:
        """Parse and validate; every problem is reported as a FormatError naming ``source``.
        ``check=False`` accepts a manifest whose content does not match its checksum (``stoker
        verify`` reports that itself and goes on to check the shards)."""
        try:
            data = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError too
            raise FormatError(f"{source}: not valid JSON: {e}") from None
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
                format_minor=int(data.get("format_minor", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{source}: malformed manifest: {e!r}") from e
        manifest._check(source)
        if check and (problem := checksum_problem(data)):  # after the checks that say more precisely what is wrong
            raise FormatError(f"{source}: {problem}")
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


def complete_classes(names: Sequence[str] | None, max_label: int) -> list[str] | None:
    """Class names for labels up to ``max_label``: ``names`` (a source's own: folder names, a
    ClassLabel's, string labels sorted), followed by the numbers of any labels past them (``"0"``,
    ``"1"``, ... for integer labels without names), so that a model sized by ``len(classes)`` has an
    output for every label. None where there are neither names nor labels."""
    complete = list(names or [])
    complete += [str(label) for label in range(len(complete), max_label + 1)]
    return complete or None


def checksum_problem(data: dict[str, Any]) -> str | None:
    """Why a parsed manifest's content does not match its checksum, or None: it matches, or it
    has none because an older stoker (format 1.0) wrote it."""
    stored = data.get(CHECKSUM_KEY)
    if stored is None:
        minor = data.get("format_minor", 0)
        return f"no checksum, though format 1.{minor} writes one (edited?)" if minor else None
    try:
        actual = content_checksum(data)
    except ValueError as e:  # NaN or infinity: never written by stoker
        return f"content cannot be checked ({e})"
    if stored != actual:
        return "the content does not match the manifest's checksum: edited or damaged after it was written"
    return None


def read_manifest(root: str | os.PathLike, check: bool = True) -> Manifest:
    """Read and validate ``root/stoker.json`` (``check``: see :meth:`Manifest.from_json`)."""
    path = Path(root) / MANIFEST_NAME
    if Path(root).is_file():
        raise FormatError(f"{root}: a file, not a data set (a folder holding {MANIFEST_NAME}, shard-*.tar and shard-*.idx)")
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(f"{root}: no {MANIFEST_NAME} here; not a stoker data set (or packing did not finish)") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot read manifest: {e.strerror or e}") from e
    return Manifest.from_json(text, str(path), check)


def write_manifest(root: str | os.PathLike, manifest: Manifest) -> None:
    """Write the manifest atomically; packing does this last, once every shard is complete."""
    atomic_write(Path(root) / MANIFEST_NAME, manifest.to_json().encode("utf-8"))
