"""``stoker.doctor``: run the probes on a sample within a time budget, then diagnose.

    sample ──> storage probe (cold / warm / parallel / sequential / copies)
           ──> decode probe (Pillow, simplejpeg full and reduced)  ──> transform probe, per stage
           ──> loader probe (DataLoader 0, 1, 2, 4 .. N workers; stoker.Loader)  ──> verdict + remedies
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.utils.data
from tqdm import tqdm

from stoker.data.dataset import ShardDataset
from stoker.data.decode import decode_image
from stoker.doctor.compute_probe import DecodeReport, StageRate, combined_rate, probe_decode, probe_stages, transform_stages
from stoker.doctor.loader_probe import LoaderRow, probe_loaders, worker_counts
from stoker.doctor.report import DoctorReport
from stoker.doctor.standard import StandardTransform
from stoker.doctor.storage_probe import StorageReport, probe_storage
from stoker.doctor.target import Target, open_target
from stoker.doctor.verdict import Figures, diagnose
from stoker.env import fallback_notes
from stoker.errors import StokerError
from stoker.ranges import DOCTOR_BATCH, DOCTOR_SIZE, DOCTOR_WORKERS, STEP_TIME

# Sample sizes and seconds per probe: the whole run stays under ~60 s by default and ~15 s with
# quick on any data set (listing, storage, decode and transform, and all loader rows together).
_BUDGET = {False: {"sample": 400, "decoded": 200, "list": 5.0, "storage": 20.0, "compute": 10.0, "loaders": 16.0},
           True: {"sample": 120, "decoded": 60, "list": 1.0, "storage": 4.0, "compute": 2.5, "loaders": 5.0}}
_MAX_PROBE_BATCH = 128


def doctor(source: str | os.PathLike | torch.utils.data.Dataset, transform: Callable[[Any], Any] | None = None,
           step_time: float | None = None, *, batch_size: int = 64, workers: int | None = None, size: int = 224,
           quick: bool = False, ssd: str | os.PathLike | None = None, seed: int = 0,
           progress: bool = False) -> DoctorReport:
    """Measure where input time goes for ``source`` and say what to do about it.

    ``source``: a loose image folder, a path list, a packed stoker data set (a path or a
    ShardDataset, whose decode mode and transform are then used), or any map-style Dataset (then
    its ``__getitem__`` is timed as one stage, and storage and decode are not visible).
    ``transform`` runs on each decoded PIL image (default: a standard RandomResizedCrop(``size``)
    + flip + to-tensor); ``step_time`` is the model's seconds per batch of ``batch_size``;
    ``workers`` the most DataLoader workers tried (default: every core this process may use).
    """
    started = time.perf_counter()
    _check(batch_size=batch_size, workers=workers, size=size, step_time=step_time)
    decode_mode = "pil"
    if isinstance(source, ShardDataset):
        decode_mode, transform = source.decode, transform if transform is not None else source.transform
    budget = _BUDGET[quick]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = cores if workers is None else workers
    steps = tqdm(total=4, desc="stoker doctor", disable=not progress, leave=False)
    steps.set_postfix_str("sampling")
    target = open_target(source, int(budget["sample"]), seed, budget["list"])
    user_dataset = target.kind == "dataset"
    if transform is None and not user_dataset and decode_mode == "pil":
        transform = StandardTransform(size)
    steps.update()
    steps.set_postfix_str("storage")
    storage = None if user_dataset else probe_storage(target, workers=max(1, workers), seconds=budget["storage"], ssd=ssd)
    steps.update()
    steps.set_postfix_str("decode and transform")
    decode, stages, good = _compute(target, transform, size, decode_mode, int(budget["decoded"]), budget["compute"])
    steps.update()
    steps.set_postfix_str("loaders")
    per_core = combined_rate([s.per_core for s in stages] + ([decode.pillow_per_core] if decode else []))
    rows = worker_counts(workers)
    # A batch takes at most ~1/8 of a row's time on one core, so even slow pipelines give several.
    probe_batch = int(max(1, min(batch_size, _MAX_PROBE_BATCH, per_core * budget["loaders"] / len(rows) / 8)))
    loaders, notes = probe_loaders(target.subset(good), transform, probe_batch, rows, size, budget["loaders"],
                                   decode_mode)
    notes += fallback_notes()
    steps.update()
    steps.close()
    if probe_batch != batch_size:
        notes.append(f"loaders were timed with batches of {probe_batch} (of {batch_size}) to stay within the time budget")
    figures = _figures(target, storage, decode, stages, loaders, cores, batch_size, size, step_time, ssd)
    settings = {"batch_size": batch_size, "step_time": step_time, "workers": workers, "size": size, "quick": quick,
                "transform": repr(transform) if transform is not None else None, "cores": cores}
    target_info = {"kind": target.kind, "description": target.description, "num_samples": target.num_samples,
                   "estimated": target.estimated, "sample_size": target.sample_size}
    return DoctorReport(target_info, settings, storage, decode, stages, loaders, diagnose(figures),
                        time.perf_counter() - started, notes)


def _check(*, batch_size: int, workers: int | None, size: int, step_time: float | None) -> None:
    """Refuse settings that cannot be measured, before any probe runs."""
    DOCTOR_BATCH.check(batch_size)
    DOCTOR_SIZE.check(size)
    for option, value in ((DOCTOR_WORKERS, workers), (STEP_TIME, step_time)):
        if value is not None:
            option.check(value)


def _compute(target: Target, transform: Callable | None, size: int, decode_mode: str, count: int,
             seconds: float) -> tuple[DecodeReport | None, list[StageRate], list[int]]:
    """Decode rates and per-stage transform rates, and the sampled positions that decode; for a
    user's Dataset, ``__getitem__`` timed as its one stage."""
    if target.kind == "dataset":
        dataset = target.dataset
        rates = probe_stages([("__getitem__", dataset.__getitem__)], [int(i) for i in target.indices], seconds)
        return None, rates, list(range(target.sample_size))
    read = target.reader()
    readable, blobs = [], []
    deadline = time.perf_counter() + seconds / 4
    for k in range(min(target.sample_size, count)):
        try:
            blobs.append(read(k))
        except (OSError, StokerError):  # the storage probe names it
            continue
        readable.append(k)
        if time.perf_counter() > deadline:
            break
    decode, images, decoded = probe_decode(blobs, [target.name(k) for k in readable], size, seconds * 3 / 8)
    if not decoded:
        raise StokerError(f"{target.description}: none of {len(readable)} sampled images decodes; first: "
                          + "; ".join(f"{name}: {reason}" for name, reason in decode.failures[:3]))
    if decode_mode != "pil":  # a ShardDataset's transform takes its own decode mode's output
        images = [decode_image(blobs[j], decode_mode) for j in decoded[: len(images)]]
    inputs = [images[k % len(images)] for k in range(len(decoded))]
    stages = probe_stages(transform_stages(transform), inputs, seconds * 3 / 8) if transform is not None else []
    return decode, stages, [readable[j] for j in decoded]


