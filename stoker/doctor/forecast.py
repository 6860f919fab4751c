"""What a default stoker.Loader, left to tune itself, would reach on the data and what its tuner
would choose: stoker.tune's pipeline model, the one the Loader tunes with, given the figures the
doctor measured on the sample instead of those a running Loader measures of itself.

    per core   stoker.Loader on the sample pack, warm (with the user's transform when given):
               its img/s over the cores' worth of CPU it used (every per-sample stage together, as
               a running Loader measures it; the transform's own rate is not added apart)
    GIL        that rate, where its threads left over a fifth of the cores they had idle on
               data in memory (else not reached)
    cores      this process's, less what other processes took while that Loader ran
    storage    a disk: the first byte of a cold read, then the data read front to back (loose
               files: the sample pack on their disk, as the Loader reads them packed); an object
               store: the first byte, one request's MB/s, the most that reads in flight moved
    the loop   batch_size / step_time (no step time: no limit)
    memory     the share of the available memory a Loader's tuner may take

A pure function of a :class:`Figures` record, tested on given figures as the verdict's rules are.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from stoker.data.shards import DEFAULT_BLOCK_BYTES
from stoker.doctor.contention import SHARED_CORES
from stoker.doctor.figures import Figures
from stoker.doctor.numbers import rounded
from stoker.loader.plan import MEMORY_SHARE
from stoker.tune import Prediction, Settings, Source, Stages, loader_choice

# A warm Loader whose threads kept under this share of the cores they had busy was held by the GIL.
GIL_BOUND = 0.8


@dataclass(frozen=True)
class Forecast:
    """The model's inputs (``stages``, each with what it was measured from: ``measured``), what
    the tuner would choose (``settings``) and what the model predicts there (``prediction``);
    ``packed``: the forecast is for the data packed first (it is loose files now); ``alone``: the
    same with no other process on the cores, where others took some while the Loader was timed."""

    stages: Stages
    measured: dict[str, str]
    settings: Settings
    prediction: Prediction
    packed: bool
    alone: tuple[Settings, Prediction] | None = None

    def lines(self) -> list[str]:
        """The terminal report's section."""
        p, s = self.prediction, self.stages
        lines = [f"  stoker.Loader{' on the data packed' if self.packed else ''}, left to tune itself: "
                 f"~{p.rate:,.0f} img/s, {_limit(p)}",
                 f"  its tuner would choose: {self.settings.describe()}",
                 "  stage rates there: " + ", ".join(f"{name} {_rate(rate)}" for name, rate in p.rates.items())]
        if self.alone is not None:
            settings, alone = self.alone
            lines.append(f"  alone on the {s.cores} cores (others took {s.other_cores:.1f} while it was timed): "
                         f"~{alone.rate:,.0f} img/s, {_limit(alone)}, choosing {settings.describe()}")
        return [*lines, "  from:", *(f"    {what}" for what in self.measured.values())]

    def to_dict(self) -> dict:
        """The report's ``verdict.tuner`` entry (schema.json)."""
        stages = {k: rounded(v, 4) if isinstance(v, float) else v for k, v in asdict(self.stages).items() if k != "storage"}
        storage = self.stages.storage
        alone = None if self.alone is None else {"images_per_s": rounded(self.alone[1].rate),
                                                  "bottleneck": self.alone[1].bottleneck,
                                                  "settings": asdict(self.alone[0]), "describe": self.alone[0].describe()}
        return {"images_per_s": rounded(self.prediction.rate), "fresh_images_per_s": rounded(self.prediction.fresh),
                "bottleneck": self.prediction.bottleneck, "packed": self.packed,
                "settings": asdict(self.settings), "describe": self.settings.describe(),
                "stage_rates": {k: rounded(v) for k, v in self.prediction.rates.items()},
                "stages": {**stages, "storage": {k: rounded(v, 4) for k, v in asdict(storage).items()} if storage else None},
                "measured": self.measured, "alone": alone}


def forecast(f: Figures) -> Forecast | None:
    """The forecast from ``f``; None where stoker.Loader was not timed on the sample (a user's
    Dataset, a transform the Loader cannot take, or a sample its decoder refused)."""
    run = f.loader_run
    if run is None or run.cores_used <= 0:
        return None
    per_core = run.rate / run.cores_used
    had = min(run.threads, f.cores - run.other_cores)
    gil_bound = run.cores_used < GIL_BOUND * had
    measured = {"cores": f"{f.cores} cores, other processes taking {run.other_cores:.1f} while the Loader was timed",
                "per_core": f"{per_core:,.0f} img/s per core (stoker.Loader on the sample pack, {run.rate:,.0f} img/s "
                            f"on {run.cores_used:.1f} cores)",
                "gil": (f"one process's threads at most {run.rate:,.0f} img/s (they kept {run.cores_used:.1f} of "
                        f"{had:.1f} cores busy)" if gil_bound else "the GIL: not reached")}
    source, what = _source(f)
    measured["storage"] = what
    consumer = math.inf
    if f.step_time:
        consumer = f.batch_size / f.step_time
        measured["consumer"] = f"the loop takes {consumer:,.0f} img/s ({f.batch_size} per {f.step_time * 1000:.0f} ms step)"
    remote = f.object_store is not None
    stages = Stages(cores=f.cores, per_core=per_core, other_cores=run.other_cores,
                    gil_rate=run.rate if gil_bound else math.inf, storage=source, remote=remote,
                    image_bytes=max(1.0, f.mean_bytes), block_bytes=DEFAULT_BLOCK_BYTES, consumer=consumer)
    memory = MEMORY_SHARE * f.available_ram_bytes if f.available_ram_bytes > 0 else math.inf  # as a Loader's plan
    settings, prediction = loader_choice(stages, processes=not remote, memory_bytes=memory)
    alone = (loader_choice(replace(stages, other_cores=0.0), processes=not remote, memory_bytes=memory)
             if run.other_cores > SHARED_CORES else None)
    return Forecast(stages, measured, settings, prediction, packed=f.loose, alone=alone)


def _source(f: Figures) -> tuple[Source | None, str]:
    """The storage the Loader would read, and what it was measured from."""
    o = f.object_store
    if o is not None:
        link = o.rate * f.mean_bytes
        return (Source(o.first_byte_ms / 1e3, o.one_request_mb_per_s * 1e6, link),
                f"the object store: first byte after {o.first_byte_ms:.0f} ms, one request {o.one_request_mb_per_s:,.0f} "
                f"MB/s, at most {link / 1e6:,.0f} MB/s with {o.in_flight} in flight")
    if f.sequential_rate is None or f.storage_latency_s is None:
        return None, "storage: not measured on the data's disk (taken as no limit)"
    link = f.sequential_rate * f.mean_bytes
    what = "the sample pack read front to back on the data's disk" if f.loose else "the shards read front to back"
    return (Source(f.storage_latency_s, link_bytes_per_s=link),
            f"the disk: a cold read's first byte after {f.storage_latency_s * 1000:.1f} ms, {link / 1e6:,.0f} MB/s ({what})")


def _limit(prediction: Prediction) -> str:
    """What holds a prediction back, in words."""
    if prediction.bottleneck == "none":
        return "all the training loop takes"
    words = {"cpu": "the cores (decode and transform)", "gil": "the GIL (the Python each image needs)"}
    return f"limited by {words.get(prediction.bottleneck, prediction.bottleneck)}"


def _rate(rate: float) -> str:
    return "unlimited" if math.isinf(rate) else f"{rate:,.0f} img/s"
