"""The doctor's report: every measurement and the verdict, as a dict (``--json``, validated by
``schema.json``) and as readable text for the terminal."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from stoker.doctor.compute_probe import DecodeReport, StageRate
from stoker.doctor.contention import CpuShare
from stoker.doctor.loader_probe import LoaderRow
from stoker.doctor.nodes import NodeForecast
from stoker.doctor.numbers import rounded
from stoker.doctor.pack_probe import PackProbe
from stoker.doctor.prove import Proof
from stoker.doctor.remedies import Remedy
from stoker.doctor.remote_probe import RemoteReport, size_words
from stoker.doctor.storage_probe import StorageReport
from stoker.doctor.verdict import Verdict, gpu_idle

SCHEMA_PATH = Path(__file__).with_name("schema.json")
# 3: sample_pack.loader_capped; 4: cpu_contention, loaders[].other_cores; 5: object_store, target.remote;
# 6: verdict.tuner, nodes (the forecast of --nodes); 7: verdict.tuner.stages.other_demand
SCHEMA_VERSION = 7


@dataclass
class DoctorReport:
    """What :func:`stoker.doctor` measured and concluded. ``storage`` and ``decode`` are ``None``
    for a user's Dataset object, whose stored bytes the doctor cannot see; ``notes`` say how the
    measurement departed from the settings asked for; ``compute_cpu`` the CPU other processes
    took during the decode and transform probes (the loader rows carry their own); ``remote``
    the object-store probe of data at a URL (then ``storage`` is ``None``); ``nodes`` what a job
    of several nodes would fetch (``--nodes``)."""

    target: dict
    settings: dict
    storage: StorageReport | None
    decode: DecodeReport | None
    stages: list[StageRate]
    loaders: list[LoaderRow]
    verdict: Verdict
    seconds: float
    notes: list[str] = field(default_factory=list)
    sample_pack: PackProbe | None = None
    proof: list[Proof] | None = None
    compute_cpu: CpuShare | None = None
    remote: RemoteReport | None = None
    nodes: NodeForecast | None = None

    @property
    def bottleneck(self) -> str:
        """``storage``, ``decode``, ``transform``, ``loader overhead`` or ``none``."""
        return self.verdict.bottleneck

    def to_dict(self) -> dict:
        """Everything measured and concluded, as ``schema.json`` describes it."""
        step, batch = self.settings.get("step_time"), self.settings["batch_size"]
        return {"schema_version": SCHEMA_VERSION, "target": self.target, "settings": self.settings,
                "storage": self.storage.to_dict() if self.storage else None,
                "object_store": self.remote.to_dict() if self.remote else None,
                "decode": self.decode.to_dict() if self.decode else None,
                "transform": [s.to_dict() for s in self.stages],
                "loaders": [{**row.to_dict(), "gpu_idle_fraction": _idle(row.images_per_s, batch, step)}
                            for row in self.loaders],
                "sample_pack": self.sample_pack.to_dict() if self.sample_pack else None,
                "cpu_contention": self._cpu_contention(),
                "verdict": self.verdict.to_dict(),
                "proof": [p.to_dict() for p in self.proof] if self.proof is not None else None,
                "nodes": self.nodes.to_dict() if self.nodes else None,
                "seconds": round(self.seconds, 2), "notes": self.notes}

    def to_json(self) -> str:
        """The report as strict JSON (no NaN or Infinity: what was not measured is null)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_text(self) -> str:
        """The terminal report: what was examined, each probe's table, the verdict and remedies."""
        t, v = self.target, self.verdict
        lines = [f"stoker doctor: {t['description']} ({t['kind']}, {t['num_samples']:,}"
                 f"{' (estimated)' if t['estimated'] else ''} items; {t['sample_size']} sampled) in {self.seconds:.0f} s"]
        if self.storage:
            lines += ["", "Storage", *_storage_lines(self.storage)]
        if self.remote:
            lines += ["", *_object_store_lines(self.remote)]
        if self.decode:
            lines += ["", *_decode_lines(self.decode)]
        if self.stages:
            lines += ["", "Transform (one core, each stage timed apart)"]
            lines += [f"  {s.name[:48]:48} {s.per_core:10,.0f} img/s per core" if math.isfinite(s.per_core)
                      else f"  {s.name[:48]:48} {'(too few items to time)':>26}" for s in self.stages]
        if self.loaders:
            step, batch = self.settings.get("step_time"), self.settings["batch_size"]
            lines += ["", f"Loaders (warm cache, batch {batch})" + (f", GPU idle at {step * 1000:.0f} ms/step" if step else "")]
            for row in self.loaders:
                idle = _idle(row.images_per_s, batch, step)
                lines.append(f"  {row.name:32} {row.images_per_s:8,.0f} img/s   first batch {row.first_batch_s:5.2f} s"
                             + (f"   GPU idle {idle:.0%}" if idle is not None else "")
                             + (f"   others used {row.cpu.other_cores:.1f} cores" if row.cpu and row.cpu.shared else ""))
        if self.sample_pack:
            lines += _pack_lines(self.sample_pack)
        cpu = self._cpu_line()
        lines += ["", cpu] if cpu else []
        lines += ["", *self.nodes.lines()] if self.nodes else []
        lines += ["", f"Verdict: {v.bottleneck.upper()}" + ("" if v.bottleneck == "none" else " is the bottleneck")]
        lines += [f"  - {reason}" for reason in v.reasons]
        if v.tuner is not None:
            lines += ["", "The Loader's tuner (stoker.tune's pipeline model on the figures above)", *v.tuner.lines()]
        if v.remedies:
            lines += ["", "Remedies, best first (predicted img/s, from rates measured on the sample)"]
            for k, r in enumerate(v.remedies, 1):
                lines += _remedy_lines(k, r)
        if self.proof is not None:
            lines += ["", *_proof_lines(self.proof, self.settings)]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _cpu_shares(self) -> list[CpuShare]:
        """The CPU watched during each probe: decode and transform, then every loader row."""
        return [share for share in [self.compute_cpu, *(row.cpu for row in self.loaders)] if share is not None]

    def _cpu_contention(self) -> dict | None:
        """The report's ``cpu_contention``: what other processes took of the cores during the probes."""
        shares = self._cpu_shares()
        if not shares:
            return None
        others = [share.other_cores for share in shares if share.other_cores is not None]
        return {"cores": shares[0].cores, "shared": any(share.shared for share in shares),
                "most_other_cores": rounded(max(others), 3) if others else None,
                "decode_and_transform": self.compute_cpu.to_dict() if self.compute_cpu else None}

    def _cpu_line(self) -> str | None:
        """One line on other processes' CPU during the probes (None: none was watched)."""
        shares = self._cpu_shares()
        others = [share.other_cores for share in shares if share.other_cores is not None]
        if not shares:
            return None
        if not others:
            return "CPU: what other processes used during the probes is not measurable here (no /proc/stat)"
        cores = shares[0].cores
        if not any(share.shared for share in shares):
            return f"CPU: no other process used much of the {cores} cores during the probes (at most {max(others):.1f})"
        compute = self.compute_cpu.other_cores if self.compute_cpu else None
        return (f"CPU: other processes used up to {max(others):.1f} of the {cores} cores during the probes"
                + (f" ({compute:.1f} during decode and transform)" if compute is not None else "")
                + ": the loader rows are lower than this machine gives one job; the per-core decode and transform "
                "rates count this process's CPU time, which others do not take")


