"""The native path of a batch: one C call (``decode_chunk`` in ``_jpeg_region``) reads, checks,
decodes, crops, resizes and flips a whole chunk of samples with the GIL released.

Per image from Python (per_image.py), the work around the C calls held the GIL for 50-80 us per
image, so a process's threads stopped adding speed after a few cores (issue 30's py-spy figures).
Here Python runs once per chunk: it describes the chunk's reads as arrays
(:meth:`ShardDataset.image_reads`), calls ``decode_chunk``, and learns which samples were made;
:class:`NativeChunk`, the batch engine's decode strategy for it, hands the rest (not JPEG, CMYK,
damaged, read by range from a URL, or of a shard not yet in the node cache: a node-cached copy
that is there is read natively) to the engine's per-image path (images.py,
per_image.py), which decodes what Pillow can and raises or skips as ``on_error`` says.
The pixels are per_image.py's: the C code follows its steps and resizes as cv2.resize does, or,
for an exact crop (a translated Resize + CenterCrop), decodes the whole image as simplejpeg does and
resizes as Pillow does (the _resample extension's code, compiled into both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from stoker.data.dataset import ShardDataset
from stoker.data.mix import Mix
from stoker.decode.crops import RESAMPLE_FILTERS, BatchDraws, CropSpec
from stoker.decode.per_image import PILLOW_PASSES
from stoker.loader.batches import Batch, BatchMaker
from stoker.pixels import native_limit, pixel_limit

decode_chunk: Callable[..., int] | None  # None: the region-decode extension is not built
try:
    from stoker.decode._jpeg_region import decode_chunk
except ImportError:  # its absence is reported once by stoker.env (the region decode's warning)
    decode_chunk = None

_KINDS = {"random_resized": 0, "center": 1, "resize": 2}


@dataclass(frozen=True)
class NativeChunk:
    """The batch engine's decode strategy where the extension is built and samples are cropped
    images: one :func:`decode_samples` call for the positions a thread takes, then the samples it
    did not make one at a time (:meth:`BatchMaker.place_each`)."""

    dataset: ShardDataset | Mix
    host = True

    def place(self, maker: BatchMaker, batch: Batch, positions: np.ndarray, out: np.ndarray | None,
              slots: np.ndarray) -> None:
        assert maker.crop is not None and out is not None  # the plan: cropped images only
        if len(positions):
            draws = BatchDraws(batch.draws.tries[positions], batch.draws.flips[positions])
            made, labels = decode_samples(self.dataset, maker.crop, self.dataset.restart_rows, batch.indices[positions],
                                          draws, out, slots)
            batch.labels.numpy()[positions[made]] = labels[made]
            positions, slots = positions[~made], slots[~made]
        maker.place_each(batch, positions, out, slots)

    def images(self, maker: BatchMaker, batch: Batch) -> torch.Tensor:
        return batch.images


def decode_samples(dataset: ShardDataset | Mix, spec: CropSpec, restarts: bool, indices: np.ndarray, draws: BatchDraws,
                   out: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode samples ``indices`` (with ``draws``, one row each) into ``out[slots]`` (``out``: C-contiguous
    uint8 (N, H, W, 3)); (made, labels): which were made, and their labels. JPEGs above the pixel
    budget (stoker/pixels.py) are not made here, nor allocated for: the per-image path refuses them."""
    assert decode_chunk is not None and out.flags.c_contiguous and out.dtype == np.uint8
    status = np.full(len(indices), 255, np.uint8)
    with dataset.image_reads(indices) as reads:
        covered = np.flatnonzero(reads.covered)
        if len(covered):
            made = np.empty(len(covered), np.uint8)
            decode_chunk(reads.fds[covered], reads.offsets[covered], reads.sizes[covered],
                         None if reads.checksums is None else reads.checksums[covered],
                         np.ascontiguousarray(draws.tries[covered], np.float64), draws.flips[covered].astype(np.uint8),
                         np.ascontiguousarray(slots[covered], np.int64), _spec_tuple(spec, restarts), out, made,
                         native_limit(pixel_limit()))
            status[covered] = made
    return status == 0, reads.labels


def _spec_tuple(spec: CropSpec, restarts: bool) -> tuple[int, int, int, float, float, float, float, float, bool, bool,
                                                       int, int]:
    (out_h, out_w), (scale_lo, scale_hi), (ratio_lo, ratio_hi) = spec.size, spec.scale, spec.ratio
    return (_KINDS[spec.kind], out_h, out_w, float(scale_lo), float(scale_hi), float(ratio_lo), float(ratio_hi),
            float(spec.center_fraction), restarts, spec.exact, RESAMPLE_FILTERS.index(spec.interpolation), PILLOW_PASSES)
