"""Loader(transform=<timm's transform>): timm's classes recognised as the torchvision ops they are
(checked here pixel for pixel against torchvision), its training transform fused as the same
pipeline spelled in torchvision is, its eval transform (bicubic Resize + CenterCrop) the very pixels
of timm's own dataset path. Runs where timm is installed (`make test` runs it in .venv-tv)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
import stoker.augment as A
from stoker.decode.crops import CropSpec
from stoker.loader import native_chunk
from stoker.transforms.torchvision_plan import plan_transform

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
timm_data = pytest.importorskip("timm.data", reason="needs timm (make test runs these tests in .venv-tv)")
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.functional as F  # noqa: E402
from timm.data import transforms as timm_transforms  # noqa: E402

pytestmark = pytest.mark.torchvision
MEAN, STD = timm_data.IMAGENET_DEFAULT_MEAN, timm_data.IMAGENET_DEFAULT_STD


def photo(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_timms_classes_are_the_torchvision_ops_they_are_taken_for():
    """What kinds.py assumes of each timm class, checked on pixels."""
    image, tall = photo(75, 100, 0), photo(120, 50, 1)
    for timm_op, torchvision_op in ((timm_transforms.MaybeToTensor(), T.ToTensor()),
                                    (timm_transforms.MaybePILToTensor(), T.PILToTensor()),
                                    (timm_transforms.ToTensor(torch.uint8), T.PILToTensor()),
                                    (timm_transforms.CenterCropOrPad((64, 80)), T.CenterCrop((64, 80)))):
        for pil in (image, tall):  # the tall one is padded by both crops
            ours, theirs = timm_op(pil), torchvision_op(pil)
            assert np.array_equal(np.asarray(ours), np.asarray(theirs)), type(timm_op).__name__
    assert np.array_equal(timm_transforms.ToNumpy()(image), T.PILToTensor()(image).numpy())
    # RandomResizedCropAndInterpolation: torchvision's resized_crop on the box it draws, for each interpolation ...
    for interpolation in ("bilinear", "bicubic"):
        crop = timm_transforms.RandomResizedCropAndInterpolation(48, interpolation=interpolation)
        for seed in range(5):
            random.seed(seed)
            box = crop.get_params(image, crop.scale, crop.ratio)
            random.seed(seed)
            expected = F.resized_crop(image, *box, [48, 48], T.InterpolationMode(interpolation), antialias=True)
            assert np.array_equal(np.asarray(crop(image)), np.asarray(expected))
    # ... and torchvision's box rule: the same area and aspect distributions over many draws
    crop = timm_transforms.RandomResizedCropAndInterpolation(48)
    random.seed(0)
    torch.manual_seed(0)
    timm_boxes = np.array([crop.get_params(image, crop.scale, crop.ratio) for _ in range(4000)])
    tv_boxes = np.array([T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    quantiles = np.linspace(0.05, 0.95, 10)
    for boxes in (timm_boxes, tv_boxes):
        assert boxes[:, 2].max() <= 75 and boxes[:, 3].max() <= 100
    for measure in (lambda b: b[:, 2] * b[:, 3] / 7500, lambda b: b[:, 3] / b[:, 2]):
        assert np.allclose(np.quantile(measure(timm_boxes), quantiles), np.quantile(measure(tv_boxes), quantiles),
                           atol=0.04)


def test_the_training_transform_is_fused_and_explain_says_how():
    """create_transform(224, is_training=True), and what timm's train.py builds by default
    (interpolation 'random', the prefetcher's uint8 output): crop, flip and jitter fused, nothing per sample."""
    jitter, normalize = A.ColorJitter((0.6, 1.4), (0.6, 1.4), (0.6, 1.4)), A.Normalize(MEAN, STD)
    for options, ops, dtype in ((dict(), (jitter, normalize), torch.float32),
                                (dict(interpolation="random", use_prefetcher=True), (jitter,), torch.uint8)):
        plan = plan_transform(timm_data.create_transform(224, is_training=True, **options), None)
        assert plan.crop == CropSpec("random_resized", (224, 224), flip=True)
        assert plan.dtype == dtype and plan.per_sample == () and plan.ops[0] == jitter
        assert len(plan.ops) == len(ops) and all(np.allclose(plan.ops[-1].mean, normalize.mean, atol=1e-6)
                                                 for _ in ops[1:])
        text = plan.explain("CPU")
        assert "timm's RandomResizedCropAndInterpolation: torchvision's box rule" in text
        assert ("timm's MaybeToTensor: ToTensor on PIL images" if dtype == torch.float32
                else "timm's MaybePILToTensor: PILToTensor on PIL images") in text
        assert "per sample, as given: nothing" in text
    text = plan.explain("CPU")
    assert "bilinear or bicubic drawn per image (timm's 'random') is approximated by bilinear for every image" in text


def test_the_training_transform_gives_the_batches_of_the_same_pipeline_in_torchvision(packed):
    timm_train = timm_data.create_transform(64, is_training=True)
    torchvision_train = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                                   T.ToTensor(), T.Normalize(torch.tensor(MEAN), torch.tensor(STD))])  # as timm
    dataset = stoker.ShardDataset(packed)
    ours = [images.clone() for images, _ in stoker.Loader(dataset, 32, transform=timm_train, seed=3)]
    theirs = [images.clone() for images, _ in stoker.Loader(dataset, 32, transform=torchvision_train, seed=3)]
    assert [x.shape for x in ours] == [(32, 3, 64, 64)] * 3
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def _timm_dataset_pixels(photos: Path, dataset: stoker.ShardDataset, transform) -> torch.Tensor:
    """What timm's own dataset (ImageDataset over the folder, as train.py's create_dataset makes it)
    gives for each sample of ``dataset``, in its order."""
    folder = timm_data.create_dataset("", root=str(photos), transform=transform)
    names = [Path(name).with_suffix("").as_posix() for name in folder.filenames()]
    index = {name: i for i, name in enumerate(names)}
    return torch.stack([folder[index[dataset.key(i)]][0] for i in range(len(dataset))])


