"""Compute probes: images per second one core decodes, and transforms stage by stage.

Rates are per core: each probe runs on one thread with torch limited to one thread (as in a
DataLoader worker) and divides by that thread's CPU time (``time.thread_time``), so a busy
machine distorts them less than wall time would. The first item of each probe runs untimed:
the first decode in a fresh process pays one-off start-up costs (measured: 2-3x slower).
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image

from stoker.doctor.numbers import rounded

# Decoded images kept for the transform probe, which cycles through them. Keeping every decoded
# image made the Pillow rate ~30% low here: each decode then faults in fresh pages.
KEPT_IMAGES = 32


@dataclass
class DecodeReport:
    """What the sampled images are and how fast one core decodes them."""

    images: int
    formats: dict[str, int]
    width: dict[str, float]
    height: dict[str, float]
    megapixels: dict[str, float]
    kilobytes: dict[str, float]
    pillow_per_core: float
    jpeg_full_per_core: float | None
    jpeg_reduced_per_core: float | None
    reduced_size: int
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def jpeg_share(self) -> float:
        """The share of decodable images that are JPEGs (what GPU JPEG decoders can take)."""
        return self.formats.get("JPEG", 0) / self.images if self.images else 0.0

    def to_dict(self) -> dict:
        """The report's ``decode`` section."""
        return {"images": self.images, "formats": self.formats, "width": self.width, "height": self.height,
                "megapixels": self.megapixels, "kilobytes": self.kilobytes,
                "pillow_per_core": rounded(self.pillow_per_core),
                "jpeg_full_per_core": rounded(self.jpeg_full_per_core),
                "jpeg_reduced_per_core": rounded(self.jpeg_reduced_per_core), "reduced_size": self.reduced_size,
                "failures": [{"item": name, "reason": reason} for name, reason in self.failures]}


@dataclass
class StageRate:
    """One stage of a transform (or of a data set's item) and its images per second on one core."""

    name: str
    per_core: float

    def to_dict(self) -> dict:
        """One entry of the report's ``transform`` list (``per_core`` null: too fast to measure)."""
        return {"name": self.name, "per_core": rounded(self.per_core)}


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for the duration, as in a DataLoader worker; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def probe_decode(blobs: Sequence[bytes], names: Sequence[str], size: int,
                 seconds: float) -> tuple[DecodeReport, list[Image.Image], list[int]]:
    """Decode ``blobs`` with Pillow (as torchvision's ImageFolder does) and, for JPEGs, with
    simplejpeg at full and at the smallest DCT scale whose short side still covers ``size``.
    Returns the report, the first ``KEPT_IMAGES`` decoded RGB Pillow images (for the transform
    probe) and the positions of the blobs that decoded; one that does not is named in
    ``failures`` with the reason."""
    formats: dict[str, int] = {}
    dims, images, failures, good = [], [], [], []
    timed = 0
    pillow_seconds = 0.0
    deadline = time.perf_counter() + seconds / 3
    for k, (blob, name) in enumerate(zip(blobs, names)):
        start = time.thread_time()
        try:
            with Image.open(io.BytesIO(blob)) as image:
                kind = image.format or "unknown"
                rgb = image.convert("RGB")
        except Exception as e:  # Pillow raises many types for bad data
            failures.append((name, f"{type(e).__name__}: {e}"))
            continue
        if good:  # the first decode pays start-up costs: not timed
            pillow_seconds += time.thread_time() - start
            timed += 1
        formats[kind] = formats.get(kind, 0) + 1
        dims.append((rgb.width, rgb.height, len(blob)))
        if len(images) < KEPT_IMAGES:  # kept images would make every later decode fault in fresh pages
            images.append(rgb)
        good.append(k)
        if time.perf_counter() > deadline:
            break
    jpegs = [blobs[k] for k in good if blobs[k][:2] == b"\xff\xd8"]
    # Reduced scale only where half the image still covers ``size``: elsewhere it is a full decode.
    reducible = [blobs[k] for k, (w, h, _) in zip(good, dims) if blobs[k][:2] == b"\xff\xd8" and min(w, h) >= 2 * size]
    full = _rate(jpegs, lambda b: simplejpeg.decode_jpeg(b, fastdct=True, fastupsample=True), seconds / 3)
    reduced = _rate(reducible, lambda b: simplejpeg.decode_jpeg(b, fastdct=True, fastupsample=True,
                                                                min_height=size, min_width=size), seconds / 3)
    array = np.array(dims, dtype=np.float64).reshape(-1, 3)
    pillow = timed / pillow_seconds if pillow_seconds else (float("inf") if good else 0.0)
    report = DecodeReport(len(images), formats, _spread(array[:, 0]), _spread(array[:, 1]),
                          _spread(array[:, 0] * array[:, 1] / 1e6), _spread(array[:, 2] / 1e3),
                          pillow, full, reduced, size, failures)
    return report, images, good


def transform_stages(transform: Any) -> list[tuple[str, Callable]]:
    """A transform's stages: the ``transforms`` of a torchvision Compose (or of stoker's standard
    transform), the items of a list, or the transform itself as one stage."""
    parts = getattr(transform, "transforms", transform)
    if not isinstance(parts, (list, tuple)):
        parts = [transform]
    return [(_stage_name(part), part) for part in parts]


def probe_stages(stages: Sequence[tuple[str, Callable]], inputs: Sequence[Any], seconds: float) -> list[StageRate]:
    """Run every input through ``stages`` in turn, timing each stage separately on this thread
    (the first input untimed)."""
    spent = np.zeros(len(stages))
    done = 0
    deadline = time.perf_counter() + seconds
    with one_torch_thread():
        for n, item in enumerate(inputs):
            for k, (_, stage) in enumerate(stages):
                start = time.thread_time()
                item = stage(item)
                if n:
                    spent[k] += time.thread_time() - start
            done += 1 if n else 0
            if time.perf_counter() > deadline:
                break
    return [StageRate(name, done / s if s > 0 else float("inf")) for (name, _), s in zip(stages, spent)]


def combined_rate(rates: Sequence[float]) -> float:
    """Images/s of stages run one after another on the same core: 1 / (sum of the 1/rate)."""
    cost = sum(1 / r for r in rates if r > 0 and np.isfinite(r))
    return 1 / cost if cost else float("inf")


def _rate(blobs: Sequence[bytes], decode: Callable[[bytes], Any], seconds: float) -> float | None:
    """Images/s per core of ``decode`` over ``blobs`` (the first untimed), for about ``seconds``."""
    if len(blobs) < 2:
        return None
    deadline = time.perf_counter() + seconds
    done, spent = 0, 0.0
    with contextlib.suppress(ValueError):
        decode(blobs[0])
    for blob in blobs[1:]:
        start = time.thread_time()
        try:
            decode(blob)
        except ValueError:  # Pillow decoded it but libjpeg-turbo's stricter checks did not: not counted
            continue
        finally:
            spent += time.thread_time() - start
        done += 1
        if time.perf_counter() > deadline:
            break
    return done / spent if spent else None


def _spread(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"p10": 0.0, "p50": 0.0, "p90": 0.0}
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return {"p10": round(float(p10), 3), "p50": round(float(p50), 3), "p90": round(float(p90), 3)}


def _stage_name(stage: Any) -> str:
    text = repr(stage)
    if len(text) > 60 or text.startswith("<"):
        text = getattr(stage, "__name__", type(stage).__name__)
    return text
