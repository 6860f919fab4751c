"""Samples that are images, of a ShardDataset or a Mix of them, placed one at a time from Python:
what the native chunk call leaves (not JPEG, CMYK, damaged, read remotely ...), or every sample
where it does not run. The pixels are per_image.py's, which the native path follows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.data.dataset import ShardDataset
from stoker.data.decode import decode_image
from stoker.data.mix import Mix
from stoker.decode.crops import CropSpec
from stoker.decode.per_image import decode_into
from stoker.decode.scratch import thread_buffer
from stoker.loader.batches import Batch, BatchMaker

# Images larger than this are read into new bytes instead of the thread's reused buffer.
_READ_BUFFER_BYTES = 16 << 20


@dataclass(frozen=True)
class Images:
    """The :class:`~stoker.loader.batches.Samples` of a ShardDataset or a Mix of them."""

    dataset: ShardDataset | Mix

    def shape(self, crop: CropSpec | None) -> tuple[int, ...]:
        """(H, W, 3); (0,) for whole images (their pixels are kept per sample)."""
        return (*crop.size, 3) if crop is not None else (0,)

    def place(self, maker: BatchMaker, batch: Batch, j: int, out: np.ndarray | None) -> int:
        """Read sample ``j`` of ``batch``, decode and crop it into ``out``; with ``out`` None, decode
        the whole image as ImageFolder's loader does (an RGB PIL image) into ``batch.held[j]`` for
        the transform. Its label."""
        index, crop = int(batch.indices[j]), maker.crop
        data, label = self.dataset.read_image(index, None if out is None else thread_buffer("read", _READ_BUFFER_BYTES))
        try:
            if out is None or crop is None:
                batch.held[j] = decode_image(bytes(data), "pil")  # type: ignore[index]  # start() made it (a transform)
            else:
                decode_into(data, crop, batch.draws.tries[j], bool(batch.draws.flips[j]), out, self.dataset.restart_rows)
        except Exception as e:  # decoders raise many types for bad data
            raise self.dataset.decode_error(index, e) from None
        return label
