"""From measurements to a verdict: which stage holds the loader back at this step time, the numbers
behind it, and remedies ranked by the throughput each is predicted to give.

Pure functions of a :class:`Figures` record, so the rules can be read and tested apart from the
probes. Every rate is images per second for the whole machine; ``inf`` means "not a limit" (no
transform given) or "not measured" (a user's Dataset, whose storage and decode are not visible).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import PurePath

from stoker.doctor.compute_probe import combined_rate
from stoker.doctor.numbers import rounded

# stoker.Loader reached 85% of the decode-only limit of the same cores in `stoker bench loader`
# (BENCHMARKS.md, issue 3); used to predict it on data not yet packed.
LOADER_EFFICIENCY = 0.85
# A DataLoader below this share of what its cores can decode and transform loses the rest to
# inter-process copies, collation and too few workers. Measured here (2 cores, a costly transform
# with a small output) a sound DataLoader reached 70-80% of it: reading files, collation and the
# main process take the rest, so only a loss beyond that is called overhead.
OVERHEAD_SHARE = 0.6


@dataclass(frozen=True)
class Figures:
    """The measured inputs of a verdict (see the probes for how each is measured)."""

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
    jpeg_full_per_core: float | None
    jpeg_share: float
    transform_per_core: float
    loader_rate: float
    loader_workers: int
    stoker_loader_rate: float | None
    megapixels: float
    dataset_bytes: float
    available_ram_bytes: float
    ssd_path: str | None = None
    ssd_copy_rate: float | None = None


@dataclass(frozen=True)
class Remedy:
    """One thing to do, what it is predicted to give, and the exact command or code."""

    name: str
    predicted_images_per_s: float
    how: str
    why: str

    def to_dict(self) -> dict:
        """One entry of the report's remedy list."""
        return {**asdict(self), "predicted_images_per_s": rounded(self.predicted_images_per_s)}


@dataclass(frozen=True)
class Verdict:
    """The bottleneck (``storage``, ``decode``, ``transform``, ``loader overhead`` or ``none``)."""

    bottleneck: str
    needed_images_per_s: float | None
    delivered_images_per_s: float
    gpu_idle_fraction: float | None
    stage_rates: dict[str, float]
    reasons: list[str] = field(default_factory=list)
    remedies: list[Remedy] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The report's ``verdict`` section (rates that are no limit or not measured: null)."""
        return {"bottleneck": self.bottleneck, "needed_images_per_s": rounded(self.needed_images_per_s),
                "delivered_images_per_s": rounded(self.delivered_images_per_s),
                "gpu_idle_fraction": rounded(self.gpu_idle_fraction, 3),
                "stage_rates": {k: rounded(v) for k, v in self.stage_rates.items()},
                "reasons": self.reasons, "remedies": [r.to_dict() for r in self.remedies]}


def gpu_idle(rate: float, batch_size: int, step_time: float | None) -> float | None:
    """The share of time the GPU waits for batches arriving at ``rate`` images/s, with input and
    compute overlapped (workers prefetch while the step runs)."""
    if step_time is None or rate <= 0:
        return None
    return max(0.0, 1.0 - step_time * rate / batch_size)


def diagnose(f: Figures) -> Verdict:
    """Name the bottleneck and rank the remedies from the figures alone."""
    decode, transform = f.cores * f.decode_per_core, f.cores * f.transform_per_core
    cpu = f.cores * combined_rate([f.decode_per_core, f.transform_per_core])
    delivered = min(f.storage_rate, f.loader_rate)
    needed = f.batch_size / f.step_time if f.step_time else None
    rates = {"storage": f.storage_rate, "decode": decode, "transform": transform, "cpu (decode + transform)": cpu,
             "loader": f.loader_rate}
    reasons = []
    if math.isfinite(f.storage_rate):
        how = (f"cold random reads, {f.storage_concurrency} at a time" if f.loose or f.sequential_rate is None
               else "large sequential reads")
        reasons.append(f"storage delivers {f.storage_rate:,.0f} img/s ({how})")
    if math.isfinite(decode):
        reasons.append(f"{f.cores} cores decode {decode:,.0f} img/s and transform {_fmt(transform)} img/s; "
                       f"both together {_fmt(cpu)} img/s")
    else:
        reasons.append(f"{f.cores} cores run the data set's __getitem__ at {_fmt(cpu)} img/s")
    reasons.append(f"the best DataLoader ({f.loader_workers} workers, warm cache) delivers {f.loader_rate:,.0f} img/s")
    if needed is not None:
        reasons.append(f"at {f.step_time * 1000:.0f} ms per step of {f.batch_size} the GPU consumes {needed:,.0f} img/s")
    used = _cores_used(f)
    if needed is not None and delivered >= needed:
        bottleneck = "none"
        reasons.append(f"input delivers {delivered:,.0f} img/s, {delivered / needed:.1f}x what the GPU consumes: "
                       "input is not the bottleneck at this step time")
    elif f.storage_rate < f.loader_rate:
        bottleneck = "storage"
    elif f.loader_rate < OVERHEAD_SHARE * cpu * used / f.cores:
        bottleneck = "loader overhead"
        reasons.append(f"the DataLoader reaches {f.loader_rate / (cpu * used / f.cores):.0%} of what its {used} "
                       f"{'core decodes' if used == 1 else 'cores decode'} and transform")
    else:
        bottleneck = "decode" if 1 / f.decode_per_core >= 1 / f.transform_per_core else "transform"
    remedies = [] if bottleneck == "none" else _remedies(f, delivered, cpu, needed)
    return Verdict(bottleneck, needed, delivered, gpu_idle(delivered, f.batch_size, f.step_time), rates, reasons,
                   remedies)