def _figures(target: Target, storage: StorageReport | None, decode: DecodeReport | None, stages: list[StageRate],
             loaders: list[LoaderRow], cores: int, batch_size: int, size: int, step_time: float | None,
             ssd: str | os.PathLike | None) -> Figures:
    """The verdict's inputs. A user's Dataset counts as all transform (its ``__getitem__``) on
    storage and decode that are not visible (infinite: not a limit the doctor can name)."""
    inf = float("inf")
    best = max((row for row in loaders if row.name.startswith("DataLoader")), key=lambda row: row.images_per_s)
    stoker_row = next((row for row in loaders if row.name.startswith("stoker.Loader")), None)
    transform_rate = combined_rate([s.per_core for s in stages]) if stages else inf
    if storage is None or decode is None:
        storage_rate, concurrency, sequential, mean_bytes = inf, 0, None, 0.0
        decode_rate, jpeg, jpeg_share, megapixels, ssd_rate = inf, None, 0.0, 0.0, None
    else:
        cold = storage.cold_parallel or storage.cold
        mean_bytes = storage.mean_item_bytes or 1.0
        sequential = storage.sequential_mb_per_s * 1e6 / mean_bytes if storage.sequential_mb_per_s else None
        storage_rate = cold.per_second if target.loose or sequential is None else sequential
        concurrency, ssd_rate = cold.concurrency, storage.copy_to_ssd_mb_per_s
        decode_rate, jpeg, jpeg_share = decode.pillow_per_core, decode.jpeg_full_per_core, decode.jpeg_share
        megapixels = decode.megapixels["p50"]
    return Figures(source=target.description, loose=target.loose, cores=cores, batch_size=batch_size, size=size,
                   step_time=step_time, storage_rate=storage_rate, storage_concurrency=concurrency,
                   sequential_rate=sequential, decode_per_core=decode_rate, jpeg_full_per_core=jpeg,
                   jpeg_share=jpeg_share, transform_per_core=transform_rate, loader_rate=best.images_per_s,
                   loader_workers=best.workers, stoker_loader_rate=stoker_row.images_per_s if stoker_row else None,
                   megapixels=megapixels, dataset_bytes=mean_bytes * target.num_samples,
                   available_ram_bytes=_available_ram(), ssd_path=str(ssd) if ssd else None, ssd_copy_rate=ssd_rate)


def _available_ram() -> float:
    """MemAvailable from /proc/meminfo, in bytes (0 where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0
