"""loader_for and stoker.pack take the map-style Datasets of torchvision and timm as they are: packed
once without their own transform, which the Loader then runs on every read. Runs where torchvision
(and timm) are installed (`make test` runs it in .venv-tv)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import stoker

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
import torchvision.transforms as T  # noqa: E402
from torchvision.datasets import FakeData  # noqa: E402

pytestmark = pytest.mark.torchvision


def test_loader_for_takes_fake_data_and_runs_its_transform(tmp_path):
    transform = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
    source = FakeData(size=10, image_size=(3, 40, 48), num_classes=3, transform=transform)
    loader = stoker.loader_for(source, batch_size=5, pack_dir=tmp_path / "pack", progress=False)
    assert source.transform is transform  # the Dataset given is left as it was
    images, labels = next(iter(loader))
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.float32 and images.max() <= 1.0
    bare = FakeData(size=10, image_size=(3, 40, 48), num_classes=3)
    dataset = loader.dataset
    assert [int(dataset.targets[i]) for i in range(10)] == [int(bare[int(dataset.key(i))][1]) for i in range(10)]
    assert dataset.classes == [str(i) for i in range(int(dataset.targets.max()) + 1)]


def test_loader_for_takes_timm_image_dataset(photos, tmp_path):
    timm_data = pytest.importorskip("timm.data")
    folder = tmp_path / "few"
    for c in sorted(photos.iterdir()):
        (folder / c.name).mkdir(parents=True)
        for p in sorted(c.iterdir())[:2]:
            (folder / c.name / p.name).write_bytes(p.read_bytes())
    source = timm_data.ImageDataset(str(folder), transform=T.Compose([T.CenterCrop(24), T.ToTensor()]))
    loader = stoker.loader_for(source, batch_size=4, pack_dir=tmp_path / "pack", progress=False)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 24, 24) and len(loader.dataset) == 8
    assert sorted(loader.dataset.targets.tolist()) == sorted(int(source[i][1]) for i in range(8))
    with pytest.raises(ValueError, match="two transforms given"):
        stoker.loader_for(source, T.ToTensor(), pack_dir=tmp_path / "pack", progress=False)
    assert Path(loader.dataset.shards.root) == tmp_path / "pack"
    # the files' bytes packed as they are (not decoded and encoded again), with timm's class names
    originals = {p.read_bytes() for p in folder.rglob("*.jpg")}
    assert {loader.dataset.read_sample(i)["jpg"] for i in range(8)} == originals
    assert loader.dataset.classes == sorted(c.name for c in folder.iterdir())


def test_an_image_folder_subclass_is_packed_from_its_files(photos, tmp_path):
    from torchvision.datasets import ImageFolder

    class Kept(ImageFolder):
        """A user's ImageFolder that keeps only the first two files of each class."""

        def find_classes(self, directory):
            return super().find_classes(directory)

    source = Kept(str(photos), is_valid_file=lambda path: Path(path).stem.endswith(("0", "1")))
    loader = stoker.loader_for(source, batch_size=4, pack_dir=tmp_path / "pack", progress=False)
    dataset = loader.dataset
    assert len(dataset) == len(source) and dataset.classes == source.classes
    assert {dataset.read_sample(i)["jpg"] for i in range(len(dataset))} == {Path(p).read_bytes() for p, _ in source.samples}
    assert sorted(dataset.targets.tolist()) == sorted(label for _, label in source.samples)


def test_a_dataset_whose_items_are_not_its_files_is_packed_from_its_items(photos, tmp_path):
    """A transform, a target_transform or a __getitem__ of its own makes the items differ from the
    listed files: those are packed (what the Dataset gives), not the files."""
    from torchvision.datasets import ImageFolder

    class HalfLabels(ImageFolder):
        def __getitem__(self, index):
            image, label = super().__getitem__(index)
            return image, label // 2

    relabelled = ImageFolder(str(photos), target_transform=lambda label: 10 + label)
    for source, labels in ((HalfLabels(str(photos)), {label // 2 for _, label in ImageFolder(str(photos)).samples}),
                           (relabelled, {10 + label for _, label in relabelled.samples})):
        dst = tmp_path / type(source).__name__
        stoker.pack(source, dst, progress=False)
        dataset = stoker.ShardDataset(dst)
        assert set(dataset.targets.tolist()) == labels
    small = ImageFolder(str(photos), transform=T.Resize(24))
    stoker.pack(small, tmp_path / "small", progress=False)
    image, _ = stoker.ShardDataset(tmp_path / "small")[0]
    assert min(image.size) == 24
