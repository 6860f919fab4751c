"""One unit of packing work: read, check and write the samples of one planned shard.

Runs in a worker process. The result is also saved as a small JSON record in the work folder,
which is how a rerun after a kill knows the shard is done.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from itertools import repeat
from pathlib import Path
from typing import Any

from stoker.errors import PackError
from stoker.format import NO_LABEL, ShardEntry, atomic_write
from stoker.format.layout import WORK_DIR_NAME
from stoker.pack.images import inspect_image, shrink_image
from stoker.pack.options import ImageOptions, VideoOptions
from stoker.pack.restarts import keep_freed_memory, with_restart_markers
from stoker.pack.writer import ShardWriter
from stoker.sources.inputs import BadInput, Files, Inputs, Read
from stoker.storage.publish import Upload

CLASS_FIELD = "cls"
# The member field of images without a name to take it from (Parquet rows, Dataset items).
FORMAT_FIELDS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff", "PPM": "ppm"}
PROGRESS_EVERY = 32


@dataclass(frozen=True)
class ShardJob:
    """The samples planned for one shard, as (path, key, label) triples (for videos from a list
    with start/end columns: (path, key, label, start, end)), and where it goes. With ``video``
    the inputs are videos, else images. ``inputs`` is None while a job travels to a worker that
    holds them already (the engines send them once per worker and put them back)."""

    name: str
    items: list[tuple]
    digest: str
    dst: str
    work_dir: str
    image: ImageOptions
    strict: bool
    video: VideoOptions | None = None
    upload: Upload | None = None
    inputs: Inputs | None = field(default_factory=Files)

    def given_inputs(self) -> Inputs:
        """``inputs``; ValueError for a job whose inputs were not put back in the worker."""
        if self.inputs is None:
            raise ValueError(f"shard job {self.name}: its inputs were not put back before it ran")
        return self.inputs


@dataclass
class ShardRecord:
    """Outcome of a job: the written shard (None if every input was rejected) and the rejects."""

    name: str
    digest: str
    entry: ShardEntry | None
    source_bytes: int = 0
    fields: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # accepted inputs with something to report
    restarts: dict[str, int] = field(default_factory=dict)  # --restart-rows: images transcoded, and kept by reason
    max_label: int = NO_LABEL  # the largest label written (a Dataset's come with its items): classes cover it

    def save(self, work_dir: str | os.PathLike) -> None:
        """Write the record atomically into the work folder; its presence marks the shard finished."""
        atomic_write(Path(work_dir) / f"{self.name}.json", json.dumps(asdict(self)).encode("utf-8"))

    @classmethod
    def load(cls, work_dir: str | os.PathLike, name: str) -> ShardRecord | None:
        """The saved record, or None if there is none or it does not parse."""
        try:
            data = json.loads((Path(work_dir) / f"{name}.json").read_text(encoding="utf-8"))
            entry = ShardEntry(**data["entry"]) if data["entry"] else None
            return cls(data["name"], data["digest"], entry, data["source_bytes"], data["fields"],
                       [tuple(r) for r in data["rejected"]], [tuple(n) for n in data.get("notes", [])],
                       {str(k): int(v) for k, v in data.get("restarts", {}).items()}, int(data.get("max_label", NO_LABEL)))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def check_sample(name: str, data: bytes, options: ImageOptions, named: bool = True) -> tuple[str, bytes, int, str]:
    """Check one image; return its field name, the bytes to store, the source size and, with
    ``options.restart_rows``, whether it was transcoded with restart markers or why not (else "").
    The field is the extension of ``name`` when ``named`` (files, tar members) and it has one,
    else the format's usual extension."""
    info = inspect_image(data, full_decode=options.verify_decode, max_pixels=options.max_pixels)
    extension = os.path.splitext(name)[1].lower().lstrip(".") if named else ""
    field_name = extension or FORMAT_FIELDS.get(info.format, info.format.lower())
    stored = data
    if options.max_side is not None:
        try:
            shrunk = shrink_image(data, info, options.max_side, options.quality)
        except Exception as e:  # Pillow raises many types for bad data
            raise BadInput(f"decode failed while shrinking ({type(e).__name__}: {e})") from None
        if shrunk is not None:
            field_name, info, stored = "jpg", replace(info, format="JPEG"), shrunk
    restarts = ""
    if options.restart_rows:
        stored, restarts = with_restart_markers(stored, info.format)
    return field_name, stored, len(data), restarts