@pytest.mark.parametrize("native", [True, False], ids=["native", "per-image"])
def test_the_eval_transform_with_bicubic_resize_is_timms_pixels(photos, packed, monkeypatch, native):
    """create_transform(..., is_training=False) with a model's bicubic interpolation and crop_pct 0.9
    (Resize(248, bicubic), CenterCrop(224)), uint8 as timm's prefetcher takes it: the same bytes as
    timm's dataset gives, on the native path and on the per-image one."""
    if not native:
        monkeypatch.setattr(native_chunk, "decode_chunk", None)
    dataset = stoker.ShardDataset(packed)
    transform = timm_data.create_transform(224, interpolation="bicubic", crop_pct=0.9, use_prefetcher=True)
    loader = stoker.Loader(dataset, 32, transform=transform, order="sequential")
    assert loader.crop == CropSpec("center", (224, 224), center_fraction=224 / 248, flip=False, exact=True,
                                   interpolation="bicubic")
    assert "resized with Pillow's antialiased bicubic filter" in loader.explain()
    ours = torch.cat([images for images, _ in loader])
    assert torch.equal(ours, _timm_dataset_pixels(photos, dataset, transform))


def test_a_to_numpy_pipeline_gives_the_batch_a_dataloader_collates(packed):
    """timm's ToNumpy (what older timm's prefetcher pipelines end with): fused at the end, run as
    given (its arrays made tensors, as the DataLoader's collate does) anywhere else."""
    dataset = stoker.ShardDataset(packed)
    end = T.Compose([T.Resize(40), T.CenterCrop(32), timm_transforms.ToNumpy()])
    middle = T.Compose([T.Resize(40), T.CenterCrop(32), timm_transforms.ToNumpy(), torch.from_numpy])
    assert plan_transform(end, None).per_sample == () and len(plan_transform(middle, None).per_sample) == 2
    fused, _ = next(iter(stoker.Loader(dataset, 8, transform=end, order="sequential")))
    as_given, _ = next(iter(stoker.Loader(dataset, 8, transform=middle, order="sequential")))
    assert fused.dtype == torch.uint8 and fused.shape == (8, 3, 32, 32) and torch.equal(fused, as_given)

