"""``stoker.doctor``: run the probes on a sample within a time budget, then diagnose.

    sample ──> storage probe (cold / warm / parallel / sequential / copies; other readers of the disk),
               or at a URL the object-store probe (first byte, one request, reads in flight), then the
               sample fetched into a local folder for the probes after it
           ──> decode probe (Pillow, simplejpeg, stoker's fused decode + crop)  ──> transform probe, per stage
           ──> loader probe (DataLoader 0, 1, 2, 4 .. N workers)
           ──> sample pack (the sample packed in a temporary folder; stoker.Loader on it)  ──> verdict + remedies
           ──> with prove: the top two remedies run for real on the sample  ──> predicted vs measured
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data
from tqdm import tqdm

from stoker.counters import available_memory
from stoker.data.dataset import ShardDataset
from stoker.data.decode import DecodeMode, decode_image
from stoker.doctor.compute_probe import DecodeReport, StageRate, combined_rate, probe_decode, probe_stages, transform_stages
from stoker.doctor.contention import CpuWatch
from stoker.doctor.figures import LoaderRun, ObjectStore
from stoker.doctor.loader_probe import LoaderRow, probe_loaders, worker_counts
from stoker.doctor.nodes import NodeForecast, forecast
from stoker.doctor.pack_probe import PackProbe, probe_pack
from stoker.doctor.prove import Sample, run_proof
from stoker.doctor.remote_probe import Bounds, RemoteReport, fetch_sample, probe_remote, propose_cache
from stoker.doctor.report import DoctorReport
from stoker.doctor.standard import StandardTransform
from stoker.doctor.storage_probe import StorageReport, probe_storage
from stoker.doctor.target import Target, open_target
from stoker.doctor.verdict import Figures, diagnose, rate_alone
from stoker.env import fallback_notes
from stoker.errors import StokerError
from stoker.format import MANIFEST_NAME
from stoker.ranges import DOCTOR_BATCH, DOCTOR_NODES, DOCTOR_RANKS, DOCTOR_SIZE, DOCTOR_WORKERS, STEP_TIME

# Sample sizes and seconds per probe: the whole run stays under ~60 s by default and ~15 s with
# quick on any data set (listing, storage, decode and transform, the loader rows and the sample
# pack together); ``prove`` is the seconds each proved remedy runs (a proof adds ~20-30 s).
_BUDGET = {False: {"sample": 400, "decoded": 200, "list": 5.0, "storage": 16.0, "compute": 8.0, "loaders": 11.0,
                   "pack": 12.0, "pack_images": 2048, "pack_bytes": 192 << 20, "prove": 8.0},
           True: {"sample": 120, "decoded": 60, "list": 1.0, "storage": 3.0, "compute": 2.0, "loaders": 4.0,
                  "pack": 2.5, "pack_images": 512, "pack_bytes": 48 << 20, "prove": 4.0}}
# The object-store probes' bounds (first-byte and one-stream requests, bytes, seconds), and the
# seconds the sample's fetch into a local folder may take.
_REMOTE = {False: (Bounds(32, 4, 512 << 20, 16.0), 10.0), True: (Bounds(12, 2, 128 << 20, 4.0), 3.0)}
_MAX_PROBE_BATCH = 128


def doctor(source: str | os.PathLike | torch.utils.data.Dataset, transform: Callable[[Any], Any] | None = None,
           step_time: float | None = None, *, batch_size: int = 64, workers: int | None = None, size: int = 224,
           quick: bool = False, ssd: str | os.PathLike | None = None, seed: int = 0,
           progress: bool = False, prove: bool = False, storage_options: dict[str, Any] | None = None,
           nodes: int | None = None, ranks_per_node: int = 1) -> DoctorReport:
    """Measure where input time goes for ``source`` and say what to do about it.

    ``source``: a loose image folder, a path list, a packed stoker data set (a path or a
    ShardDataset, whose decode mode and transform are then used), or any map-style Dataset (then
    its ``__getitem__`` is timed as one stage, and storage and decode are not visible).
    ``transform`` runs on each decoded PIL image (default: a standard RandomResizedCrop(``size``)
    + flip + to-tensor); ``step_time`` is the model's seconds per batch of ``batch_size``;
    ``workers`` the most DataLoader workers tried (default: every core this process may use).
    At an fsspec URL (``s3://...``; ``storage_options`` go to fsspec), a packed data set or a
    folder of images: the object store is probed (first bytes, one request, reads in flight,
    within stated bounds) and the sample fetched into a local folder for the other probes.
    The sampled images are packed into a temporary folder (removed after) to time stoker.Loader
    on them; ``prove`` runs the top two remedies for real on that pack and reports
    predicted against measured img/s. ``nodes``: for a packed data set, what a job of that many
    nodes of ``ranks_per_node`` ranks fetches from the store per node and epoch, and the node
    cache each needs (:mod:`stoker.doctor.nodes`).
    """
    started = time.perf_counter()
    _check(batch_size=batch_size, workers=workers, size=size, step_time=step_time, nodes=nodes,
           ranks_per_node=ranks_per_node)
    decode_mode: DecodeMode = "pil"
    if isinstance(source, ShardDataset):
        decode_mode, transform = source.decode, transform if transform is not None else source.transform
    budget = _BUDGET[quick]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = cores if workers is None else workers
    steps = tqdm(total=5 + prove, desc="stoker doctor", disable=not progress, leave=False)
    steps.set_postfix_str("sampling")
    target = open_target(source, int(budget["sample"]), seed, budget["list"], storage_options)
    user_dataset = target.kind == "dataset"
    several = _several_nodes(target, nodes, ranks_per_node) if nodes is not None else None
    notes = ["--nodes: the forecast needs a packed data set (its shards); pack it first"] if nodes and not several else []
    user_transform = transform is not None or decode_mode != "pil"
    if transform is None and not user_dataset and decode_mode == "pil":
        transform = StandardTransform(size)
    steps.update()
    with tempfile.TemporaryDirectory(prefix="stoker-doctor-") as scratch:
        steps.set_postfix_str("object store" if target.remote else "storage")
        storage, remote, probed, notes = None, None, target, fallback_notes() + target.left_out + notes
        if target.remote:
            bounds, fetch_seconds = _REMOTE[quick]
            remote = probe_remote(target, bounds)
            remote.stage = propose_cache(remote.mean_item_bytes * target.num_samples, available_memory(),
                                         str(ssd) if ssd else None) if target.kind == "packed" else None
            probed, fetched = fetch_sample(target, Path(scratch) / "sample", remote.reads_in_flight, fetch_seconds)
            notes += fetched
        elif not user_dataset:
            storage = probe_storage(target, workers=max(1, workers), seconds=budget["storage"], ssd=ssd)
        steps.update()
        steps.set_postfix_str("decode and transform")
        watch = CpuWatch().start()
        decode, stages, good, blobs = _compute(probed, transform, size, decode_mode, int(budget["decoded"]),
                                               budget["compute"])
        compute_cpu = watch.stop()
        steps.update()
        steps.set_postfix_str("loaders")
        per_core = combined_rate([s.per_core for s in stages] + ([decode.pillow_per_core] if decode else []))
        rows = worker_counts(workers)
        # A batch takes at most ~1/8 of a row's time on one core, so even slow pipelines give several.
        probe_batch = int(max(1, min(batch_size, _MAX_PROBE_BATCH, per_core * budget["loaders"] / len(rows) / 8)))
        loaders = probe_loaders(probed.subset(good), transform, probe_batch, rows, budget["loaders"], decode_mode)
        if probe_batch != batch_size:
            notes.append(f"loaders were timed with batches of {probe_batch} (of {batch_size}) to stay within the "
                         "time budget")
        steps.update()
        steps.set_postfix_str("sample pack")
        pack = None
        if not user_dataset:
            files = probed.files_read()
            data_path = target.description if target.remote else files[0] if files else target.description
            pack = probe_pack(blobs, os.path.join(scratch, "pack"), data_path,
                              size=size, batch_size=probe_batch, seconds=budget["pack"], transform=transform,
                              max_images=int(budget["pack_images"]), max_bytes=int(budget["pack_bytes"]),
                              capped_side=decode.capped_side if decode else None,
                              capped_blobs=decode.capped_blobs if decode else ())
            loaders += pack.rows
        steps.update()
        figures = _figures(target, storage, remote, decode, stages, loaders, pack, cores, batch_size, size, step_time,
                           ssd, user_transform)
        verdict = diagnose(figures)
        proof = None
        if prove and pack is not None:
            steps.set_postfix_str("proving the top remedies")
            sample = Sample(probed.subset(good), blobs, pack, transform, decode_mode, size, max(1, figures.cores),
                            max(1, figures.loader_workers), scratch, storage is not None and storage.eviction_worked)
            proof, proof_notes = run_proof(verdict.remedies, sample, batch_size=batch_size, step_time=step_time,
                                           seconds=budget["prove"])
            notes += proof_notes
            steps.update()
        elif prove:
            notes.append("--prove needs stored images to pack: a Dataset object's items are not proved")
    steps.close()
    settings = {"batch_size": batch_size, "step_time": step_time, "workers": workers, "size": size, "quick": quick,
                "transform": repr(transform) if transform is not None else None, "cores": cores, "prove": prove,
                "nodes": nodes, "ranks_per_node": ranks_per_node}
    target_info = {"kind": target.kind, "description": target.description, "num_samples": target.num_samples,
                   "estimated": target.estimated, "sample_size": target.sample_size, "remote": target.remote}
    return DoctorReport(target_info, settings, storage, decode, stages, loaders, verdict, time.perf_counter() - started,
                        notes, pack, proof, compute_cpu, remote, several)


def _several_nodes(target: Target, nodes: int, ranks_per_node: int) -> NodeForecast | None:
    """What ``nodes`` nodes fetch of a packed ``target`` (None for other targets: no shards to go by)."""
    if target.kind != "packed":
        return None
    shards = target.dataset.shards
    manifest_bytes = (shards.root / MANIFEST_NAME).stat().st_size
    index_bytes = sum(entry.index_bytes for entry in shards.manifest.shards)
    return forecast(np.array([entry.bytes for entry in shards.manifest.shards]), np.diff(shards.starts),
                    index_bytes, manifest_bytes, nodes, ranks_per_node)


def _check(*, batch_size: int, workers: int | None, size: int, step_time: float | None, nodes: int | None,
           ranks_per_node: int) -> None:
    """Refuse settings that cannot be measured, before any probe runs."""
    DOCTOR_BATCH.check(batch_size)
    DOCTOR_SIZE.check(size)
    DOCTOR_RANKS.check(ranks_per_node)
    if nodes is not None:
        DOCTOR_NODES.check(nodes)
    for option, value in ((DOCTOR_WORKERS, workers), (STEP_TIME, step_time)):
        if value is not None:
            option.check(value)


def _compute(target: Target, transform: Callable | None, size: int, decode_mode: DecodeMode, count: int,
             seconds: float) -> tuple[DecodeReport | None, list[StageRate], list[int], list[bytes]]:
    """Decode rates and per-stage transform rates, the sampled positions that decode, and the
    stored bytes of the sample to pack; for a user's Dataset, ``__getitem__`` timed as its one stage."""
    if target.kind == "dataset":
        dataset = target.dataset
        rates = probe_stages([("__getitem__", dataset.__getitem__)], [int(i) for i in target.indices], seconds)
        return None, rates, list(range(target.sample_size)), []
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
    names = [target.name(k) for k in readable]
    decode, images, decoded = probe_decode(blobs, names, size, seconds * 3 / 8)
    if not decoded:
        raise StokerError(f"{target.description}: none of {len(readable)} sampled images decodes; first: "
                          + "; ".join(f"{name}: {reason}" for name, reason in decode.failures[:3]))
    items: list[Any] = images
    if decode_mode != "pil":  # a ShardDataset's transform takes its own decode mode's output
        items = [decode_image(blobs[j], decode_mode) for j in decoded[: len(images)]]
    inputs = [items[k % len(items)] for k in range(len(decoded))]
    stages = probe_stages(transform_stages(transform), inputs, seconds * 3 / 8) if transform is not None else []
    # Every readable item but those Pillow refused goes into the sample pack (the Pillow pass may
    # have stopped at its deadline before the last of them: a busy machine would leave few).
    refused = {name for name, _ in decode.failures}
    return decode, stages, [readable[j] for j in decoded], [b for j, b in enumerate(blobs) if names[j] not in refused]


def _figures(target: Target, storage: StorageReport | None, remote: RemoteReport | None, decode: DecodeReport | None,
             stages: list[StageRate], loaders: list[LoaderRow], pack: PackProbe | None, cores: int, batch_size: int,
             size: int, step_time: float | None, ssd: str | os.PathLike | None, user_transform: bool) -> Figures:
    """The verdict's inputs. A user's Dataset counts as all transform (its ``__getitem__``) on
    storage and decode that are not visible (infinite: not a limit the doctor can name). The
    disk's sequential rate is the shards' (packed data), else the sample pack's where it lies on
    the data's disk, else that of large loose files. An object store's rate is that of one read
    at a time (as ``stoker stage`` and the node cache's stager fetch), its rate with the proposed
    reads in flight apart."""
    inf = float("inf")
    # The best DataLoader: by its rate on the cores it would have had alone (rows timed beside other
    # processes' work got different shares of the CPU; alone, this is the fastest row).
    best = max((row for row in loaders if row.name.startswith("DataLoader")),
               key=lambda row: rate_alone(row.images_per_s, cores, row.workers, _other_cores(row)))
    transform_rate = combined_rate([s.per_core for s in stages]) if stages else inf
    common: dict[str, Any] = dict(
        source=target.description, loose=target.loose, cores=cores, batch_size=batch_size, size=size,
        step_time=step_time, transform_per_core=transform_rate, loader_rate=best.images_per_s,
        loader_workers=best.workers, loader_other_cores=_other_cores(best),
        available_ram_bytes=available_memory(), ssd_path=str(ssd) if ssd else None,
        user_transform=user_transform)
    if decode is None or pack is None or (storage is None and remote is None):
        return Figures(**common, storage_rate=inf, storage_concurrency=0, sequential_rate=None, decode_per_core=inf,
                       jpeg_share=0.0, megapixels=0.0, dataset_bytes=0.0)
    compute: dict[str, Any] = dict(
        decode_per_core=decode.pillow_per_core, jpeg_share=decode.jpeg_share, megapixels=decode.megapixels["p50"],
        stoker_loader=pack.loader, stoker_loader_cold=pack.loader_cold, stoker_loader_transform=pack.loader_transform,
        stoker_loader_gpu=pack.loader_gpu, stoker_loader_capped=pack.loader_capped, capped_side=decode.capped_side,
        capped_bytes_share=decode.capped_bytes_share, loader_run=_loader_run(pack.modelled))
    if remote is not None:
        mean_bytes = remote.mean_item_bytes or pack.mean_bytes or 1.0
        one = remote.levels[0].mb_per_s if remote.levels else remote.one_request_mb_per_s
        return Figures(**common, **compute, storage_rate=one * 1e6 / mean_bytes, storage_concurrency=1,
                       sequential_rate=None, dataset_bytes=mean_bytes * target.num_samples, mean_bytes=mean_bytes,
                       object_store=ObjectStore(remote.images_per_s(remote.expected_mb_per_s), remote.reads_in_flight,
                                                remote.read_bytes if remote.packed else 0, remote.first_byte_p50_ms,
                                                remote.one_request_mb_per_s, remote.stage))
    assert storage is not None
    cold = storage.cold_parallel or storage.cold
    mean_bytes = storage.mean_item_bytes or pack.mean_bytes or 1.0
    sequential_mb = storage.sequential_mb_per_s if not target.loose or not pack.same_device else pack.sequential_mb_per_s
    sequential = sequential_mb * 1e6 / mean_bytes if sequential_mb else None
    storage_rate = cold.per_second if target.loose or sequential is None else sequential
    latency = storage.cold.latencies_ms
    return Figures(**common, **compute, storage_rate=storage_rate, storage_concurrency=cold.concurrency,
                   sequential_rate=sequential, dataset_bytes=mean_bytes * target.num_samples, mean_bytes=mean_bytes,
                   disk_shared=bool(storage.contention and storage.contention.shared),
                   ssd_copy_rate=storage.copy_to_ssd_mb_per_s,
                   storage_latency_s=float(np.median(latency)) / 1e3 if len(latency) else None)


def _loader_run(row: LoaderRow | None) -> LoaderRun | None:
    """The pipeline model's figures of a stoker.Loader row: its rate, threads, cores used and others took."""
    if row is None or row.cpu is None or row.cpu.seconds <= 0:
        return None
    return LoaderRun(row.images_per_s, row.workers, row.cpu.own_cpu_s / row.cpu.seconds, row.cpu.other_cores or 0.0)


def _other_cores(row: LoaderRow) -> float:
    """The cores' worth of CPU other processes took while ``row`` was timed (0 where unmeasured)."""
    return (row.cpu.other_cores or 0.0) if row.cpu else 0.0
