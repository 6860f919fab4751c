"""Loader(transform=<torchvision pipeline>) where the pipeline does not start with a crop stoker
can fuse: each image is decoded whole and the pipeline runs on it as given, on the threads or in
worker processes, and the batches are what a DataLoader over ImageFolder gives. Runs in .venv-tv."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageOps
from torch.utils.data import DataLoader

import stoker
from stoker.errors import TransformError

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

pytestmark = pytest.mark.torchvision


def mirrored(image: Image.Image) -> Image.Image:
    """A user's own transform (module level: worker processes pickle it)."""
    return ImageOps.mirror(image)


# Deterministic pipelines that start with something other than a fusable crop.
PIPELINES = {
    "fixed rotation first": T.Compose([T.RandomRotation((10, 10)), T.Resize(80), T.CenterCrop(64), T.ToTensor()]),
    "v2 fixed rotation first": V.Compose([V.RandomRotation((-7, -7)), V.Resize(80), V.CenterCrop(64), V.ToImage(),
                                          V.ToDtype(torch.float32, scale=True)]),
    "own callable first": T.Compose([mirrored, T.Resize((48, 64)), T.PILToTensor()]),
    "grayscale first": T.Compose([T.Grayscale(3), T.Resize(72), T.CenterCrop(56), T.ToTensor(),
                                  T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]),
    "pad first": T.Compose([T.Pad(6, fill=(255, 0, 0)), T.Resize((40, 40)), T.PILToTensor()]),
    "one channel": T.Compose([T.Grayscale(1), T.Resize((32, 48)), T.ToTensor()]),
}


def dataloader_by_key(photos: Path, dataset: stoker.ShardDataset, pipeline) -> list[torch.Tensor]:
    """What a DataLoader over ImageFolder with ``pipeline`` gives for each sample of ``dataset``, in its order."""
    folder = ImageFolder(photos, transform=pipeline)
    made = [image for image, _ in DataLoader(folder, batch_size=None, num_workers=2)]
    position = {Path(p).relative_to(photos).with_suffix("").as_posix(): i for i, (p, _) in enumerate(folder.samples)}
    return [made[position[dataset.key(i)]] for i in range(len(dataset))]


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
@pytest.mark.parametrize("name", list(PIPELINES))
def test_a_pipeline_without_a_leading_crop_gives_the_dataloaders_batches(photos, packed, name, processes):
    dataset, pipeline = stoker.ShardDataset(packed), PIPELINES[name]
    loader = stoker.Loader(dataset, 40, transform=pipeline, order="sequential", threads=3, processes=processes)
    assert "decoded whole" in loader.explain() and "fused into the decode: nothing" in loader.explain()
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [40, 40, 16]  # the last, short batch too
    reference = torch.stack(dataloader_by_key(photos, dataset, pipeline))
    assert torch.equal(torch.cat([images for images, _ in batches]), reference)
    folder = ImageFolder(photos)
    labels = [folder.class_to_idx[dataset.key(i).split("/")[0]] for i in range(len(dataset))]
    assert torch.cat([labels for _, labels in batches]).tolist() == labels
    again = torch.cat([images for images, _ in loader])  # a second epoch: the ring's buffers reused
    assert torch.equal(again, reference)


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
def test_the_reported_pipeline_runs_through_loader_and_loader_for(photos, tmp_path, processes):
    pipeline = T.Compose([T.RandomRotation(10), T.Resize(80), T.CenterCrop(64), T.ToTensor()])
    for loader in (stoker.Loader(stoker.ShardDataset(stoker.loader_for(photos, pack_dir=tmp_path / "p", progress=False)
                                                     .dataset.shards.root), 16, transform=pipeline, processes=processes),
                   stoker.loader_for(ImageFolder(photos, transform=pipeline), batch_size=16, pack_dir=tmp_path / "p",
                                     progress=False, processes=processes)):
        batches = list(loader)
        assert len(batches) == 6 and all(images.shape == (16, 3, 64, 64) for images, _ in batches)
        assert all(images.dtype == torch.float32 and 0 <= images.min() and images.max() <= 1 for images, _ in batches)


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
def test_a_random_crop_after_a_resize_is_a_window_of_the_resized_image(photos, packed, processes):
    dataset = stoker.ShardDataset(packed)
    pipeline = T.Compose([T.Resize(80), T.RandomCrop(64), T.PILToTensor()])
    loader = stoker.Loader(dataset, 32, transform=pipeline, order="sequential", processes=processes, seed=4)
    assert loader.crop is None  # Resize(short side) then RandomCrop: not fused, the pipeline runs whole
    crops = torch.cat([images for images, _ in loader])
    resized = dataloader_by_key(photos, dataset, T.Compose([T.Resize(80), T.PILToTensor()]))
    offsets = set()
    for crop, whole in zip(crops, resized, strict=True):
        windows = whole.unfold(1, 64, 1).unfold(2, 64, 1)  # (3, rows, cols, 64, 64)
        found = (windows == crop[:, None, None]).flatten(3).all(dim=3).all(dim=0).nonzero()
        assert len(found), "a crop that is no window of the resized image"
        offsets.add(tuple(found[0].tolist()))
    assert len(offsets) > 20  # drawn per sample, not one window for all


def test_processes_draw_the_same_random_whole_image_batches_whatever_their_number(packed):
    pipeline = T.Compose([T.RandomRotation(20), T.Resize((40, 40)), T.ToTensor(), T.RandomErasing(p=0.5)])
    one = [b for b, _ in stoker.Loader(stoker.ShardDataset(packed), 16, transform=pipeline, processes=1, seed=5)]
    two = [b for b, _ in stoker.Loader(stoker.ShardDataset(packed), 16, transform=pipeline, processes=2, seed=5)]
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
def test_whole_images_left_of_different_sizes_are_refused_as_a_dataloader_would(packed, processes):
    pipeline = T.Compose([T.RandomRotation(5, expand=True), T.ToTensor()])  # each image keeps its own size
    with pytest.raises(TransformError, match="cannot be stacked"):  # from a worker process too
        next(iter(stoker.Loader(stoker.ShardDataset(packed), 8, transform=pipeline, order="sequential",
                                processes=processes)))
