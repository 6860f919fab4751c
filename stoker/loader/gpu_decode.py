"""``Loader(decode="gpu")``: CPU threads only read each sample's bytes; the GPU decodes the whole
batch (nvJPEG, through torchvision's batched ``decode_jpeg(device="cuda")``, the ``gpu`` extra)
and cuts each image's crop straight into the batch on the GPU.

nvJPEG through torchvision decodes baseline and extended sequential JPEGs in YCbCr or grayscale.
Everything else (progressive or lossless JPEGs, CMYK/YCCK, PNG, WebP ...) is found from its
markers before decoding and decoded on the CPU, then sent over; a warning says how many. So is
an image above the pixel budget (stoker/pixels.py), which the CPU decode refuses as every decoder
does, before nvJPEG allocates for it. The crops are the CPU path's: the same draws give the same
boxes and flips; an exact crop (a translated Resize + CenterCrop: Pillow's filters) and a center
crop CenterCrop pads are made by the CPU path itself and sent over.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from stoker.data.dataset import ShardDataset
from stoker.decode.crops import BatchDraws, CropSpec, crop_box, pads
from stoker.decode.per_image import decode_into
from stoker.loader.batches import Batch, BatchMaker
from stoker.pixels import pixel_limit, too_many_pixels

log = logging.getLogger(__name__)

_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_GPU_SOF = {0xC0, 0xC1}  # baseline and extended sequential, Huffman coded


def gpu_decodable(data: bytes | memoryview | np.ndarray) -> bool:
    """Whether the GPU decoder takes ``data``: a baseline or extended sequential JPEG with 1 or 3
    components within the pixel budget (found from its start-of-frame marker; nothing is decoded)."""
    # No copy: only the header segments are walked, however long.
    data = memoryview(data).cast("B")  # type: ignore[arg-type]  # numpy's stubs: ndarray a buffer only on Python 3.12+
    if bytes(data[:2]) != b"\xff\xd8":
        return False
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF_MARKERS:
            components = data[at + 9] if at + 9 < len(data) else 0
            height, width = int.from_bytes(data[at + 5 : at + 7], "big"), int.from_bytes(data[at + 7 : at + 9], "big")
            return (marker in _GPU_SOF and components in (1, 3) and not _adobe_cmyk(bytes(data[:at]))
                    and not too_many_pixels(width, height, pixel_limit()))
        if marker == 0xDA:  # start of scan before any frame header
            return False
        at += 2 + length
    return False


def _adobe_cmyk(header: bytes) -> bool:
    """An Adobe APP14 segment saying the colours are transformed CMYK (YCCK)."""
    at = header.find(b"Adobe")
    return at >= 0 and at + 11 < len(header) and header[at + 11] == 2


@dataclass(frozen=True)
class GpuDecode:
    """The batch engine's decode strategy for ``decode="gpu"``: the threads read each sample's bytes
    into ``batch.held``; :meth:`images` decodes the batch and cuts its crops on ``device``. Its
    batches are made in the loop's process (the plan refuses worker processes with it)."""

    dataset: ShardDataset
    device: torch.device
    host = False

    def __post_init__(self) -> None:
        try:
            import torchvision.io  # noqa: F401
        except ImportError:
            raise ImportError("decode='gpu' decodes with torchvision's nvJPEG binding: pip install 'stoker[gpu]'") from None

    def place(self, maker: BatchMaker, batch: Batch, positions: np.ndarray, out: np.ndarray | None,
              slots: np.ndarray) -> None:
        """Read the bytes of the samples at ``positions`` (any thread)."""
        targets, encoded = batch.labels.numpy(), batch.held
        assert encoded is not None, "start() makes it for a decode that is not on the host"
        for j in positions:
            data, targets[j] = self.dataset.read_image(int(batch.indices[j]))
            encoded[j] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def images(self, maker: BatchMaker, batch: Batch) -> torch.Tensor:
        """Decode the batch on the GPU and crop every image into (B, H, W, 3) uint8 there."""
        indices = [int(i) for i in batch.indices]
        assert batch.held is not None and maker.crop is not None, "the plan gives decode='gpu' a crop"
        spec, error = maker.crop, lambda j, e: self.dataset.decode_error(indices[j], e)
        images = decode_on_gpu(batch.held, self.device, error, lambda j: self.dataset.key(indices[j]))
        out = torch.empty((len(images), *spec.size, 3), dtype=torch.uint8, device=self.device)
        crop_into_batch(images, spec, batch.draws, out)
        # An exact crop (Pillow's filters) and one CenterCrop pads are the CPU path's own: made there, sent over
        for j in [j for j, image in enumerate(images) if spec.exact or pads(spec, *image.shape[1:])]:
            pixels = np.empty((*spec.size, 3), np.uint8)
            try:
                decode_into(memoryview(batch.held[j].numpy()), spec, batch.draws.tries[j], bool(batch.draws.flips[j]), pixels)
            except Exception as e:  # decoders raise many types for bad data
                raise error(j, e) from None
            out[j] = torch.from_numpy(pixels).to(self.device)
        return out


def decode_on_gpu(encoded: list[torch.Tensor], device: torch.device, error: Callable[[int, Exception], Exception],
                  key: Callable[[int], str]) -> list[torch.Tensor]:
    """(3, H, W) uint8 images on ``device``: the GPU decodes what it can in one batched call; the
    rest, and any batch the GPU decoder refuses, image by image on the CPU (with a warning).
    ``error(j, e)`` is raised for image ``j`` that does not decode at all; ``key(j)`` names it."""
    from torchvision.io import ImageReadMode, decode_jpeg

    on_gpu = [j for j, data in enumerate(encoded) if gpu_decodable(data.numpy())]
    images: list[torch.Tensor | None] = [None] * len(encoded)
    if on_gpu:
        try:
            decoded = decode_jpeg([encoded[j] for j in on_gpu], mode=ImageReadMode.RGB, device=device)
            for j, image in zip(on_gpu, decoded, strict=True):
                images[j] = image
        except RuntimeError as e:  # one image the markers did not rule out: the batch fails as a whole
            log.warning("GPU decode of a batch failed (%s); decoding it on the CPU", e)
    on_cpu = [j for j, image in enumerate(images) if image is None]
    if on_cpu:
        log.warning("%d of %d images decoded on the CPU (progressive, CMYK or not JPEG), e.g. %s",
                    len(on_cpu), len(encoded), key(on_cpu[0]))
    for j in on_cpu:
        try:
            with Image.open(io.BytesIO(encoded[j].numpy().tobytes())) as image:
                pixels = torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
        except Exception as e:  # decoders raise many types for bad data
            raise error(j, e) from None
        images[j] = pixels.to(device, non_blocking=True)
    return images  # type: ignore[return-value]  # no None left: the loop above filled every one


def crop_into_batch(images: list[torch.Tensor], spec: CropSpec, draws: BatchDraws, out: torch.Tensor) -> None:
    """Cut each image's crop (the CPU path's boxes and flips), resize it (bilinear, antialiased)
    and write it into ``out[j]`` ((H, W, 3) uint8), on the images' device."""
    size = spec.size
    for j, image in enumerate(images):
        _, height, width = image.shape
        top, left, ch, cw = crop_box(spec, height, width, draws.tries[j])
        crop = image[:, top : top + ch, left : left + cw].unsqueeze(0).float()
        shrink = max(ch / size[0], cw / size[1])
        resized = F.interpolate(crop, size=size, mode="bilinear", align_corners=False, antialias=shrink > 1)
        if draws.flips[j]:
            resized = resized.flip(-1)
        out[j] = resized[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
