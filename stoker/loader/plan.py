"""The Loader's plan: every decision about its passes, made once, by one pure function.

    (the data set's Description, the Options, the Machine) ──plan_loader──> LoaderPlan (frozen)
        transform   the torchvision pipeline split (torchvision_plan.py): fused crop, batched ops, per-sample rest
        decode      native: one decode_chunk call per chunk of samples; python: per image; gpu: nvJPEG
        augment     none; native: _photometric per chunk of crops; opencv: per image in the threads;
                    device: torch ops on the GPU the batches go to
        settings    threads in this process, or worker processes of a few threads; batches made ahead,
                    blocks read ahead, an object store's reads in flight and their size, echo (Settings)
        bounds      what the tuner may set each of those to (stoker.tune; None: tune=False)
    a tuner's decision ──LoaderPlan.tuned──> a new LoaderPlan (its settings, the decision logged)
    tune=False: threads for the first pass, which measures what to run the next ones with
    ──LoaderPlan.measured──> a new LoaderPlan (its workers chosen by workers.py)

``explain()``, the batch engine (engine.py picks its strategies from the plan) and each pass read
the plan; nothing changes it: a decision makes a new one. Options that are wrong alone are refused before (loader.py, through
stoker/ranges.py); the plan refuses what does not go together (OptionError).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from stoker.augment.device import default_device
from stoker.augment.native import supports
from stoker.augment.pipeline import Augment
from stoker.counters import available_memory
from stoker.data.world import local_world_size
from stoker.decode.crops import CropSpec
from stoker.errors import OptionError
from stoker.loader import native_chunk
from stoker.loader.workers import WorkerChoice, available_cores, choose_workers
from stoker.storage.remote import DOWNLOAD_PART
from stoker.transforms.torchvision_plan import Step, TransformPlan, plan
from stoker.tune.settings import INF, Bounds, Settings, loader_bounds, loader_start
from stoker.tune.tuner import Decision

DecodeRoute = Literal["native", "python", "gpu"]
AugmentRoute = Literal["none", "native", "opencv", "device"]
# The share of the memory free when a Loader is made that its tuner may take (batches ahead, echoes,
# worker processes, an object store's blocks read ahead).
MEMORY_SHARE = 0.25
# The tuner's latest decisions a plan keeps (explain() shows them).
DECISIONS_KEPT = 16


@dataclass(frozen=True)
class Description:
    """What the plan needs of the data set: ``clips`` (a VideoClipDataset or a Mix of them; else
    images), ``mix``, the clips' ``clip_layout`` (THWC or TCHW), whether its bytes are
    ``fetched_per_process`` (an object store without a node cache: see workers.py), come from an
    object store at all (``remote``; ``reads_in_flight`` given to the data set, None where it
    was left to tune), and go through a node cache (``cached``: its stager reads ahead, not hints)."""

    clips: bool = False
    mix: bool = False
    clip_layout: str | None = None
    fetched_per_process: bool = False
    remote: bool = False
    reads_in_flight: int | None = None
    cached: bool = False


@dataclass(frozen=True)
class Options:
    """The Loader's options the plan decides from, each checked alone already."""

    crop: CropSpec | None = None
    transform: Callable | None = None
    threads: int | None = None
    processes: int | None = None
    decode: Literal["cpu", "gpu"] = "cpu"
    device: torch.device | None = None
    layout: Literal["NCHW", "NHWC"] | None = None
    on_error: Literal["raise", "skip"] = "raise"
    prefetch: int | None = None
    tune: bool = True
    echo: Literal["auto"] | None = None
    window: int = 16
    hints: bool = True  # the order reads blocks ahead (quasi-random, sequential), not one sample each


@dataclass(frozen=True)
class Machine:
    """What the plan needs of the machine: its cores, whether the region-decode and photometric
    extensions run here, the GPU that ``decode="gpu"`` takes by default (None: not asked), and
    the ``memory`` (bytes) free for the taking, of which the tuner may use :data:`MEMORY_SHARE`, and
    the ranks of this node sharing its cores."""

    cores: int
    region_decode: bool = True
    photometric: bool = True
    gpu: torch.device | None = None
    memory: float = INF
    ranks_here: int = 1  # the ranks of this node (torchrun's LOCAL_WORLD_SIZE)


def machine(decode: str) -> Machine:
    """This machine. Its GPU is asked for only with ``decode="gpu"``: asking initialises CUDA, and a
    process forked after that cannot use it."""
    # An Augment without ops is supported exactly where the photometric extension is built and fast.
    photometric = supports(Augment(device="cpu", backend="opencv", threads=1))
    return Machine(available_cores(), native_chunk.decode_chunk is not None, photometric,
                   default_device() if decode == "gpu" else None, available_memory(),
                   max(1, local_world_size()))


