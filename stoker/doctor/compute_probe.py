"""Compute probes: images per second one core decodes, and transforms stage by stage.

Decode is timed three ways: Pillow on the whole image (what ImageFolder does), simplejpeg on the
whole image, and stoker.Loader's own decode fused with the crop (``decode_into`` with the
Loader's RandomResizedCrop draws at the training size: the DCT scale and the rows it decodes
depend on each crop, so only the Loader's code, on its crops, says what the Loader costs). An
earlier probe asked simplejpeg for the smallest scale covering the size on the whole image; it
picked odd scales (5/8, 3/8) that libjpeg-turbo decodes slower than full size, which the Loader
never uses, and so read slower than a full decode.

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

from stoker.decode.crops import CropSpec, draw_batch
from stoker.decode.per_image import decode_into
from stoker.doctor.numbers import rounded
from stoker.loader.opencv_threads import one_opencv_thread
from stoker.pack.images import inspect_image, shrink_image
from stoker.sources.inputs import BadInput

# Decoded images kept for the transform probe, which cycles through them. Keeping every decoded
# image made the Pillow rate ~30% low here: each decode then faults in fresh pages.
KEPT_IMAGES = 32
# A resolution cap is worth proposing when the median image has this many times the pixels of
# one capped at ``max_side_for(size)`` (a 4:3 image of that longest side).
CAP_WORTH = 1.5


def max_side_for(size: int) -> int:
    """The longest side ``--max-side`` is proposed at for training at ``size`` px: twice it, so
    RandomResizedCrop still finds detail to enlarge."""
    return 2 * size


@dataclass
class DecodeReport:
    """What the sampled images are and how fast one core decodes them. ``images`` counts every
    sampled image that decoded (``formats`` splits that count); ``fused_per_core`` is stoker.Loader's
    decode + crop to ``fused_size`` px; the ``capped_*`` figures are of the same images shrunk
    to ``capped_side`` as ``stoker pack --max-side`` does (measured only when that is proposed):
    the fused rate on them, and their bytes as a share of the originals'."""

    images: int
    formats: dict[str, int]
    width: dict[str, float]
    height: dict[str, float]
    megapixels: dict[str, float]
    kilobytes: dict[str, float]
    pillow_per_core: float
    jpeg_full_per_core: float | None
    fused_per_core: float | None
    fused_size: int
    capped_side: int | None = None
    fused_capped_per_core: float | None = None
    capped_bytes_share: float | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)
    capped_blobs: list[bytes] = field(default_factory=list, repr=False)  # the shrunk images (not reported)

    @property
    def jpeg_share(self) -> float:
        """The share of decodable images that are JPEGs (what GPU JPEG decoders can take), 0 to 1."""
        return self.formats.get("JPEG", 0) / self.images if self.images else 0.0

    def to_dict(self) -> dict:
        """The report's ``decode`` section."""
        return {"images": self.images, "formats": self.formats, "jpeg_share": round(self.jpeg_share, 4),
                "width": self.width, "height": self.height,
                "megapixels": self.megapixels, "kilobytes": self.kilobytes,
                "pillow_per_core": rounded(self.pillow_per_core),
                "jpeg_full_per_core": rounded(self.jpeg_full_per_core),
                "fused_per_core": rounded(self.fused_per_core), "fused_size": self.fused_size,
                "capped_side": self.capped_side, "fused_capped_per_core": rounded(self.fused_capped_per_core),
                "capped_bytes_share": rounded(self.capped_bytes_share, 4),
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
    """Decode ``blobs`` with Pillow (as torchvision's ImageFolder does), with simplejpeg whole,
    and as stoker.Loader does (fused with a RandomResizedCrop to ``size``), about a quarter of
    ``seconds`` each; the last quarter times the fused decode again on the images shrunk to
    ``max_side_for(size)`` where the median image is large enough for that to be proposed.
    Returns the report, the first ``KEPT_IMAGES`` decoded RGB Pillow images (for the transform
    probe) and the positions of the blobs that decoded; one that does not is named in
    ``failures`` with the reason."""
    formats: dict[str, int] = {}
    dims: list[tuple[int, int, int]] = []
    images: list[Image.Image] = []
    failures: list[tuple[str, str]] = []
    good: list[int] = []
    timed = 0
    pillow_seconds = 0.0
    deadline = time.perf_counter() + seconds / 4
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
    decoded = [blobs[k] for k in good]
    jpegs = [blob for blob in decoded if blob[:2] == b"\xff\xd8"]
    full = _rate(len(jpegs), lambda k: simplejpeg.decode_jpeg(jpegs[k], fastdct=True, fastupsample=True), seconds / 4)
    fused = _fused_rate(decoded, size, seconds / 4)
    array = np.array(dims, dtype=np.float64).reshape(-1, 3)
    megapixels = array[:, 0] * array[:, 1] / 1e6
    side = max_side_for(size)
    capped = capped_share = None
    shrunk: list[bytes] = []
    if len(megapixels) and np.median(megapixels) > CAP_WORTH * side * side * 3 / 4 / 1e6:
        originals, shrunk = _shrunk(decoded[:KEPT_IMAGES], side, seconds / 8)
        capped = _fused_rate(shrunk, size, seconds / 8)
        capped_share = sum(map(len, shrunk)) / sum(map(len, originals)) if shrunk else None
    pillow = timed / pillow_seconds if pillow_seconds else (float("inf") if good else 0.0)
    report = DecodeReport(len(good), formats, _spread(array[:, 0]), _spread(array[:, 1]), _spread(megapixels),
                          _spread(array[:, 2] / 1e3), pillow, full, fused, size,
                          side if capped is not None else None, capped, capped_share, failures, shrunk)
    return report, images, good


def _fused_rate(blobs: Sequence[bytes], size: int, seconds: float) -> float | None:
    """Images/s per core of stoker.Loader's decode fused with its default crop (RandomResizedCrop
    to ``size`` with flips), on the Loader's own draws."""
    spec = CropSpec(size=(size, size))
    draws = draw_batch(0, 0, 0, max(1, len(blobs)), spec)
    out = np.empty((size, size, 3), np.uint8)
    with one_opencv_thread():  # as in a Loader's pass, and timed by this thread's CPU time
        return _rate(len(blobs), lambda k: decode_into(blobs[k], spec, draws.tries[k], bool(draws.flips[k]), out),
                     seconds)


def shrink_as_pack(blob: bytes, side: int) -> bytes | None:
    """``blob`` as ``stoker pack --max-side side`` stores it (the same function, quality 90);
    None where pack would reject it."""
    try:
        return shrink_image(blob, inspect_image(blob), side, 90) or blob
    except (BadInput, OSError, ValueError):  # the Pillow pass names what does not decode
        return None


def _shrunk(blobs: Sequence[bytes], side: int, seconds: float) -> tuple[list[bytes], list[bytes]]:
    """The ``blobs`` pack can shrink and what it makes of them, for about ``seconds`` (at least two)."""
    originals, out, deadline = [], [], time.perf_counter() + seconds
    for blob in blobs:
        shrunk = shrink_as_pack(blob, side)
        if shrunk is not None:
            originals.append(blob)
            out.append(shrunk)
        if time.perf_counter() > deadline and len(out) >= 2:
            break
    return originals, out


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


def _rate(count: int, decode: Callable[[int], Any], seconds: float) -> float | None:
    """Images/s per core of ``decode(k)`` over items ``0 .. count - 1`` (the first untimed), for
    about ``seconds``; items the decoder refuses are not counted."""
    if count < 2:
        return None
    deadline = time.perf_counter() + seconds
    done, spent = 0, 0.0
    with contextlib.suppress(ValueError, OSError):
        decode(0)
    for k in range(1, count):
        start = time.thread_time()
        try:
            decode(k)
        except (ValueError, OSError):  # Pillow decoded it but libjpeg-turbo's stricter checks did not: not counted
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