def _decode_lines(d: DecodeReport) -> list[str]:
    """The decode table: what the images are (counts that add up to ``images``) and each decoder's rate."""
    kinds = ", ".join(f"{k} {n} ({n / d.images:.0%})" for k, n in sorted(d.formats.items(), key=lambda kv: -kv[1]))
    lines = [f"Decode (one core; {d.images} images: {kinds}; median {d.width['p50']:.0f}x{d.height['p50']:.0f} px, "
             f"{d.megapixels['p50']:.2f} MP, {d.kilobytes['p50']:.0f} KB)",
             f"  Pillow, full size (as ImageFolder)            {d.pillow_per_core:8,.0f} img/s per core"]
    if d.jpeg_full_per_core:
        lines.append(f"  simplejpeg, full size                         {d.jpeg_full_per_core:8,.0f} img/s per core")
    if d.fused_per_core:
        lines.append(f"  stoker.Loader's decode + crop to {d.fused_size} px       {d.fused_per_core:8,.0f} img/s per core")
    if d.fused_capped_per_core:
        lines.append(f"  the same, shrunk to {d.capped_side} px (--max-side)  {d.fused_capped_per_core:8,.0f} img/s per core"
                     f" ({d.capped_bytes_share:.0%} of the bytes)")
    return lines + [f"  could not read {name}: {reason}" for name, reason in d.failures[:5]]


def _pack_lines(p: PackProbe) -> list[str]:
    """Where the stoker.Loader rows above come from."""
    where = "on the data's disk" if p.same_device else "on another disk than the data's"
    line = (f"  (stoker.Loader rows: the {p.distinct} sampled images packed, {p.images} images, {p.nbytes / 1e6:,.1f} MB, "
            f"{where}" + (f"; read front to back cold at {p.sequential_mb_per_s:,.1f} MB/s)" if p.sequential_mb_per_s else ")"))
    return [line] + [f"  note: {note}" for note in p.notes]


def _remedy_lines(k: int, r: Remedy) -> list[str]:
    """One remedy: name and prediction, what the prediction comes from, the code, why."""
    value = f"{r.predicted_images_per_s:,.0f} img/s" if r.predicted_images_per_s is not None else f"needs {r.needs}"
    source = [f"     {r.prediction.in_words()}"] if r.predicted_images_per_s is not None else []
    return [f"  {k}. {r.name}: {value}", *source, f"     {r.how}", f"     ({r.why})"]