def _remedies(f: Figures, delivered: float, cpu: float, needed: float | None) -> list[Remedy]:
    """Every remedy predicted to beat ``delivered`` by 5%, best first: by predicted rate up to
    what the GPU consumes (beyond it more is worth nothing), then in the order written here
    (cheapest change first; measured before predicted). Data echoing always comes last."""
    out: list[Remedy] = []
    after_pack = f.sequential_rate if f.sequential_rate is not None else math.inf
    src = shlex.quote(f.source)
    dst = shlex.quote(f"{f.source.rstrip('/')}-shards")
    shm = shlex.quote(f"/dev/shm/{PurePath(f.source).name}-shards")
    if f.loose:
        out.append(Remedy("pack into shards", min(after_pack, f.loader_rate),
                          f"stoker pack {src} {dst}   # then: stoker doctor {dst}",
                          "one large sequential read per block instead of a random read per file"
                          + ("" if f.sequential_rate else "; the disk's sequential rate was not measurable here "
                             "(no large file), so this assumes it is not the limit")))
    if f.storage_rate < f.loader_rate and f.dataset_bytes < 0.5 * f.available_ram_bytes:
        out.append(Remedy("stage into RAM (/dev/shm)", f.loader_rate,
                          f"stoker pack {src} {shm}" if f.loose else f"cp -r {src} {shm}",
                          f"the data set (~{f.dataset_bytes / 1e9:.1f} GB) fits in half the available RAM "
                          f"({f.available_ram_bytes / 1e9:.1f} GB); storage then leaves the loop"))
    if f.ssd_path and f.ssd_copy_rate and f.storage_rate < f.loader_rate:
        ssd = shlex.quote(f"{f.ssd_path.rstrip('/')}/{PurePath(f.source).name}-shards")
        out.append(Remedy("stage onto the local SSD", f.loader_rate,
                          f"stoker pack {src} {ssd}" if f.loose else f"cp -r {src} {ssd}",
                          f"copying onto it ran at {f.ssd_copy_rate:,.0f} MB/s; reads then come from the SSD"))
    capped = _capped_megapixels(f.size)
    if f.megapixels > 1.5 * capped:
        faster = f.cores * combined_rate([f.decode_per_core * f.megapixels / capped, f.transform_per_core])
        out.append(Remedy(f"cap the resolution at pack time (longest side {2 * f.size} px)",
                          min(faster, after_pack if f.loose else f.storage_rate),
                          f"stoker pack {src if f.loose else 'SRC'} {dst} --max-side {2 * f.size}",
                          f"the median image has {f.megapixels:.2f} MP; decode time scales with pixels"))
    fused = f.stoker_loader_rate if f.stoker_loader_rate is not None else (
        f.cores * f.jpeg_full_per_core * LOADER_EFFICIENCY if f.jpeg_full_per_core else None)
    if fused is not None:
        packed = f"{f.source.rstrip('/')}-shards" if f.loose else f.source
        loader = (f"stoker.Loader(stoker.ShardDataset({packed!r}), {f.batch_size}, "
                  f"crop=stoker.CropSpec(size=({f.size}, {f.size})))")
        out.append(Remedy(("pack, then " if f.loose else "") + "stoker.Loader: decode fused with the crop",
                          min(fused, after_pack if f.loose else f.storage_rate),
                          (f"stoker pack {src} {dst}; then " if f.loose else "") + loader,
                          "threads decode only the crop's rows, at reduced DCT scale where it allows, into a "
                          "preallocated batch"
                          + (" (measured)" if f.stoker_loader_rate is not None else
                             f" (predicted as {LOADER_EFFICIENCY:.0%} of the cores' simplejpeg rate)")))
    if f.loader_workers < f.cores:
        out.append(Remedy(f"more DataLoader workers ({f.cores})",
                          min(cpu, f.storage_rate, f.loader_rate * f.cores / max(1, f.loader_workers)),
                          f"torch.utils.data.DataLoader(dataset, batch_size={f.batch_size}, num_workers={f.cores})",
                          f"the best measured loader used {f.loader_workers} workers on {f.cores} cores"))
    if f.jpeg_share >= 0.5 and math.isfinite(f.decode_per_core):
        out.append(Remedy("decode and augment on the GPU", f.storage_rate,
                          "torchvision.io.decode_jpeg(list_of_jpeg_bytes, device='cuda'), then "
                          "torchvision.transforms.v2 on the GPU batch",
                          f"takes decode and transform off the CPU ({f.jpeg_share:.0%} of the images are JPEGs); "
                          "needs a GPU; the prediction ignores what is left on the CPU"))
    cap = needed if needed is not None else math.inf
    order = {id(r): k for k, r in enumerate(out)}
    ranked = sorted((r for r in out if r.predicted_images_per_s > 1.05 * delivered),
                    key=lambda r: (-min(r.predicted_images_per_s, cap), order[id(r)]))
    echo = Remedy("data echoing (reuse each batch twice)", 2 * delivered,
                  "planned in stoker; meanwhile repeat each batch in the training loop",
                  "a last resort, listed last whatever its rate: the model sees each sample twice, which can cost accuracy")
    return [*ranked, echo]


def _cores_used(f: Figures) -> int:
    """Cores the best DataLoader kept busy: one per worker, or the main process alone."""
    return min(f.cores, max(1, f.loader_workers))


def _capped_megapixels(size: int) -> float:
    """Pixels of a 4:3 image whose longest side is ``2 * size``."""
    side = 2 * size
    return side * side * 3 / 4 / 1e6


def _fmt(rate: float) -> str:
    return "unlimited" if math.isinf(rate) else f"{rate:,.0f}"
