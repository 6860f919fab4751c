"""Turning stored image bytes into what the user asked for."""

from __future__ import annotations

import io
from typing import Literal

import numpy as np
import torch
from PIL import Image

from stoker.ranges import DATASET_DECODE

DecodeMode = Literal["pil", "rgb", "tensor", "raw"]
DECODE_MODES: tuple[str, ...] = DATASET_DECODE.values


def decode_image(data: bytes | memoryview, mode: DecodeMode) -> Image.Image | np.ndarray | torch.Tensor | bytes:
    """``pil``: RGB PIL image (as ImageFolder's loader gives); ``rgb``: HWC uint8 array;
    ``tensor``: CHW uint8 tensor; ``raw``: the stored bytes, undecoded (to time pure I/O). An image
    above the pixel budget (stoker/pixels.py, Pillow's own) raises Pillow's DecompressionBombError
    from its header, before it is decoded."""
    if mode == "raw":
        return bytes(data)  # ``data`` itself when it is bytes; a view (of a reused buffer) copied
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    if mode == "pil":
        return rgb
    if mode == "rgb":
        return np.array(rgb)
    # np.array copies into memory of its own, always writable: np.ascontiguousarray would hand
    # Pillow's read-only buffer on when no copy is needed (a 1x1 image), and torch warns about it
    return torch.from_numpy(np.array(np.asarray(rgb).transpose(2, 0, 1), order="C"))
