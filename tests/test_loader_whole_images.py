"""Batches of whole images (no crop: a pipeline that does not start with a crop stoker can fuse):
each image decoded whole, as ImageFolder's loader gives it, and the per-sample transform makes
them one size. Without torchvision: the batch maker and the ring as the thread Loader uses them,
with plain callables (tests/test_torchvision_whole_images.py runs real pipelines through the Loader)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker.data.epoch import RankBatches
from stoker.loader.batches import BatchMaker, PerImage
from stoker.loader.buffers import BatchRing, mapped_pixels
from stoker.loader.images import Images
from stoker.transforms.torchvision_plan import PerSample


def to_small_tensor(image: Image.Image) -> torch.Tensor:
    """A user's own per-sample transform: any PIL image -> (3, 24, 32) uint8."""
    return torch.from_numpy(np.array(image.resize((32, 24), Image.BILINEAR))).permute(2, 0, 1).contiguous()


def whole_images(dataset: stoker.ShardDataset) -> BatchMaker:
    """The batch engine as the Loader makes it for whole images and a per-sample transform."""
    return BatchMaker(Images(dataset), PerImage(), None, seed=0, batches=RankBatches(0, 12, 1, 0, 4),
                      transform=PerSample((to_small_tensor,), "pil"))


def make_whole(maker: BatchMaker, ring: BatchRing, number: int, indices: np.ndarray, threads: int):
    """One batch as the thread Loader makes it: a buffer from the ring, the samples split across threads."""
    batch = maker.start(0, number, indices, pixels=ring.take())
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda chunk: maker.fill(batch, chunk), np.array_split(np.arange(len(indices)), threads)))
    return maker.finish(batch)


def expected(root: Path, dataset: stoker.ShardDataset, indices: np.ndarray) -> torch.Tensor:
    """What ImageFolder's loader (an RGB PIL image of the file) and the transform give."""
    files = {p.relative_to(root).with_suffix("").as_posix(): p for p in root.rglob("*") if p.is_file()}
    return torch.stack([to_small_tensor(Image.open(files[dataset.key(int(i))]).convert("RGB")) for i in indices])


@pytest.mark.parametrize("shape", [(8, 0), (3, 0), (0,), (0, 5, 3)])
def test_a_shape_of_no_bytes_gets_an_empty_tensor_from_the_ring_and_fresh_memory(shape):
    assert mapped_pixels(shape).shape == shape
    ring = BatchRing(shape, slots=2)
    held = [ring.take() for _ in range(5)]  # nothing to hold: never runs out
    assert all(t is not None and t.shape == shape and t.dtype == torch.uint8 for t in held)


@pytest.mark.parametrize("threads", [1, 3])
def test_whole_images_in_threads_are_what_imagefolder_and_the_transform_give(photos, packed, threads):
    dataset = stoker.ShardDataset(packed)
    maker = whole_images(dataset)
    assert maker.sample_shape() == (0,)
    ring = BatchRing((40, *maker.buffer_shape()), slots=3)
    order = np.random.default_rng(3).permutation(len(dataset))
    for number, start in enumerate(range(0, len(dataset), 40)):  # 40, 40, then a last batch of 16
        indices = order[start : start + 40]
        images, labels = make_whole(maker, ring, number, indices, threads)
        assert images.shape == (len(indices), 3, 24, 32) and images.dtype == torch.uint8
        assert torch.equal(images, expected(photos, dataset, indices))
        assert labels.tolist() == [dataset.classes.index(dataset.key(int(i)).split("/")[0]) for i in indices]


def test_whole_images_of_every_mode_are_rgb_as_imagefolder_gives_them(odd_images, tmp_path):
    stoker.pack(odd_images, tmp_path / "ds", progress=False)
    dataset = stoker.ShardDataset(tmp_path / "ds")
    maker = whole_images(dataset)
    indices = np.arange(len(dataset))
    images, _ = make_whole(maker, BatchRing((len(dataset), *maker.buffer_shape()), 2), 0, indices, 2)
    assert torch.equal(images, expected(odd_images, dataset, indices))


def test_a_worker_process_makes_the_same_whole_image_batch(packed, photos):
    dataset = stoker.ShardDataset(packed)
    maker = whole_images(dataset)
    indices = np.arange(5, 25)
    batch = maker.make(0, 0, indices)
    images, _ = maker.finish(batch)
    assert not batch.replaced.any() and torch.equal(images, expected(photos, dataset, indices))