@dataclass(frozen=True)
class LoaderPlan:
    """Every decision about the Loader's passes (see the module's docstring); ``why_python``: why
    samples are not decoded natively, where they are not; ``why_workers``: why its workers are
    what ``settings`` says; ``decisions``: the tuner's latest ones, each with its measurement."""

    clips: bool
    transform: TransformPlan
    decode: DecodeRoute
    why_python: str
    augment: AugmentRoute
    settings: Settings
    why_workers: str
    measuring: bool
    bounds: Bounds | None
    device: torch.device | None
    layout: Literal["NCHW", "NHWC"]
    cores: int
    fetched_per_process: bool
    decisions: tuple[Decision, ...] = ()

    @property
    def crop(self) -> CropSpec | None:
        """What every sample is cut to (None: whole images, for a per-sample transform)."""
        return self.transform.crop

    @property
    def workers(self) -> WorkerChoice:
        """The worker processes and threads, and why."""
        return WorkerChoice(self.settings.processes, self.settings.threads, self.why_workers)

    def measured(self, cores_used: float, waited: float) -> LoaderPlan:
        """The plan for the passes after the first one measured ``cores_used`` and the share of the
        time the loop ``waited`` (see :func:`choose_workers`): with ``tune=False``."""
        workers = choose_workers(self.cores, self.workers.threads, cores_used, waited, self.fetched_per_process)
        settings = replace(self.settings, processes=workers.processes, threads=workers.threads)
        return replace(self, settings=settings, why_workers=workers.reason, measuring=False)

    def tuned(self, decision: Decision) -> LoaderPlan:
        """The plan after the tuner's ``decision``: its settings, the decision logged (the latest
        :data:`DECISIONS_KEPT`)."""
        workers = decision.settings.worker_layout != self.settings.worker_layout
        return replace(self, settings=decision.settings, decisions=(*self.decisions, decision)[-DECISIONS_KEPT:],
                       why_workers=f"tuned: {decision.describe()}" if workers else self.why_workers)

    def explain(self, head: str, next_pass: str) -> str:
        """What runs where and why, after ``head`` and the ``next_pass`` line (stoker.Loader.explain)."""
        processes, threads = self.workers.processes, self.workers.threads
        where = {"none": "stoker.augment", "device": f"stoker.augment on {self.device}, whole batches",
                 "native": "stoker.augment on the CPU, one native call per chunk of crops on each thread, the GIL "
                           "released (stoker.augment._photometric), parameters drawn per batch",
                 "opencv": "stoker.augment on the CPU, each image by the loader thread that decoded it "
                           "(stoker.augment's OpenCV ops), parameters drawn per batch"}[self.augment]
        if processes:
            where += f", in {processes} worker processes of {threads} thread{'s' * (threads > 1)} each"
        route = {"native": "one native call per chunk of samples on each thread, the GIL released (decode_chunk)",
                 "python": f"per image from Python ({self.why_python})",
                 "gpu": f"the threads read each sample's bytes, nvJPEG decodes and crops each batch on {self.device}"}
        lines = [head, next_pass, f"  workers: {self.workers.describe()} ({self.workers.reason})",
                 f"  settings: {self.settings.describe()} ({self._tuning()})",
                 f"  read, decode, crop: {route[self.decode]}", self.transform.explain(where)]
        lines += [f"  tuner: {decision.describe()}" for decision in self.decisions]
        if self.transform.per_sample and not processes:
            lines.append("  note: random ops that run per sample draw from torch's and Python's global generators, "
                         "as in a DataLoader: not fixed by seed with threads; processes=N seeds them per batch")
        return "\n".join(lines)


    def _tuning(self) -> str:
        """Which settings the tuner may change, in words."""
        if self.bounds is None:
            return "fixed: tune=False"
        free = [name for name in self.bounds.knobs() if self.bounds.free(name)]
        return f"tuned while it runs: {', '.join(free)}" if free else "all fixed by the arguments given"


