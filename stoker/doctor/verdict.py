"""From measurements to a verdict: which stage holds the loader back at this step time, the numbers
behind it, and remedies ranked by the throughput each is predicted to give.

Pure functions of a :class:`Figures` record, so the rules can be read and tested apart from the
probes. Every rate is images per second for the whole machine; ``inf`` means "not a limit" (no
transform given) or "not measured" (a user's Dataset, whose storage and decode are not visible).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stoker.doctor.compute_probe import combined_rate
from stoker.doctor.contention import SHARED_CORES
from stoker.doctor.figures import Figures
from stoker.doctor.forecast import Forecast, forecast
from stoker.doctor.numbers import rounded
from stoker.doctor.remedies import Remedy, remedies
from stoker.doctor.remote_probe import size_words

# A DataLoader below this share of what its cores can decode and transform loses the rest to
# inter-process copies, collation and too few workers. Measured here (2 cores, a costly transform
# with a small output) a sound DataLoader reached 70-80% of it: reading files, collation and the
# main process take the rest, so only a loss beyond that is called overhead.
OVERHEAD_SHARE = 0.6
# Where other processes left the best DataLoader under this share of the cores it used, its rate
# says what they left, not what the DataLoader costs: loader overhead is not called.
CONTENDED_SHARE = 0.5


@dataclass(frozen=True)
class Verdict:
    """The bottleneck (``storage``, ``object store``, ``decode``, ``transform``, ``loader overhead`` or
    ``none``); ``tuner``: what a default stoker.Loader would reach and choose (None: not timed here)."""

    bottleneck: str
    needed_images_per_s: float | None
    delivered_images_per_s: float
    gpu_idle_fraction: float | None
    stage_rates: dict[str, float]
    reasons: list[str] = field(default_factory=list)
    remedies: list[Remedy] = field(default_factory=list)
    tuner: Forecast | None = None

    def to_dict(self) -> dict:
        """The report's ``verdict`` section (rates that are no limit or not measured: null)."""
        return {"bottleneck": self.bottleneck, "needed_images_per_s": rounded(self.needed_images_per_s),
                "delivered_images_per_s": rounded(self.delivered_images_per_s),
                "gpu_idle_fraction": rounded(self.gpu_idle_fraction, 3),
                "stage_rates": {k: rounded(v) for k, v in self.stage_rates.items()},
                "reasons": self.reasons, "remedies": [r.to_dict() for r in self.remedies],
                "tuner": self.tuner.to_dict() if self.tuner else None}


def gpu_idle(rate: float, batch_size: int, step_time: float | None) -> float | None:
    """The share of time the GPU waits for batches arriving at ``rate`` images/s, with input and
    compute overlapped (workers prefetch while the step runs)."""
    if step_time is None or rate <= 0:
        return None
    return max(0.0, 1.0 - step_time * rate / batch_size)


