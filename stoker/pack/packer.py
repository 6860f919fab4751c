"""``pack``: turn a source of images (stoker/sources/) into a stoker data set, in parallel, resumably.

    source listing ──> plan (fixed up front) ──> one job per shard ──> worker processes
                                                                         │ ShardWriter: tmp, fsync, rename
    manifest (written last: finish.py) <── records of finished shards <──┘

A rerun after a kill or a full disk reuses every shard whose record matches the plan and redoes
the rest; a manifest only ever lists complete shards. The source is only read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import asdict, replace
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import OptionError, PackError, PackMismatchError
from stoker.format import (
    DEFAULT_SHARD_BYTES,
    MANIFEST_NAME,
    Manifest,
    atomic_write,
    file_checksum,
    read_manifest,
    shard_name,
)
from stoker.format.layout import WORK_DIR_NAME
from stoker.pack import plan
from stoker.pack.destination import check_destination, pack_lock, remove_leftovers
from stoker.pack.finish import PackResult, finish
from stoker.pack.local_engine import run_local
from stoker.pack.options import ImageOptions, VideoOptions, pack_options
from stoker.pack.progress import LazyBar
from stoker.pack.restarts import check_available
from stoker.pack.shard_job import ShardJob, ShardRecord, load_members
from stoker.ranges import PACK_WORKERS, SHARD_BYTES, SHUFFLE_SEED
from stoker.sources import BadInput, Source, SourceOptions, open_source
from stoker.storage.publish import Upload, publish
from stoker.storage.remote import is_url

_SIZE_SAMPLE = 1000
_REENCODE_SAMPLE = 32


def pack(
    src: str | os.PathLike | Any,
    dst: str | os.PathLike,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    workers: int | None = None,
    shuffle_seed: int | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    verify_decode: bool = False,
    restart_rows: bool = False,
    strict: bool = False,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
    video_mode: str | None = None,
    fps: float | None = None,
    short_side: int | None = None,
    gop: int | None = None,
    crf: int | None = None,
    engine: str = "local",
    address: str | None = None,
    extensions: str | Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    unlabelled: bool = False,
    split: str | None = None,
) -> PackResult:
    """Pack ``src`` into shards in ``dst``. ``src`` is an ImageFolder tree, a CSV/TSV of
    ``path,label``, Parquet files holding encoded images or their paths (a file or a folder of
    them, as Hugging Face ``datasets`` writes them, or a pattern), WebDataset tar shards (a file or
    a folder of them), a Hugging Face Dataset (a DatasetDict's ``split``, a ``save_to_disk``
    folder), a pandas DataFrame, a pyarrow Table, or a map-style Dataset whose items are
    ``image``, ``(image, label)`` or a dict with both (see stoker/sources/). Anything else is
    refused (OptionError) in one line naming what is taken.

    The image and label of a table (or CSV/TSV with a header row, a Dataset's dict items) are in
    ``image_column`` and ``label_column`` (default: found by their usual names; a WebDataset
    sample's label member too). A source where no label is found is refused, naming what it
    has, unless ``unlabelled`` (then no label is packed). Class names are the source's own
    (folders, a ClassLabel's, string labels) and, for integer labels past them, the numbers.

    With ``video_mode`` the inputs are videos (class folders of .mp4/.mkv/.avi/... files, or a
    list): ``"frames"`` stores each kept frame as a JPEG (``fps``: resample; ``short_side``:
    resize; ``quality``), ``"video"`` keeps the file's bytes (``gop``: re-encoded with a keyframe
    every ``gop`` frames, at x264 quality ``crf``: 23 is x264's default, higher
    is smaller and coarser); both add the frame table counted by
    decoding (see stoker/pack/videos.py). Videos whose header frame count is wrong are listed in
    ``PackResult.notes``.

    A folder source lists the files with ImageFolder's extensions (video extensions with
    ``video_mode``), or ``extensions`` (``["jpg", "gif"]``, ``"jpg,gif"``; ``"+gif"`` adds to
    the default list); the files it leaves out are counted per extension in
    ``PackResult.skipped_extensions`` and the manifest.

    Every option is checked first (stoker/ranges.py; one that applies only to another mode, such
    as ``gop`` without ``video_mode="video"``, is refused): OptionError, before anything is read.
    ``restart_rows`` transcodes each baseline JPEG losslessly (the same DCT coefficients, checked)
    with restart markers at every MCU row and a table of where they are, so that stoker.Loader
    decodes only the rows its crop needs (see stoker/pack/restarts.py); other images are stored
    as they are, and ``PackResult.restarts`` counts both. Otherwise images keep their bytes.

    Bad inputs are skipped and listed in ``dst/rejected.tsv`` (``strict`` stops at the first).
    Raises PackError when it cannot finish; completed shards are kept for the next run.

    ``dst`` may be an fsspec URL (``s3://bucket/prefix``; ``storage_options`` go to fsspec): each
    shard is written under ``~/.cache/stoker/pack/`` on the node that packs it, uploaded, and
    deleted there; the manifest is uploaded last. The plan and the records of finished shards stay
    in that local folder, so a rerun resumes, until the upload is complete.

    ``engine="ray"`` runs one Ray task per shard on the cluster at ``address`` (default: the one
    ``ray.init`` finds, else a local instance; see stoker/pack/ray_engine.py); the output is the
    same, byte for byte, as the local engine's, which uses ``workers`` processes on this machine.
    """
    if engine not in ("local", "ray"):
        raise OptionError(f"engine={engine!r} (--engine): must be 'local' or 'ray'")
    if video_mode not in (None, "frames", "video"):
        raise OptionError(f"video_mode={video_mode!r} (--video-mode): must be 'frames' or 'video'")
    if address is not None and engine != "ray":
        raise OptionError(f"address={address!r} (--address) applies only with engine='ray' (--engine ray)")
    SHARD_BYTES.check(shard_bytes)
    for option, value in ((PACK_WORKERS, workers), (SHUFFLE_SEED, shuffle_seed)):
        if value is not None:
            option.check(value)
    image_options, video = pack_options(video_mode, max_side, quality, verify_decode, fps, short_side, gop, crf,
                                        restart_rows)
    if restart_rows:
        check_available()
    upload = Upload(str(dst), storage_options or {}) if is_url(dst) else None
    if upload is not None:  # the plan and records live here; each task writes its shards in its own node's scratch
        dst = upload.scratch
    started = time.perf_counter()
    chosen = SourceOptions(image_column, label_column, unlabelled, split)
    source = open_source(src, videos=video_mode is not None, extensions=extensions, options=chosen)
    dst = Path(dst)
    check_destination(source, dst)
    # restart_rows only when set: packs of earlier versions resume and are recognized as before
    digested = {k: v for k, v in asdict(image_options).items() if k != "restart_rows" or v}
    plan_digest = plan.digest(source.identity or source.refs, source.keys, source.labels, digested, shard_bytes,
                              shuffle_seed, *([asdict(video)] if video else []), *([chosen.given()] if chosen.given() else []))
    options = {"shard_bytes": shard_bytes, "shuffle_seed": shuffle_seed, **asdict(image_options),
               **({"video": asdict(video)} if video else {}), **chosen.given()}
    if upload is not None and MANIFEST_NAME in upload.sizes():  # uploaded in full by an earlier run
        manifest = Manifest.from_json(upload.read(MANIFEST_NAME), f"{upload.url}/{MANIFEST_NAME}")
        return replace(_existing_result(manifest, dst, plan_digest, started), dst=upload.url)
    try:
        dst.mkdir(parents=True, exist_ok=True)
        with pack_lock(dst):
            if (dst / MANIFEST_NAME).exists():  # finished earlier, or by the pack we waited for
                result = _existing_result(read_manifest(dst), dst, plan_digest, started)
            else:
                work_dir = dst / WORK_DIR_NAME
                work_dir.mkdir(exist_ok=True)
                per_shard = _samples_per_shard(source, work_dir, plan_digest, image_options, video, shard_bytes)
                jobs = _plan_jobs(source, dst, work_dir, plan_digest, per_shard, shuffle_seed, image_options, video,
                                  strict, upload)
                remove_leftovers(dst, {job.name for job in jobs})
                records, reused = _run_jobs(jobs, engine, workers, address, progress)
                result = finish(source, dst, records, reused, options, plan_digest, strict, started)
                shutil.rmtree(work_dir, ignore_errors=True)
            if upload is not None:
                publish(dst, upload.url, storage_options=storage_options)
                shutil.rmtree(dst, ignore_errors=True)
                result = replace(result, dst=upload.url)
    except OSError as e:
        raise PackError(f"{e.filename or dst}: {e.strerror or e}") from None
    except BrokenProcessPool:
        raise PackError(f"{dst}: a pack worker process died (killed, or out of memory?); finished shards "
                        "are kept: run the same command again to resume") from None
    return result


def _plan_jobs(source: Source, dst: Path, work_dir: Path, plan_digest: str, per_shard: int, shuffle_seed: int | None,
               image_options: ImageOptions, video: VideoOptions | None, strict: bool,
               upload: Upload | None) -> list[ShardJob]:
    """One job per planned shard, each with the digest of exactly what it will hold."""
    order = plan.pack_order(len(source), shuffle_seed)
    bounds = plan.shard_bounds(len(source), per_shard)
    jobs = []
    for number in range(len(bounds) - 1):
        items = [(source.refs[i], source.keys[i], int(source.labels[i]), *_span_of(source, i))
                 for i in order[bounds[number] : bounds[number + 1]]]
        jobs.append(ShardJob(shard_name(number), items, plan.digest(plan_digest, items), str(dst), str(work_dir),
                             image_options, strict, video, upload, source.inputs))
    return jobs


def _span_of(source: Source, i: int) -> tuple:
    """``(start, end)`` seconds of video ``i`` (None where not given), or nothing for whole inputs."""
    if source.spans is None:
        return ()
    return tuple(None if np.isnan(v) else float(v) for v in source.spans[i])


def _existing_result(manifest: Manifest, dst: Path, plan_digest: str, started: float) -> PackResult:
    """A finished data set is reused when it was made from the same listing and options."""
    if manifest.source.get("plan") != plan_digest:
        raise PackMismatchError(str(dst))
    return PackResult(dst, manifest.num_samples, len(manifest.shards), sum(s.bytes for s in manifest.shards),
                      0, [], len(manifest.shards), time.perf_counter() - started,
                      skipped_extensions=manifest.source.get("skipped_extensions", {}),
                      repeated_folders=manifest.source.get("repeated_folders", 0),
                      restarts=manifest.source.get("restart_rows"))


def _samples_per_shard(source: Source, work_dir: Path, plan_digest: str, image: ImageOptions,
                       video: VideoOptions | None, shard_bytes: int) -> int:
    """Estimated from a spread sample of file sizes (re-encoded sizes when the pack shrinks images).

    The estimate is saved with the plan, so a resumed pack cuts shards exactly where the first run did.
    """
    saved = work_dir / "plan.json"
    try:
        stored = json.loads(saved.read_text())
        if stored["digest"] == plan_digest:
            return int(stored["samples_per_shard"])
    except (OSError, ValueError, KeyError):
        pass
    positions = plan.sample_positions(len(source), _SIZE_SAMPLE)
    mean = source.inputs.mean_size([source.refs[i] for i in positions])
    if image.max_side is not None or (video is not None and (video.mode == "frames" or video.gop is not None)):
        stored_sizes, original_sizes = [], []
        probe = ShardJob("", [], "", "", "", image, False, video, inputs=source.inputs)
        refs = [source.refs[i] for i in positions[:: max(1, len(positions) // _REENCODE_SAMPLE)][:_REENCODE_SAMPLE]]
        reads = source.inputs.read(refs) if video is None else repeat(None)
        for ref, read in zip(refs, reads):
            try:
                members, original_size, _, _, _ = load_members(ref, probe, read)
                stored_sizes.append(sum(len(data) for _, data in members))
                original_sizes.append(original_size)
            except (BadInput, OSError):
                continue
        if original_sizes:
            mean *= sum(stored_sizes) / sum(original_sizes)
    per_shard = plan.samples_per_shard(mean, shard_bytes)
    atomic_write(saved, json.dumps({"digest": plan_digest, "samples_per_shard": per_shard}).encode())
    return per_shard


def _finished_record(job: ShardJob, uploaded: dict[str, int]) -> ShardRecord | None:
    """The job's record if an earlier run finished its shard, the plan still matches, and the files
    on disk are the ones recorded (sizes, and the index's checksum: a later run with another plan
    may have replaced the shard before it died). Shards that go to an object store are checked by
    their sizes in ``uploaded``."""
    record = ShardRecord.load(job.work_dir, job.name)
    if record is None or record.digest != job.digest:
        return None
    if record.entry is not None and job.upload is not None:
        entry = record.entry
        if uploaded.get(entry.name) != entry.bytes or uploaded.get(entry.index) != entry.index_bytes:
            return None
    elif record.entry is not None:
        tar = Path(job.dst) / record.entry.name
        idx = Path(job.dst) / record.entry.index
        if not (tar.is_file() and tar.stat().st_size == record.entry.bytes and idx.is_file()
                and idx.stat().st_size == record.entry.index_bytes
                and file_checksum(idx) == record.entry.index_checksum):
            return None
    return record


def _run_jobs(jobs: list[ShardJob], engine: str, workers: int | None, address: str | None,
              show_progress: bool) -> tuple[list[ShardRecord], int]:
    """Run the unfinished jobs on ``engine``; return every job's record, in shard order."""
    records: dict[str, ShardRecord] = {}
    uploaded = jobs[0].upload.sizes() if jobs and jobs[0].upload else {}
    for job in jobs:
        if (record := _finished_record(job, uploaded)) is not None:
            records[job.name] = record
    todo = [job for job in jobs if job.name not in records]
    if todo:
        total = sum(len(job.items) for job in jobs)
        bar = LazyBar(total, total - sum(len(job.items) for job in todo), show_progress)
        if engine == "ray":
            from stoker.pack.ray_engine import run_on_ray  # Ray only when asked for

            finished = run_on_ray(todo, workers, bar.update, address)
        else:
            finished = run_local(todo, workers, bar.update)
        with closing(finished):  # an error here stops the engine's workers before the pack lock is let go
            try:
                for record in finished:
                    _check_arrived(record, todo[0])
                    record.save(todo[0].work_dir)  # the driver's copy: a task on another node saved its own there
                    records[record.name] = record
            finally:
                bar.close()
    return [records[job.name] for job in jobs], len(jobs) - len(todo)


def _check_arrived(record: ShardRecord, job: ShardJob) -> None:
    """A shard reported written must be in the destination as this process sees it: a Ray task
    on another node writes a local path on its own disk unless the path is on a shared file system."""
    if record.entry is None or job.upload is not None:
        return
    shard = Path(job.dst) / record.entry.name
    if not shard.is_file() or shard.stat().st_size != record.entry.bytes:
        raise PackError(f"{shard}: written by a pack task but not found here; with a Ray cluster, DST must be on a "
                        "file system every node shares, or an object store URL (s3://...)")