def load_members(ref: Any, job: ShardJob, read: Read | None,
                 span: tuple = ()) -> tuple[list[tuple[str, bytes]], int, str | None, int | None, str]:
    """The members of one input (an image given by ``read``, or with ``job.video`` the video file
    ``ref``, of which ``span`` is the (start, end) seconds to keep), its size, a note, the
    label that came with the input (None: the listing's) and what --restart-rows did (see check_sample)."""
    if job.video is not None:
        from stoker.pack.videos import load_video  # PyAV only when packing videos

        return (*load_video(ref, job.video, span), None, "")
    inputs = job.given_inputs()
    if read is None:  # only videos are read by load_video instead
        raise ValueError(f"{inputs.name(ref)}: an image input comes with its read")
    if isinstance(read, BadInput):
        raise read
    data, label = read
    field_name, data, original_size, restarts = check_sample(inputs.name(ref), data, job.image, inputs.named)
    return [(field_name, data)], original_size, None, label, restarts


def run_shard_job(job: ShardJob, progress: Callable[[int, int], None] | None = None,
                  arriving: Iterable[list[tuple]] | None = None) -> ShardRecord:
    """Write one shard; ``progress(samples, bytes)`` is called as it goes. Raises PackError.

    ``arriving``: the job's items in chunks as they arrive, instead of ``job.items`` (the rows of
    a Spark partition or a Ray Data write task, streamed: stoker/pack/rows.py); ``job.inputs``
    reads each chunk's refs.

    With ``job.upload`` the shard is written in this node's scratch folder for the URL (a Ray
    task on another node has its own), uploaded, and deleted there; the driver keeps the record.
    """
    if job.upload is not None:
        job = replace(job, dst=str(job.upload.scratch), work_dir=str(job.upload.scratch / WORK_DIR_NAME))
    inputs = job.given_inputs()
    if job.image.restart_rows:
        keep_freed_memory()
    (Path(job.work_dir) / f"{job.name}.json").unlink(missing_ok=True)  # the shard is about to change
    Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    rejected: list[tuple[str, str]] = []
    notes: list[tuple[str, str]] = []
    restart_counts: Counter[str] = Counter()
    done = done_bytes = source_bytes = 0
    max_label = NO_LABEL
    try:
        with ShardWriter(job.dst, job.name) as writer:
            for (ref, key, label, *span), read in _with_reads(job, [job.items] if arriving is None else arriving):
                name = inputs.name(ref)
                try:
                    members, original_size, note, read_label, restarts = load_members(ref, job, read, tuple(span))
                except BadInput as e:
                    if job.strict:
                        raise PackError(f"{name}: {e.reason} (stopped by --strict)") from None
                    rejected.append((name, e.reason))
                else:
                    label = label if read_label is None else read_label
                    if note:
                        notes.append((name, note))
                    if restarts:
                        restart_counts[restarts] += 1
                    if label != NO_LABEL:
                        members.append((CLASS_FIELD, str(label).encode("ascii")))
                    writer.add(key, label, members)
                    max_label = max(max_label, label)
                    done_bytes += sum(len(data) for _, data in members)
                    source_bytes += original_size
                done += 1
                if progress and done % PROGRESS_EVERY == 0:
                    progress(done, done_bytes)
                    done = done_bytes = 0
            if len(writer):
                written = writer.commit()
                entry, fields = written.entry, list(written.fields)
            else:
                writer.abort()
                entry, fields = None, []
    except OSError as e:
        raise PackError(f"{job.dst}: cannot write shard {job.name}: {e.strerror or e}") from None
    if job.upload is not None and entry is not None:
        _move_to(job.upload, Path(job.dst), entry)
    if progress:
        progress(done, done_bytes)
    record = ShardRecord(job.name, job.digest, entry, source_bytes, fields, rejected, notes, dict(restart_counts),
                         max_label)
    try:
        record.save(job.work_dir)
    except OSError as e:
        raise PackError(f"{job.work_dir}: cannot record shard {job.name}: {e.strerror or e}") from None
    return record


def _with_reads(job: ShardJob, chunks: Iterable[list[tuple]]) -> Iterator[tuple[tuple, Read | None]]:
    """Each item with its read (None for a video, which load_video reads), chunk by chunk."""
    for chunk in chunks:
        reads = job.given_inputs().read([item[0] for item in chunk]) if job.video is None else repeat(None)
        yield from zip(chunk, reads)


def _move_to(upload: Upload, folder: Path, entry: ShardEntry) -> None:
    """Upload a committed shard and its index (index first, as in ShardWriter.commit), then delete them here."""
    for name in (entry.index, entry.name):
        upload.put(folder / name, name)
    for name in (entry.index, entry.name):
        (folder / name).unlink()