def diagnose(f: Figures) -> Verdict:
    """Name the bottleneck, rank the remedies and forecast the tuning Loader, from the figures alone."""
    decode, transform = f.cores * f.decode_per_core, f.cores * f.transform_per_core
    cpu = f.cores * combined_rate([f.decode_per_core, f.transform_per_core])
    delivered = min(f.storage_rate, f.loader_rate)
    needed = f.batch_size / f.step_time if f.step_time else None
    rates = {"storage": f.storage_rate, "decode": decode, "transform": transform, "cpu (decode + transform)": cpu,
             "loader": f.loader_rate}
    reasons = []
    if f.object_store is not None:
        reasons.append(_object_store_reason(f))
    elif math.isfinite(f.storage_rate):
        how = (f"cold random reads, {f.storage_concurrency} at a time" if f.loose or f.sequential_rate is None
               else "large sequential reads")
        reasons.append(f"storage delivers {f.storage_rate:,.0f} img/s ({how})")
    if math.isfinite(decode):
        reasons.append(f"{f.cores} cores decode {decode:,.0f} img/s and transform {_fmt(transform)} img/s; "
                       f"both together {_fmt(cpu)} img/s")
    else:
        reasons.append(f"{f.cores} cores run the data set's __getitem__ at {_fmt(cpu)} img/s")
    reasons.append(f"the best DataLoader ({f.loader_workers} workers, warm cache) delivers {f.loader_rate:,.0f} img/s")
    if f.disk_shared:
        reasons.append("other processes read the same disk during the storage probe: storage is shared, and slower "
                       "than this disk gives one job")
    if f.loader_other_cores > SHARED_CORES:
        reasons.append(f"other processes used {f.loader_other_cores:.1f} of the {f.cores} cores while the best DataLoader "
                       "was timed: the loader rows are lower than this machine gives one job")
    if needed is not None and f.step_time:  # needed is None without a step time
        reasons.append(f"at {f.step_time * 1000:.0f} ms per step of {f.batch_size} the GPU consumes {needed:,.0f} img/s")
    if needed is not None and delivered >= needed:
        bottleneck = "none"
        reasons.append(f"input delivers {delivered:,.0f} img/s, {delivered / needed:.1f}x what the GPU consumes: "
                       "input is not the bottleneck at this step time")
    elif f.storage_rate < f.loader_rate:
        bottleneck = "object store" if f.object_store is not None else "storage"
    elif _overhead(f, cpu, reasons):
        bottleneck = "loader overhead"
    else:
        bottleneck = "decode" if 1 / f.decode_per_core >= 1 / f.transform_per_core else "transform"
    found = [] if bottleneck == "none" else remedies(f, delivered, cpu, needed)
    return Verdict(bottleneck, needed, delivered, gpu_idle(delivered, f.batch_size, f.step_time), rates, reasons,
                   found, forecast(f))


def _object_store_reason(f: Figures) -> str:
    """What the object store delivers one read at a time and with the proposed reads in flight."""
    o = f.object_store
    assert o is not None
    size = size_words(o.read_bytes)
    return (f"the object store delivers {f.storage_rate:,.0f} img/s one read at a time (first byte after "
            f"{o.first_byte_ms:.0f} ms, one request {o.one_request_mb_per_s:,.0f} MB/s) and {o.rate:,.0f} img/s "
            f"with {o.in_flight} reads of {size} in flight")


def _overhead(f: Figures, cpu: float, reasons: list[str]) -> bool:
    """Whether the best DataLoader reached under ``OVERHEAD_SHARE`` of what the cores it used
    decode and transform (``cpu`` for all of them), counting only the cores other processes
    left it while it was timed; not called where they left it under ``CONTENDED_SHARE`` of
    them (a reason says so). Appends the reason for a call."""
    used, left = cores_left(f.cores, f.loader_workers, f.loader_other_cores)
    per_core = cpu / f.cores
    if left > 0 and f.loader_rate >= OVERHEAD_SHARE * per_core * left:
        return False
    cores = f"its {used} {'core decodes' if used == 1 else 'cores decode'}"
    if left < CONTENDED_SHARE * used:
        reasons.append(f"the DataLoader reaches {f.loader_rate / (per_core * used):.0%} of what {cores} and transform, "
                       f"but other processes took {f.loader_other_cores:.1f} of the {f.cores} cores while it was timed: "
                       "loader overhead is not called on what they left (run the doctor on an idle machine to tell)")
        return False
    if left < used:
        cores = f"the {left:.1f} of its {used} cores other processes left it decode"
    reasons.append(f"the DataLoader reaches {f.loader_rate / (per_core * left):.0%} of what {cores} and transform")
    return True


def cores_left(cores: int, workers: int, other_cores: float) -> tuple[int, float]:
    """The cores a DataLoader of ``workers`` keeps busy (one per worker, or the main process
    alone), and how many of them other processes, taking ``other_cores``, left it."""
    used = min(cores, max(1, workers))
    return used, min(float(used), cores - other_cores)


def rate_alone(rate: float, cores: int, workers: int, other_cores: float) -> float:
    """A loader row's img/s scaled to the cores it would have had alone, so rows timed while other
    processes took different shares of the CPU compare fairly (at most 10x: a row left almost
    nothing says little)."""
    used, left = cores_left(cores, workers, other_cores)
    return rate * used / max(left, 0.1 * used)


def _fmt(rate: float) -> str:
    return "unlimited" if math.isinf(rate) else f"{rate:,.0f}"
