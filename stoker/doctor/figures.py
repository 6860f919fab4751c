"""What a verdict is drawn from: the figures the probes measured, in one record, so the rules
(stoker/doctor/verdict.py) and the remedies' predictions (stoker/doctor/remedies.py) are pure
functions of it, tested on given figures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectStore:
    """An object store's figures: ``rate`` img/s with ``in_flight`` reads of ``read_bytes`` at a
    time (0: whole files), each request's first byte after ``first_byte_ms`` (median), one request
    moving ``one_request_mb_per_s``; ``cache``: the node cache proposed (``cache_dir``,
    ``cache_limit``, ``fits``; None for loose files, which it does not hold)."""

    rate: float
    in_flight: int
    read_bytes: int
    first_byte_ms: float
    one_request_mb_per_s: float
    cache: dict | None


@dataclass(frozen=True)
class LoaderRun:
    """stoker.Loader timed warm on the sample pack (with the user's transform, when one was given):
    ``rate`` img/s on ``threads`` threads, which kept ``cores_used`` cores' worth of CPU busy while
    other processes took ``other_cores``."""

    rate: float
    threads: int
    cores_used: float
    other_cores: float = 0.0


@dataclass(frozen=True)
class Figures:
    """The measured inputs of a verdict (see the probes for how each is measured). Rates are
    img/s of the whole machine unless named per core; ``None``: not measured here.
    ``sequential_rate``: the data's disk read front to back (the shards; for loose files, the
    sample pack where it shares their disk). ``stoker_loader*``: stoker.Loader on the sample
    pack (warm, cold, with the transform's stages after the crop, decoding on the GPU);
    ``stoker_loader_capped``: the same (with the transform, if any) on the sample shrunk to
    ``capped_side`` px as ``stoker pack --max-side`` shrinks it. ``loader_other_cores``: the
    cores' worth of CPU other processes used while the best DataLoader was timed.
    ``object_store``: the data lies at a URL; ``storage_rate`` is then one read at a time.
    ``storage_latency_s``: a cold read's median latency, one at a time (a disk); ``loader_run``:
    the stoker.Loader run the pipeline model's per-core rate comes from."""

    source: str
    loose: bool
    cores: int
    batch_size: int
    size: int
    step_time: float | None
    storage_rate: float
    storage_concurrency: int
    sequential_rate: float | None
    decode_per_core: float
    jpeg_share: float
    transform_per_core: float
    loader_rate: float
    loader_workers: int
    megapixels: float
    dataset_bytes: float
    available_ram_bytes: float
    mean_bytes: float = 0.0
    user_transform: bool = False
    stoker_loader: float | None = None
    stoker_loader_cold: float | None = None
    stoker_loader_transform: float | None = None
    stoker_loader_gpu: float | None = None
    stoker_loader_capped: float | None = None
    capped_side: int | None = None
    capped_bytes_share: float | None = None
    disk_shared: bool = False
    loader_other_cores: float = 0.0
    ssd_path: str | None = None
    ssd_copy_rate: float | None = None
    object_store: ObjectStore | None = None
    storage_latency_s: float | None = None
    loader_run: LoaderRun | None = None
