"""Loader(decode="gpu"): which images go to the GPU decoder, the crops it cuts, clear errors
without a GPU; the decode itself where CUDA and torchvision are present."""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker.decode.crops import BatchDraws, draw_batch
from stoker.loader import CropSpec
from stoker.loader.gpu_decode import crop_into_batch, gpu_decodable

HAS_GPU_DECODE = torch.cuda.is_available() and importlib.util.find_spec("torchvision") is not None


def encoded(mode: str = "RGB", fmt: str = "JPEG", **options) -> bytes:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def test_only_baseline_jpegs_in_ycbcr_or_gray_go_to_the_gpu():
    assert gpu_decodable(encoded())
    assert gpu_decodable(encoded("L"))
    assert gpu_decodable(encoded(quality=95, subsampling=0))  # 4:4:4
    assert not gpu_decodable(encoded(progressive=True))
    assert not gpu_decodable(encoded("CMYK"))
    assert not gpu_decodable(encoded(fmt="PNG"))
    assert not gpu_decodable(encoded()[:20])  # cut before the frame header
    assert not gpu_decodable(b"")


def test_crops_match_the_cpu_paths_boxes_and_flips():
    images = [torch.randint(0, 256, (3, 30, 40), dtype=torch.uint8) for _ in range(6)]
    spec = CropSpec("resize", size=(30, 40), flip=True)
    draws = draw_batch(0, 0, 0, 6, spec)
    out = torch.empty((6, 30, 40, 3), dtype=torch.uint8)
    crop_into_batch(images, spec, draws, out)
    for image, flip, got in zip(images, draws.flips, out, strict=True):
        expected = image.flip(-1) if flip else image
        assert torch.equal(got.permute(2, 0, 1), expected)  # whole image at its own size: untouched
    assert 0 < draws.flips.sum() < 6
    box = CropSpec("center", size=(10, 10), center_fraction=0.5)
    crop_into_batch(images[:1], box, BatchDraws(draws.tries[:1], np.zeros(1, bool)), out[:1, :10, :10])
    assert out[0, :10, :10].float().std() > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_without_a_gpu_decode_gpu_says_so(packed):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        stoker.Loader(stoker.ShardDataset(packed), batch_size=8, decode="gpu")


def test_decode_gpu_refuses_what_it_cannot_do(packed):
    with pytest.raises(ValueError, match="no per-sample transform"):
        stoker.Loader(stoker.ShardDataset(packed), batch_size=8, decode="gpu", transform=lambda x: x)
    with pytest.raises(ValueError, match=r"decode='tpu': must be one of 'cpu' or 'gpu'"):
        stoker.Loader(stoker.ShardDataset(packed), batch_size=8, decode="tpu")


@pytest.mark.skipif(not HAS_GPU_DECODE, reason="needs CUDA and torchvision")
def test_gpu_batches_match_cpu_batches(packed):
    dataset = stoker.ShardDataset(packed)
    crop = CropSpec(size=(64, 64))
    cpu = next(iter(stoker.Loader(dataset, batch_size=16, crop=crop, order="sequential")))
    gpu = next(iter(stoker.Loader(dataset, batch_size=16, crop=crop, order="sequential", decode="gpu")))
    assert gpu[0].device.type == "cuda" and gpu[0].shape == cpu[0].shape and gpu[0].dtype == torch.uint8
    assert torch.equal(gpu[1].cpu(), cpu[1])
    # the same boxes and flips; decoders and resampling differ by a few levels
    assert (gpu[0].cpu().float() - cpu[0].float()).abs().mean() < 8


@pytest.mark.torchvision
def test_the_gpu_decode_strategy_gives_the_cpu_path_s_batches_on_any_device(packed):
    """GpuDecode in the batch engine with the CPU as its device (torchvision's decode_jpeg runs there
    too, so this runs without a GPU): the threads read bytes, finish decodes and crops them with the
    CPU path's boxes and flips, the labels the same."""
    pytest.importorskip("torchvision.io")
    from stoker.data.epoch import RankBatches
    from stoker.loader.batches import BatchMaker, PerImage
    from stoker.loader.gpu_decode import GpuDecode
    from stoker.loader.images import Images

    dataset, crop = stoker.ShardDataset(packed), CropSpec(size=(48, 48))
    batches, indices = RankBatches(0, len(dataset), 1, 0, 16), np.arange(3, 19)
    on_cpu = BatchMaker(Images(dataset), PerImage(), crop, 3, batches)
    on_device = BatchMaker(Images(dataset), GpuDecode(dataset, torch.device("cpu")), crop, 3, batches)
    cpu, cpu_labels = on_cpu.finish(on_cpu.make(0, 0, indices, threads=2))
    device, device_labels = on_device.finish(on_device.make(0, 0, indices, threads=2))
    assert device.shape == cpu.shape == (16, 48, 48, 3) and device.dtype == torch.uint8
    assert torch.equal(device_labels, cpu_labels)
    assert (device.float() - cpu.float()).abs().mean() < 8  # the same boxes and flips; decoders differ a little


@pytest.mark.torchvision
@pytest.mark.parametrize("crop", [CropSpec("center", size=(48, 96), flip=False),
                                  CropSpec("center", size=(40, 40), exact=True, interpolation="bicubic", flip=False)])
def test_an_exact_or_padded_center_crop_is_the_cpu_paths_own(packed, crop):
    """A crop CenterCrop pads (wider than the resized image) and an exact crop (Pillow's filters) come
    out as the CPU path makes them, zeros included, not stretched or resampled bilinearly."""
    pytest.importorskip("torchvision.io")
    from stoker.data.epoch import RankBatches
    from stoker.loader.batches import BatchMaker, PerImage
    from stoker.loader.gpu_decode import GpuDecode
    from stoker.loader.images import Images

    dataset = stoker.ShardDataset(packed)
    batches, indices = RankBatches(0, len(dataset), 1, 0, 8), np.arange(8)
    on_cpu = BatchMaker(Images(dataset), PerImage(), crop, 3, batches)
    on_device = BatchMaker(Images(dataset), GpuDecode(dataset, torch.device("cpu")), crop, 3, batches)
    cpu, _ = on_cpu.finish(on_cpu.make(0, 0, indices))
    device, _ = on_device.finish(on_device.make(0, 0, indices))
    assert torch.equal(device, cpu)