def _proof_lines(proof: list[Proof], settings: dict) -> list[str]:
    """Predicted against measured, side by side."""
    step = settings.get("step_time")
    head = (f"Proof: the top remedies run on the sample (batch {settings['batch_size']}"
            + (f", a {step * 1000:.0f} ms sleep per step as the GPU" if step else ", no step time") + ")")
    lines = [head, f"  {'remedy':58} {'predicted':>9} {'measured':>9} {'ratio':>6}"]
    for p in proof:
        lines.append(f"  {p.name[:58]:58} {p.expected:9,.0f} {p.measured:9,.0f} {p.ratio:6.2f}")
        lines.append(f"     ({p.setup}; {p.seconds:.1f} s)")
    return lines if proof else [head, "  nothing was run (see the notes)"]


def _storage_lines(s: StorageReport) -> list[str]:
    lines = [f"  {'':26} {'reads/s':>8} {'MB/s':>7} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7} stalls"]
    for label, stats in (("cold, one at a time", s.cold), ("warm, one at a time", s.warm),
                         (f"cold, {s.cold_parallel.concurrency if s.cold_parallel else 0} at a time", s.cold_parallel)):
        if stats is None or not stats.reads:
            continue
        lat = stats.to_dict()["latency_ms"]
        lines.append(f"  {label:26} {stats.per_second:8,.0f} {stats.mb_per_second:7.1f} {lat['p50']:7.2f} "
                     f"{lat['p90']:7.2f} {lat['p99']:7.2f} {lat['max']:7.1f} {len(stats.stalls)}")
    for name, ms in (s.cold.stalls if s.cold else [])[:5]:
        lines.append(f"    stall: {ms:.0f} ms reading {name}")
    for stats in (s.cold, s.cold_parallel):
        lines += [f"    could not read {name}: {reason}" for name, reason in (stats.failures if stats else [])[:5]]
    lines.append(f"  eviction {'worked' if s.eviction_worked else 'did NOT work'}; mean item {s.mean_item_bytes / 1e3:.0f} KB")
    for label, value in (("large sequential reads", s.sequential_mb_per_s), ("copy into RAM (/dev/shm)",
                         s.copy_to_ram_mb_per_s), ("copy onto the SSD", s.copy_to_ssd_mb_per_s)):
        if value is not None:
            lines.append(f"  {label:26} {value:8.1f} MB/s")
    if s.contention and not s.contention.shared:  # a shared disk is in the notes
        lines.append(f"  {s.contention.describe()}")
    return lines + [f"  note: {note}" for note in s.notes]


def _object_store_lines(r: RemoteReport) -> list[str]:
    """The object store: first bytes, one request, each level of reads in flight, the proposal."""
    lat = r.to_dict()["first_byte_ms"]
    size = size_words(r.read_bytes if r.packed else 0)
    lines = [f"Object store ({r.bounds.in_words()}; spent {r.bytes_read / 1e6:,.1f} MB in {r.seconds:.1f} s)",
             f"  first byte        p50 {lat['p50'] or 0:8.1f} ms   p99 {lat['p99'] or 0:8.1f} ms   "
             f"({lat['requests']} ranged 1-byte GETs, one at a time)",
             f"  one request       {r.one_request_mb_per_s:8.1f} MB/s   ({len(r.streams)} GETs of "
             f"{sum(n for n, _ in r.streams) / max(1, len(r.streams)) / 1e6:,.1f} MB, one at a time)",
             f"  reads of {size} in flight:      MB/s     img/s"]
    proposed = r.reads_in_flight
    for level in r.levels:
        mark = "   <- proposed" if level.in_flight == proposed else ""
        lines.append(f"  {level.in_flight:22} {level.mb_per_s:10.1f} {r.images_per_s(level.mb_per_s):9,.0f}{mark}")
    stage = r.stage
    where = ("" if stage is None else f"; node cache in {stage['cache_dir']}"
             + (f" (limit {stage['cache_limit'] / 1e9:,.1f} GB: the data set does not fit)" if stage["cache_limit"] else ""))
    lines.append(f"  proposed: {proposed} reads of {size} in flight{where}: ~{r.expected_mb_per_s:,.0f} MB/s, "
                 f"~{r.images_per_s(r.expected_mb_per_s):,.0f} img/s at {r.mean_item_bytes / 1e3:,.0f} KB per image")
    lines += [f"  could not read {name}: {reason}" for name, reason in r.failures[:5]]
    return lines + [f"  note: {note}" for note in r.notes]


def _idle(rate: float, batch: int, step: float | None) -> float | None:
    idle = gpu_idle(rate, batch, step)
    return None if idle is None else round(idle, 3)
