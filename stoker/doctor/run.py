"""``stoker.doctor``: run the probes on a sample within a time budget, then diagnose.

    sample ──> storage probe (cold / warm / parallel / sequential / copies)
           ──> decode probe (Pillow, simplejpeg full and reduced)  ──> transform probe, per stage
           ──> loader probe (DataLoader 0..N workers, stoker.Loader)  ──> verdict + remedies
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
from stoker.doctor.compute_probe import StageRate, combined_rate, probe_decode, probe_stages, transform_stages
from stoker.doctor.loader_probe import probe_loaders
from stoker.doctor.report import DoctorReport
from stoker.doctor.standard import StandardTransform
from stoker.doctor.storage_probe import probe_storage
from stoker.doctor.target import Target, open_target
from stoker.doctor.verdict import Figures, diagnose
from stoker.errors import StokerError

# Seconds and sample sizes: the whole run stays under ~60 s by default and ~15 s with quick.
_BUDGET = {False: {"sample": 400, "storage": 20.0, "compute": 10.0, "loader": 4.0},
           True: {"sample": 120, "storage": 5.0, "compute": 3.0, "loader": 1.0}}


def doctor(source: str | os.PathLike | torch.utils.data.Dataset, transform: Callable[[Any], Any] | None = None,
           step_time: float | None = None, *, batch_size: int = 64, workers: int | None = None, size: int = 224,
           quick: bool = False, ssd: str | os.PathLike | None = None, seed: int = 0,
           progress: bool = False) -> DoctorReport:
    """Measure where input time goes for ``source`` and say what to do about it.

    ``source``: a loose image folder, a path list, a packed stoker data set, or a map-style
    Dataset (then only its ``__getitem__`` and loaders are timed, stage by stage where it is a
    stoker data set). ``transform`` is what runs on each decoded PIL image (default: a standard
    RandomResizedCrop(``size``) + flip + to-tensor); ``step_time`` the model's seconds per batch of
    ``batch_size``. ``workers``: the most DataLoader workers tried (default: every core).
    """
    started = time.perf_counter()
    if transform is None and isinstance(source, ShardDataset):
        transform = source.transform
    budget = _BUDGET[quick]
    cores = os.cpu_count() or 1
    workers = cores if workers is None else workers
    steps = tqdm(total=4, desc="stoker doctor", disable=not progress, leave=False)
    steps.set_postfix_str("sampling")
    target = open_target(source, int(budget["sample"]), seed)
    user_dataset = target.kind == "dataset"
    transform = transform if transform is not None or user_dataset else StandardTransform(size)
    steps.update()
    steps.set_postfix_str("storage")
    storage = None if user_dataset else probe_storage(target, workers=max(1, workers), seconds=budget["storage"], ssd=ssd)
    steps.update()
    steps.set_postfix_str("decode and transform")
    decode, stages, item_rate, good = _compute(target, transform, size, budget["compute"])
    steps.update()
    steps.set_postfix_str("loaders")
    loaders = probe_loaders(target.subset(good), transform, batch_size, range(workers + 1), size, budget["loader"])
    steps.update()
    steps.close()
    best = max((row for row in loaders if row.name.startswith("DataLoader")), key=lambda row: row.images_per_s)
    stoker_row = next((row for row in loaders if row.name.startswith("stoker.Loader")), None)
    figures = _figures(target, storage, decode, stages, item_rate, best, stoker_row, cores, batch_size, size, step_time,
                       ssd)
    settings = {"batch_size": batch_size, "step_time": step_time, "workers": workers, "size": size, "quick": quick,
                "transform": repr(transform) if transform is not None else None, "cores": cores}
    target_info = {"kind": target.kind, "description": target.description, "num_samples": target.num_samples,
                   "estimated": target.estimated, "sample_size": target.sample_size}
    return DoctorReport(target_info, settings, storage, decode, stages, loaders, diagnose(figures),
                        time.perf_counter() - started)


def _compute(target: Target, transform: Callable | None, size: int, seconds: float):
    """Decode and per-stage transform rates; for a user's Dataset, ``__getitem__`` as one stage."""
    if target.kind == "dataset":
        dataset = target.dataset
        rates = probe_stages([("__getitem__", dataset.__getitem__)], [int(i) for i in target.indices], seconds)
        return None, rates, rates[0].per_core, list(range(target.sample_size))
    read = target.reader()
    readable, blobs = [], []
    for k in range(min(target.sample_size, 200)):
        try:
            blobs.append(read(k))
        except OSError:  # the storage probe names it
            continue
        readable.append(k)
    decode, images, decoded = probe_decode(blobs, [target.name(k) for k in readable], size, seconds / 2)
    if not decoded:
        raise StokerError(f"{target.description}: none of {len(readable)} sampled images decodes; first: "
                          + "; ".join(f"{name}: {reason}" for name, reason in decode.failures[:3]))
    good = [readable[j] for j in decoded]
    stages = probe_stages(transform_stages(transform), images, seconds / 2) if transform is not None else []
    return decode, stages, None, good


def _figures(target: Target, storage, decode, stages: list[StageRate], item_rate: float | None, best, stoker_row,
             cores: int, batch_size: int, size: int, step_time: float | None, ssd) -> Figures:
    """The verdict's inputs; a user's Dataset counts as all transform (its ``__getitem__``) on unknown storage."""
    transform_rate = combined_rate([s.per_core for s in stages]) if stages and decode else float("inf")
    if storage is None:
        storage_rate, sequential, mean_bytes = float("inf"), None, 0.0
        decode_rate, jpeg, megapixels = float("inf"), None, 0.0
        transform_rate = item_rate or float("inf")
    else:
        cold = storage.cold_parallel or storage.cold
        mean_bytes = storage.mean_item_bytes or 1.0
        sequential = storage.sequential_mb_per_s * 1e6 / mean_bytes if storage.sequential_mb_per_s else None
        storage_rate = cold.per_second if target.loose or sequential is None else sequential
        decode_rate, jpeg, megapixels = decode.pillow_per_core, decode.jpeg_full_per_core, decode.megapixels["p50"]
    return Figures(source=target.description, loose=target.loose, cores=cores, batch_size=batch_size, size=size,
                   step_time=step_time, storage_rate=storage_rate, sequential_rate=sequential,
                   mean_item_bytes=mean_bytes, decode_per_core=decode_rate, jpeg_full_per_core=jpeg,
                   transform_per_core=transform_rate, loader_rate=best.images_per_s, loader_workers=best.workers,
                   stoker_loader_rate=stoker_row.images_per_s if stoker_row else None, megapixels=megapixels,
                   dataset_bytes=mean_bytes * target.num_samples, available_ram_bytes=_available_ram(),
                   ssd_path=str(ssd) if ssd else None)


def _available_ram() -> float:
    """MemAvailable from /proc/meminfo, in bytes (0 where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0