def plan_loader(data: Description, options: Options, here: Machine) -> LoaderPlan:
    """The plan of a Loader over ``data`` with ``options`` on ``here``; OptionError for options
    that do not go together."""
    gpu = options.decode == "gpu"
    if gpu and options.on_error == "skip":
        raise OptionError("on_error='skip' needs decode='cpu': images are decoded on the GPU as a whole batch")
    if gpu and data.mix:
        raise OptionError("decode='gpu' reads one ShardDataset: a stoker.Mix is decoded on the CPU (decode='cpu')")
    steps = _transform_plan(data.clips, options.transform, options.crop)
    device = _gpu(data, steps, options, here) if gpu else options.device
    given = options.processes is not None or options.threads is not None
    measuring = not given and not gpu and not options.tune
    processes = options.processes or 0
    start = replace(loader_start(here.cores, options.window, data.reads_in_flight or 16), processes=processes,
                    threads=options.threads or (1 if processes else here.cores + 1), prefetch=options.prefetch or 2,
                    part_bytes=DOWNLOAD_PART if data.cached else loader_start(1).part_bytes)
    why_workers = ("as given" if given or gpu else "threads until the first batches are measured" if measuring
                   else "one more than the cores, until the tuner measures them")
    why = "" if gpu else ("video clips: each clip's frames read and decoded from Python" if data.clips else
                          "whole images: no crop to fuse" if steps.crop is None else
                          "" if here.region_decode else "the region-decode extension is not built here (see stoker env)")
    decode: DecodeRoute = "gpu" if gpu else "python" if why else "native"
    return LoaderPlan(data.clips, steps, decode, why, _augment_route(steps, device, here), start, why_workers,
                      measuring, _bounds(data, options, here, start) if options.tune else None, device,
                      options.layout or ("NHWC" if data.clip_layout == "THWC" else "NCHW"), here.cores,
                      data.fetched_per_process)


def _bounds(data: Description, options: Options, here: Machine, start: Settings) -> Bounds:
    """What the tuner may set from ``start``: stoker.tune's bounds for a Loader, each knob an
    argument fixes kept as given (``threads``, ``processes``, ``prefetch``, the data set's
    ``reads_in_flight``; the workers with decode="gpu"), no read-ahead where none is hinted, and
    :data:`MEMORY_SHARE` of the memory free."""
    bounds = loader_bounds(here.cores, start, remote=data.remote, echo=options.echo == "auto",
                           processes=not data.fetched_per_process and options.decode == "cpu",
                           memory_bytes=MEMORY_SHARE * here.memory, ranks_here=here.ranks_here)
    fixed = {"prefetch": options.prefetch is not None, "reads_in_flight": data.reads_in_flight is not None,
             "readahead": not options.hints or data.cached,
             "threads": options.threads is not None or options.processes is not None or options.decode == "gpu"}
    fixed["processes"] = fixed["threads"]
    kept: dict[str, Any] = {knob: (getattr(start, knob),) * 2 for knob, is_fixed in fixed.items() if is_fixed}
    return replace(bounds, **kept)


def _transform_plan(clips: bool, transform: Callable | None, crop: CropSpec | None) -> TransformPlan:
    """What becomes of ``transform``: a torchvision pipeline over images is translated
    (torchvision_plan.py); over video clips, any transform runs per clip as given."""
    if not clips:
        return plan(transform, crop)
    if transform is None:
        return TransformPlan(crop or CropSpec())
    steps = (Step(repr(transform), "per sample", "video clips: run as given on each (T, 3, H, W) uint8 clip"),)
    return TransformPlan(crop or CropSpec(), per_sample=(transform,), steps=steps)


def _gpu(data: Description, steps: TransformPlan, options: Options, here: Machine) -> torch.device:
    """The CUDA device that decodes with decode="gpu", or why there is none."""
    if data.clips:
        raise OptionError("decode='gpu' decodes images; video clips are decoded on the CPU")
    if steps.per_sample or steps.crop is None or options.processes:
        raise OptionError("decode='gpu' makes batches on the GPU: no per-sample transform or worker processes "
                          "(augment the batch there with stoker.augment)")
    device = options.device or here.gpu
    if device is None or device.type != "cuda":
        raise OptionError(f"decode='gpu' needs a CUDA device, got {device} (no GPU here? decode='cpu' decodes with "
                          "threads)")
    return device


def _augment_route(steps: TransformPlan, device: torch.device | None, here: Machine) -> AugmentRoute:
    """Where the batched ops run: on the GPU the batches go to (unless a per-sample rest follows
    them), else in the loader's threads, natively where the photometric extension computes them all."""
    if not steps.ops and steps.stage != "float":
        return "none"
    if not steps.per_sample and device is not None and device.type != "cpu":
        return "device"
    if here.photometric and supports(Augment(*steps.ops, device="cpu", backend="opencv", threads=1)):
        return "native"
    return "opencv"
