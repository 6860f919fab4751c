"""An Augment's photometric ops run by the C extension (``_photometric``), a chunk of crops per call.

A translated torchvision pipeline's batched part is mostly ColorJitter, RandomGrayscale, ToTensor's
scaling and Normalize. ``Augment.apply_image`` runs them per image as ~10 numpy/OpenCV calls that
hold the GIL in between; the extension (``_photometric.c``, its kernels in ``photometric_kernels.c``)
runs them for a chunk of crops in one call without it. :func:`encode` turns a batch's
:class:`~stoker.augment.pipeline.Draws` into each sample's op codes, in the order ``apply_image``
applies them (ColorJitter's drawn per sample), and their parameters: each op's own ``encode``
(color.py), with numpy over the whole batch (no Python per image).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stoker.augment.color import NATIVE
from stoker.augment.opcodes import PARAMS
from stoker.augment.pipeline import Augment, Draws

apply_chunk: Callable[..., None] | None  # None: built without a C compiler (apply_image's path)
try:
    from stoker.augment._photometric import BUILDS, apply_chunk
except ImportError:
    BUILDS, apply_chunk = (), None


class NativeOps(NamedTuple):
    """One batch's ops for ``apply_chunk``: ``codes`` (N, L) int32 and ``params`` (N, L, PARAMS) float64."""

    codes: np.ndarray
    params: np.ndarray


def supports(augment: Augment) -> bool:
    """Whether the extension is built, runs fast on this CPU and computes all of ``augment`` (no
    geometric ops, no blur): otherwise the Loader keeps ``apply_image``. On an x86-64 CPU without
    AVX2 and FMA only the baseline build runs, whose fused multiply-adds libm emulates: ~10x
    ``apply_image``'s time there."""
    if apply_chunk is None or (platform.machine().lower() in ("x86_64", "amd64") and BUILDS[0] == "baseline"):
        return False
    return not augment.geometric and all(isinstance(op, NATIVE) for op in augment.photometric)


def augment_chunk(crops: np.ndarray, out: np.ndarray, ops: NativeOps, positions: np.ndarray) -> None:
    """Augment ``crops`` (m, H, W, 3 uint8) into ``out[positions]`` (float32, or uint8 rounded back)
    with ``ops`` (:func:`encode` of the whole batch), in one call without the GIL."""
    assert apply_chunk is not None
    apply_chunk(crops, out, ops.codes, ops.params, np.ascontiguousarray(positions, np.int64))


def encode(augment: Augment, draws: Draws, n: int) -> NativeOps:
    """Each sample's op codes and parameters for ``draws`` (``augment.draw`` for a batch of ``n``),
    in the order ``augment.apply_image`` applies them. ``augment`` must be :func:`supports`-ed."""
    codes, params = [], []
    for op, values in zip(augment.photometric, draws.params, strict=True):
        if not isinstance(op, NATIVE):
            raise ValueError(f"{op!r} has no native counterpart: check supports(augment) first")
        c, p = op.encode(values, n)
        codes.append(c)
        params.append(p)
    if not codes:
        return NativeOps(np.zeros((n, 0), np.int32), np.zeros((n, 0, PARAMS)))
    return NativeOps(np.ascontiguousarray(np.concatenate(codes, axis=1)),
                     np.ascontiguousarray(np.concatenate(params, axis=1)))
