"""The last step of every pack (`stoker pack`, and a Spark or Ray Data write: stoker/pack/engine_writes.py):
the rejected-input report, then the manifest of the finished shards, written last (their entries
in shard order, the schema of the fields written, the class names completed, what the source left
out); and PackResult, what a pack returns."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stoker.errors import PackError
from stoker.format import NO_LABEL, REJECTED_NAME, Manifest, ShardEntry, atomic_write, write_manifest
from stoker.format.layout import FRAME_TABLE_FIELD, is_frame_field
from stoker.format.manifest import complete_classes
from stoker.pack.restarts import summarize
from stoker.pack.shard_job import CLASS_FIELD, ShardRecord
from stoker.sources import Source
from stoker.version import __version__


@dataclass(frozen=True)
class PackResult:
    """Summary of a finished pack."""

    dst: Path | str
    num_samples: int
    num_shards: int
    total_bytes: int
    source_bytes: int
    rejected: list[tuple[str, str]]
    reused_shards: int
    seconds: float
    notes: list[tuple[str, str]] = field(default_factory=list)  # accepted inputs with something to report
    skipped_extensions: dict[str, int] = field(default_factory=dict)  # folder files not listed, per extension
    repeated_folders: int = 0  # links to folders already listed, not followed again
    restarts: dict[str, object] | None = None  # restart_rows: images transcoded, kept, and why (see restarts.summarize)


def finish(source: Source, dst: Path, records: list[ShardRecord], reused: int, options: dict, plan_digest: str,
           strict: bool, started: float) -> PackResult:
    """Write the rejected-input report and, last, the manifest of the finished shards."""
    rejected = [r for record in records for r in record.rejected]
    if strict and rejected:  # rejects recorded by an earlier run without --strict
        raise PackError(f"{rejected[0][0]}: {rejected[0][1]} (stopped by --strict)")
    manifest = _assemble_manifest(source, records, options, plan_digest)
    _write_rejected(dst, rejected)
    if manifest.num_samples == 0:
        raise PackError(f"every input was rejected ({len(rejected)}, listed in {dst / REJECTED_NAME}); the first: "
                        f"{rejected[0][0]}: {rejected[0][1]}")
    write_manifest(dst, manifest)
    source_bytes = sum(record.source_bytes for record in records)
    notes = [n for record in records for n in record.notes]
    return PackResult(dst, manifest.num_samples, len(manifest.shards), sum(s.bytes for s in manifest.shards),
                      source_bytes, rejected, reused, time.perf_counter() - started, notes,
                      source.skipped_extensions, source.repeated_folders, manifest.source.get("restart_rows"))


def _assemble_manifest(source: Source, records: list[ShardRecord], options: dict, plan_digest: str) -> Manifest:
    shards, start, fields = [], 0, {}
    for record in records:
        if record.entry is None:
            continue
        shards.append(ShardEntry(**{**asdict(record.entry), "start": start}))
        start += record.entry.count
        fields.update(dict.fromkeys(record.fields))
    schema = {f: _field_kind(f, "video" in options) for f in fields}
    restarts = {}
    if options.get("restart_rows"):
        restarts = {"restart_rows": summarize(sum((Counter(record.restarts) for record in records), Counter()))}
    return Manifest(
        num_samples=start,
        shards=shards,
        schema=schema,
        classes=complete_classes(source.classes, max([int(source.labels.max(initial=NO_LABEL))] +
                                                     [record.max_label for record in records])),
        source={"kind": source.kind, "path": str(source.root), "listed": _inputs_of(records), "options": options,
                "plan": plan_digest, **_not_listed(source), **restarts},
        created_by={"stoker_version": __version__, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    )


def _inputs_of(records: list[ShardRecord]) -> int:
    """How many inputs the shards' jobs were given: each is either written or rejected."""
    return sum(record.entry.count for record in records if record.entry) + sum(len(r.rejected) for r in records)


def _not_listed(source: Source) -> dict[str, Any]:
    """What a folder source left out: files per extension, links to folders already listed."""
    if not source.kind.endswith("_folder"):
        return {}
    return {"skipped_extensions": source.skipped_extensions, "repeated_folders": source.repeated_folders}


def _field_kind(field_name: str, videos: bool) -> str:
    """Every member a pack writes besides the class and a video's frames and frame table is the
    input itself, checked as an image (named after its extension or format: ``jpg``, ``gif``) or
    stored as a video."""
    if field_name == CLASS_FIELD:
        return "class"
    if field_name == FRAME_TABLE_FIELD:
        return "frame_table"
    if is_frame_field(field_name):
        return "frame"
    return "video" if videos else "image"


def _one_cell(text: str) -> str:
    """Tabs and line breaks (in a tar member's name, say) would break the TSV's rows: escaped."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _write_rejected(dst: Path, rejected: list[tuple[str, str]]) -> None:
    lines = ["path\treason"] + [f"{_one_cell(path)}\t{_one_cell(reason)}" for path, reason in rejected]
    atomic_write(dst / REJECTED_NAME, ("\n".join(lines) + "\n").encode("utf-8", "replace"))
