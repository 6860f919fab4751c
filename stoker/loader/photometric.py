"""An Augment's photometric ops as the arrays ``_photometric.apply_chunk`` runs, once per batch.

A translated torchvision pipeline's batched part is mostly ColorJitter, RandomGrayscale, ToTensor's
scaling and Normalize. ``Augment.apply_image`` runs them per image as ~10 numpy/OpenCV calls that
hold the GIL in between; the extension (``_photometric.c``) runs them for a chunk of crops in one
call without it. :func:`encode` turns a batch's :class:`~stoker.augment.pipeline.Draws` into each
sample's op codes, in the order ``apply_image`` applies them (ColorJitter's drawn per sample), and
their parameters, with numpy over the whole batch (no Python per image).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stoker.augment.color import _JITTERS, _ORDERS, ColorJitter, Grayscale, Normalize
from stoker.augment.pipeline import Augment, Draws

apply_chunk: Callable[..., None] | None  # None: built without a C compiler (apply_image's path)
try:
    from stoker.loader._photometric import BUILDS, apply_chunk
except ImportError:
    BUILDS, apply_chunk = (), None

PARAMS = 6  # numbers per op slot (Normalize's 1/std and -mean/std of r, g, b); _photometric.PARAMS
BRIGHTNESS, CONTRAST, SATURATION, HUE, GRAYSCALE, NORMALIZE = range(1, 7)  # _photometric's op codes
_JITTER_CODES = np.array([BRIGHTNESS, CONTRAST, SATURATION, HUE], np.int32)  # in _JITTERS' order


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
    return not augment.geometric and all(isinstance(op, ColorJitter | Grayscale | Normalize) for op in augment.photometric)


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
        if isinstance(op, ColorJitter):
            c, p = _jitter(op, values)
        elif isinstance(op, Grayscale):
            c, p = np.full((n, 1), GRAYSCALE, np.int32), _slots(values["on"][:, None])
        elif isinstance(op, Normalize):
            scale = 1 / np.asarray(op.std, np.float64)  # as Normalize.apply_image computes its matrix
            row = np.concatenate([scale, -np.asarray(op.mean, np.float64) * scale])
            c, p = np.full((n, 1), NORMALIZE, np.int32), np.broadcast_to(row, (n, 1, PARAMS))
        else:
            raise ValueError(f"{op!r} has no native counterpart: check supports(augment) first")
        codes.append(c)
        params.append(p)
    if not codes:
        return NativeOps(np.zeros((n, 0), np.int32), np.zeros((n, 0, PARAMS)))
    return NativeOps(np.ascontiguousarray(np.concatenate(codes, axis=1)),
                     np.ascontiguousarray(np.concatenate(params, axis=1)))


def _jitter(op: ColorJitter, values: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """ColorJitter's adjustments that are on, each sample's in its drawn order, and their values."""
    orders = _ORDERS[values["order"].round().astype(np.int64)]  # (n, 4) indices into _JITTERS
    on = np.array([op.ranges[name] is not None for name in _JITTERS])[orders]
    drawn = np.stack([values[name] for name in _JITTERS], axis=1)
    n, k = len(orders), int(on[0].sum()) if len(orders) else 0
    return (_JITTER_CODES[orders][on].reshape(n, k),
            _slots(np.take_along_axis(drawn, orders, axis=1)[on].reshape(n, k)))


def _slots(values: np.ndarray) -> np.ndarray:
    """(n, k) single values as (n, k, PARAMS) slots, the value first."""
    slots = np.zeros((*values.shape, PARAMS))
    slots[..., 0] = values
    return slots

