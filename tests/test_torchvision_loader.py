"""Loader(transform=<torchvision pipeline>) against torchvision itself (v1 and v2): what is fused,
what runs per sample, and that the batches are what ImageFolder + DataLoader give. Runs where
torchvision is installed (`make test` runs it in .venv-tv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
import stoker.augment as A
from stoker.decode.crops import CropSpec, crop_box
from stoker.loader import native_chunk
from stoker.transforms.torchvision_plan import plan_transform

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
import torchvision.transforms.v2.functional as VF  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

pytestmark = pytest.mark.torchvision
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def train(tv, size=224):
    """The standard ImageNet training pipeline, as the references write it in v1 and v2."""
    if tv is T:
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                          T.ToTensor(), T.Normalize(MEAN, STD)])
    return V.Compose([V.RandomResizedCrop(size), V.RandomHorizontalFlip(), V.ColorJitter(0.4, 0.4, 0.4), V.ToImage(),
                      V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD)])


def val(tv, resize=256, size=224, interpolation="bilinear"):
    mode = T.InterpolationMode(interpolation)
    if tv is T:
        return T.Compose([T.Resize(resize, mode), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    return V.Compose([V.Resize(resize, mode), V.CenterCrop(size), V.ToImage(), V.ToDtype(torch.float32, scale=True),
                      V.Normalize(MEAN, STD)])


def by_key(photos, dataset, transform):
    """What ImageFolder with ``transform`` gives for each sample of ``dataset``, in its order."""
    folder = ImageFolder(photos, transform=transform)
    index = {Path(p).relative_to(photos).with_suffix("").as_posix(): i for i, (p, _) in enumerate(folder.samples)}
    return torch.stack([folder[index[dataset.key(i)]][0] for i in range(len(dataset))])


@pytest.mark.parametrize("tv", [T, V], ids=["v1", "v2"])
def test_each_recognised_op_is_translated_with_its_parameters(tv):
    plan = plan_transform(tv.Compose([
        tv.RandomHorizontalFlip(0.3), tv.RandomResizedCrop((96, 128), scale=(0.2, 0.9), ratio=(0.5, 2.0)),
        tv.ColorJitter(0.4, (0.7, 1.2), 0.3, 0.1), tv.RandomGrayscale(0.2), tv.RandomVerticalFlip(0.4),
        tv.GaussianBlur(5, (0.5, 1.5)),
    ]), None)
    assert plan.crop == CropSpec("random_resized", (96, 128), (0.2, 0.9), (0.5, 2.0), flip=0.3)
    assert plan.ops == (A.ColorJitter((0.6, 1.4), (0.7, 1.2), (0.7, 1.3), (-0.1, 0.1)), A.Grayscale(0.2))
    # a geometric op after a photometric one is not fused: from there on all runs per sample
    assert [type(t).__name__ for t in plan.per_sample] == ["RandomVerticalFlip", "GaussianBlur"]
    plan = plan_transform(tv.Compose([
        tv.RandomResizedCrop(64), tv.RandomHorizontalFlip(), tv.RandomRotation((-20, 30), fill=(255, 0, 0)),
        tv.RandomAffine(10, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(-5, 5, -3, 3), center=(10, 20)),
        tv.RandomVerticalFlip(0.4), tv.ColorJitter(0.4, (0.7, 1.2), 0.3, 0.1), tv.RandomGrayscale(0.2),
        tv.GaussianBlur(5, (0.5, 1.5)), tv.RandomApply([tv.ColorJitter(0.2)], p=0.8), tv.PILToTensor(),
        tv.ConvertImageDtype(torch.float32) if tv is T else tv.ToDtype(torch.float32, scale=True), tv.Normalize(MEAN, STD),
    ]), None)
    assert plan.crop == CropSpec("random_resized", (64, 64), flip=True)
    assert plan.ops == (
        A.Affine(degrees=(-20.0, 30.0), interpolation="nearest", fill=(1.0, 0.0, 0.0)),
        A.Affine(degrees=(-10.0, 10.0), translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(-5.0, 5.0, -3.0, 3.0),
                 center=(10.0, 20.0), interpolation="nearest"),
        A.VerticalFlip(0.4), A.ColorJitter((0.6, 1.4), (0.7, 1.2), (0.7, 1.3), (-0.1, 0.1)), A.Grayscale(0.2),
        A.GaussianBlur(5, (0.5, 1.5), p=1.0), A.ColorJitter((0.8, 1.2), p=0.8), A.Normalize(MEAN, STD))
    assert plan.per_sample == () and plan.dtype == torch.float32 and plan.stage == "float"
    assert [s.where for s in plan.steps][:2] == ["decode", "decode"]
    assert all(s.where == "batch" for s in plan.steps[2:])
    center = plan_transform(tv.Compose([tv.Resize(160), tv.CenterCrop((128, 144)), tv.PILToTensor()]), None)
    assert center.crop == CropSpec("center", (128, 144), center_fraction=128 / 160, flip=False, exact=True)
    assert center.dtype == torch.uint8 and center.ops == ()
    # wider than the short side: padded where the resized image is narrower; the Resize's filter kept
    padded = plan_transform(tv.Compose([tv.Resize(160, T.InterpolationMode.BICUBIC), tv.CenterCrop((128, 200)),
                                        tv.PILToTensor()]), None)
    assert padded.crop == CropSpec("center", (128, 200), center_fraction=128 / 160, flip=False, exact=True,
                                   interpolation="bicubic")
    assert "padded with zeros" in padded.steps[1].why and "antialiased bicubic filter" in padded.steps[0].why
    stretch = plan_transform(tv.Compose([tv.Resize((100, 120)), tv.ToTensor()]), None)
    assert stretch.crop == CropSpec("resize", (100, 120), flip=False, exact=True) and stretch.dtype == torch.float32


@pytest.mark.parametrize("tv", [T, V], ids=["v1", "v2"])
def test_what_cannot_be_fused_runs_per_sample_or_is_refused_with_the_reason(tv):
    rest = plan_transform(tv.Compose([tv.RandomResizedCrop(32), tv.ColorJitter(0.2), tv.TrivialAugmentWide(),
                                      tv.PILToTensor()]), None)
    assert rest.ops == (A.ColorJitter((0.8, 1.2)),) and rest.given == "pil"
    assert [type(t).__name__ for t in rest.per_sample] == ["TrivialAugmentWide", "PILToTensor"]
    assert "no batched counterpart" in rest.steps[2].why
    whole = plan_transform(tv.Compose([tv.Resize(64), tv.ToTensor()]), None)  # images keep their aspect
    assert whole.crop is None and len(whole.per_sample) == 2
    with pytest.raises(ValueError, match="crop is given twice"):
        plan_transform(tv.Compose([tv.RandomResizedCrop(32), tv.ToTensor()]), CropSpec())
    with pytest.raises(ValueError, match="ends with PIL images"):
        plan_transform(tv.Compose([tv.RandomResizedCrop(32), tv.RandomHorizontalFlip()]), None)
    # a CropSpec of the Loader's own and a pipeline without geometry: the rest is fused as usual
    own = plan_transform(tv.Compose([tv.ToTensor(), tv.Normalize(MEAN, STD)]), CropSpec(size=(48, 48)))
    assert own.crop == CropSpec(size=(48, 48)) and own.ops == (A.Normalize(MEAN, STD),)


@pytest.mark.parametrize("tv", [T, V], ids=["v1", "v2"])
def test_batches_have_the_dataloaders_dtype_range_and_shape(photos, packed, tv):
    dataset = stoker.ShardDataset(packed)
    # normalized alike: the same mean and spread per channel over the epoch; the training pipeline's
    # random crops of 96 photos move them by up to ~0.2 from run to run (a missing Normalize: ~0.6)
    for pipeline, atol in ((train(tv, 64), 0.35), (val(tv, 72, 64), 0.01)):
        ours = list(stoker.Loader(dataset, 32, transform=pipeline, threads=2))
        theirs = list(DataLoader(ImageFolder(photos, transform=pipeline), 32, shuffle=True, num_workers=2))
        assert [(x.dtype, x.shape, y.dtype) for x, y in ours] == [(x.dtype, x.shape, y.dtype) for x, y in theirs]
        assert ours[0][0].shape == (32, 3, 64, 64) and ours[0][0].dtype == torch.float32
        ours, theirs = torch.cat([x for x, _ in ours]), torch.cat([x for x, _ in theirs])
        assert torch.allclose(ours.mean(dim=(0, 2, 3)), theirs.mean(dim=(0, 2, 3)), atol=atol)
        assert torch.allclose(ours.std(dim=(0, 2, 3)), theirs.std(dim=(0, 2, 3)), atol=atol)
    uint8, _ = next(iter(stoker.Loader(dataset, 8, transform=tv.Compose([tv.RandomResizedCrop(40), tv.PILToTensor()]))))
    assert uint8.dtype == torch.uint8 and uint8.shape == (8, 3, 40, 40)


@pytest.mark.parametrize("tv, interpolation", [(T, "bilinear"), (V, "bilinear"), (T, "bicubic")],
                         ids=["v1", "v2", "v1-bicubic"])
def test_the_validation_pipeline_is_pixel_close_to_torchvisions(photos, packed, tv, interpolation):
    """The tolerance docs/user-guide.md states, for Resize(256) + CenterCrop(224) + ToTensor +
    Normalize, bilinear or bicubic: the same uint8 pixels; only Normalize's float rounding differs
    here: under 0.01 of a level."""
    dataset = stoker.ShardDataset(packed)
    pipeline = val(tv, interpolation=interpolation)
    ours = torch.cat([images for images, _ in stoker.Loader(dataset, 32, transform=pipeline, order="sequential")])
    difference = ((ours - by_key(photos, dataset, pipeline)) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert float(difference.max()) < 0.01


@pytest.mark.parametrize("native", [True, False], ids=["native", "per-image"])
def test_a_center_crop_larger_than_the_resized_image_is_padded_as_centercrop_pads(photos, packed, monkeypatch, native):
    """CropSpec("center", (224, 320)) over photos whose resized width is 256 (portraits) or 341: exact,
    every image is ImageFolder + Resize(256) + CenterCrop((224, 320))'s, zero columns included, and
    none is taken for damaged; not exact, the padded ones are so too (the others are the fast path's)."""
    if not native:
        monkeypatch.setattr(native_chunk, "decode_chunk", None)
    dataset = stoker.ShardDataset(packed, on_error="raise")
    reference = by_key(photos, dataset, T.Compose([T.Resize(256), T.CenterCrop((224, 320)), T.PILToTensor()]))
    padded = (reference[:, :, :, :8] == 0).flatten(1).all(dim=1)
    assert 10 < int(padded.sum()) < len(dataset)  # the fixture has both
    for exact in (True, False):
        spec = CropSpec("center", (224, 320), flip=False, exact=exact)
        ours = torch.cat([images for images, _ in stoker.Loader(dataset, 32, crop=spec, order="sequential")])
        assert torch.equal(ours[padded], reference[padded])
        if exact:
            assert torch.equal(ours, reference)


def test_a_subclass_is_its_torchvision_base_unless_it_changes_a_method():
    class Crop(T.RandomResizedCrop):  # a user's own defaults: the base's behaviour
        def __init__(self) -> None:
            super().__init__(64, scale=(0.5, 1.0))

    class Odd(V.CenterCrop):  # its own behaviour: run as given
        def forward(self, *inputs):
            return super().forward(*inputs)

    plan = plan_transform(T.Compose([Crop(), T.PILToTensor()]), None)
    assert plan.crop == CropSpec("random_resized", (64, 64), scale=(0.5, 1.0), flip=False) and plan.per_sample == ()
    assert "a subclass of torchvision's RandomResizedCrop that changes none of its methods" in plan.steps[0].why
    plan = plan_transform(V.Compose([V.Resize(72), Odd(64), V.PILToTensor()]), None)
    assert plan.crop is None and [type(t).__name__ for t in plan.per_sample] == ["Resize", "Odd", "PILToTensor"]


def test_fixed_random_ops_match_the_dataloader_pixel_for_pixel(photos, packed):
    """Random ops drawn from one-point ranges are deterministic: the structure (centre, fill,
    interpolation, shear, order of the jitter's factors) is then compared pixel by pixel."""
    dataset = stoker.ShardDataset(packed)
    # factors below 1: nothing is clamped, so the jitter's four adjustments commute and the order
    # drawn per sample (differently by each) does not show; it is checked in tests/test_augment.py
    pipeline = T.Compose([T.Resize((60, 80)), T.ToTensor(), T.RandomAffine((20, 20), shear=(10, 10, 5, 5), fill=0.5),
                          T.ColorJitter((0.9, 0.9), (0.8, 0.8), (0.7, 0.7)), T.GaussianBlur(5, (1.0, 1.0))])
    ours = torch.cat([images for images, _ in stoker.Loader(dataset, 48, transform=pipeline, order="sequential")])
    difference = (ours - by_key(photos, dataset, pipeline)).abs() * 255
    assert float(difference.mean()) < 0.5 and float(torch.quantile(difference.flatten()[::5], 0.9)) < 1


def test_random_draws_follow_torchvisions_ranges_and_structure():
    n = 4000
    rng = np.random.default_rng(0)
    jitter = T.ColorJitter(0.4, (0.5, 1.5), 0.3, 0.2)
    ours = A.ColorJitter(**{k: tuple(getattr(jitter, k)) for k in ("brightness", "contrast", "saturation", "hue")}).draw(rng, n)
    torch.manual_seed(0)
    theirs = np.array([[float(v) for v in T.ColorJitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation,
                                                                   jitter.hue)[1:]] for _ in range(n)])
    for column, name in enumerate(("brightness", "contrast", "saturation", "hue")):
        quantiles = np.linspace(0.05, 0.95, 10)
        assert np.allclose(np.quantile(ours[name], quantiles), np.quantile(theirs[:, column], quantiles), atol=0.03)
    assert len(np.unique(ours["order"])) == 24  # every order of the four, as torch.randperm(4)
    # RandomResizedCrop: area fraction and aspect of the boxes, against torchvision's get_params
    spec, image = CropSpec("random_resized", (224, 224)), torch.empty(3, 375, 500)
    boxes = np.array([crop_box(spec, 375, 500, t) for t in rng.random((n, 10, 4))])
    tv_boxes = np.array([T.RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)])
    for ours_box, tv_box in ((boxes, tv_boxes),):
        area, tv_area = ours_box[:, 2] * ours_box[:, 3] / (375 * 500), tv_box[:, 2] * tv_box[:, 3] / (375 * 500)
        aspect, tv_aspect = ours_box[:, 3] / ours_box[:, 2], tv_box[:, 3] / tv_box[:, 2]
        assert np.allclose(np.quantile(area, quantiles), np.quantile(tv_area, quantiles), atol=0.04)
        assert np.allclose(np.quantile(aspect, quantiles), np.quantile(tv_aspect, quantiles), atol=0.04)


def test_affine_maps_are_torchvisions():
    ramp = torch.stack(torch.meshgrid(torch.arange(40.0) + 0.5, torch.arange(48.0) + 0.5, indexing="ij")[::-1]
                       + (torch.ones(40, 48),))[None]
    for angle, scale, shear, center in ((30.0, 1.1, (10.0, -5.0), None), (-50.0, 0.9, (0.0, 20.0), [10.0, 30.0])):
        theirs = VF.affine(ramp, angle=angle, translate=[0, 0], scale=scale, shear=list(shear), center=center,
                           interpolation=VF.InterpolationMode.BILINEAR)
        op = A.Affine(degrees=(-angle, -angle), scale=(scale, scale), shear=(shear[0], shear[0], shear[1], shear[1]),
                      center=None if center is None else tuple(center))
        maps, _ = op.draw(np.random.default_rng(0), (np.array([40]), np.array([48])))
        ours = A.geometry.sample(ramp, torch.from_numpy(maps).float(), (40, 48))
        inside = theirs[0, 2] > 0.999  # away from the border
        assert torch.allclose(ours[0, :2][:, inside], theirs[0, :2][:, inside], atol=2e-3)


def test_the_same_batches_whatever_the_thread_count(packed):
    dataset = stoker.ShardDataset(packed)
    pipeline = train(V, 48)
    one = [b.clone() for b, _ in stoker.Loader(dataset, 16, transform=pipeline, threads=1, seed=3)]
    three = [b.clone() for b, _ in stoker.Loader(dataset, 16, transform=pipeline, threads=3, seed=3, prefetch=3)]
    assert all(torch.equal(a, b) for a, b in zip(one, three, strict=True))
    other = next(iter(stoker.Loader(dataset, 16, transform=pipeline, seed=4)))[0]
    assert not torch.equal(one[0], other)


def test_float_batches_come_from_the_ring_and_a_held_one_is_never_overwritten(packed):
    dataset = stoker.ShardDataset(packed)
    reference = [b.clone() for b, _ in stoker.Loader(dataset, 16, transform=train(T, 32), seed=1)]
    loader = stoker.Loader(dataset, 16, transform=train(T, 32), seed=1, prefetch=2)
    addresses = {images.data_ptr() for images, _ in loader}  # let go of each batch: buffers come back
    assert len(addresses) <= loader.prefetch + 1
    loader.set_epoch(0)
    kept = [images for images, _ in loader]
    assert len({images.data_ptr() for images in kept}) == len(kept)
    assert all(torch.equal(a, b) for a, b in zip(kept, reference, strict=True))


def test_the_per_sample_rest_gets_what_the_dataloader_would_give_it(photos, packed):
    seen = set()

    def record(image):
        seen.add(type(image).__name__)
        return image

    dataset = stoker.ShardDataset(packed)
    v1 = T.Compose([T.Resize(72), T.CenterCrop(64), T.Lambda(record), T.Grayscale(1), T.PILToTensor()])
    images, _ = next(iter(stoker.Loader(dataset, 8, transform=v1, order="sequential")))
    assert seen == {"Image"} and images.shape == (8, 1, 64, 64) and images.dtype == torch.uint8  # PIL images
    assert (images.float() - by_key(photos, dataset, v1)[:8].float()).abs().max() <= 1
    seen.clear()
    v2 = V.Compose([V.RandomResizedCrop(32), V.ToImage(), V.Lambda(record), V.ToDtype(torch.float32, scale=True),
                    V.RandomErasing(p=1.0)])
    images, _ = next(iter(stoker.Loader(dataset, 8, transform=v2)))
    assert seen == {"Image"} and images.dtype == torch.float32  # tv_tensors.Image, as after ToImage
    assert all((image == 0).all(dim=0).any() for image in images)  # every sample erased (value 0)


def test_processes_make_the_same_batches_with_a_random_per_sample_rest(packed):
    dataset = stoker.ShardDataset(packed)
    pipeline = T.Compose([T.RandomResizedCrop(32), T.ToTensor(), T.RandomErasing(p=0.5)])
    one = [b for b, _ in stoker.Loader(dataset, 16, transform=pipeline, processes=1, seed=2)]
    two = [b for b, _ in stoker.Loader(dataset, 16, transform=pipeline, processes=2, seed=2)]
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_explain_says_what_runs_where_and_why(packed):
    loader = stoker.Loader(stoker.ShardDataset(packed), 16, transform=T.Compose([
        T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
        T.Normalize(MEAN, STD), T.RandomErasing()]))
    text = loader.explain()
    decode, batched, per_sample = text.index("fused into the decode"), text.index("batched:"), text.index("per sample,")
    assert decode < text.index("RandomResizedCrop") < text.index("RandomHorizontalFlip") < batched
    assert batched < text.index("ColorJitter") < text.index("Normalize") < per_sample < text.index("RandomErasing")
    assert "CPU, one native call per chunk of crops on each thread" in text  # ColorJitter + Normalize: native
    assert "read, decode, crop: one native call per chunk of samples" in text
    assert "RandomErasing has no batched counterpart" in text and "output: the per-sample results, stacked" in text


def test_loader_for_an_image_folder_takes_its_root_and_transform(photos, tmp_path):
    folder = ImageFolder(photos, transform=val(T, 40, 32))
    loader = stoker.loader_for(folder, batch_size=8, pack_dir=tmp_path / "pack", progress=False)
    images, _ = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32
    assert loader.dataset.classes == folder.classes and len(loader.dataset) == len(folder)
    with pytest.raises(ValueError, match="two transforms"):
        stoker.loader_for(folder, train(T), pack_dir=tmp_path / "pack", progress=False)


@pytest.mark.parametrize("transform, only, rows, ratio", [
    ("standard", "val-dataloader,val-transform", ("val: DataLoader + torchvision, ", "val: stoker.Loader(transform=the Compose)"),
     "val: Loader(transform=) / DataLoader: "),
    ("timm", "", ("timm train: timm's dataset + DataLoader, ", "timm train: stoker.Loader(transform=the same)"),
     "timm train: Loader(transform=) / timm's DataLoader: "),  # the figure bench/timm.py prints
], ids=["standard", "timm"])
def test_bench_loader_transform_runs_end_to_end(tmp_path, capsys, transform, only, rows, ratio):
    from stoker.cli import main

    if transform == "timm":
        pytest.importorskip("timm", reason="needs timm (make test runs these tests in .venv-tv)")
    status = main(["bench", "loader", "--transform", transform, "--data", str(tmp_path), "--count", "24", "--batch", "8",
                   "--repeat", "1", "--only", only, "--force"])
    out = capsys.readouterr().out
    assert status == 0
    for name in rows:
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert all(float(v) > 0 for v in line.split()[-5:-1]), line
    assert ratio in out


def test_the_training_example_resumes_where_it_stopped(photos, tmp_path):
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "examples" / "train_imagefolder.py"
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def run(checkpoint, *options):
        done = subprocess.run([sys.executable, str(script), str(photos), "--batch-size", "16", "--size", "32", "--width", "4",
                               "--epochs", "2", "--checkpoint", str(tmp_path / checkpoint), *options],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    run("whole.pt", "--max-steps", "8")  # 6 batches per epoch: into the second epoch
    run("parts.pt", "--max-steps", "5")
    assert "resumed at step 5, epoch 0" in run("parts.pt", "--max-steps", "8", "--resume")
    whole, parts = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "parts.pt")
    assert whole["step"] == parts["step"] == 8 and whole["loader"] == parts["loader"]
    for name, value in whole["model"].items():  # the same batches in the same order: the same weights
        assert torch.allclose(value.float(), parts["model"][name].float(), atol=1e-5), name
    run("torch.pt", "--loader", "torch", "--workers", "1", "--max-steps", "3")
    out = run("torch.pt", "--loader", "torch", "--workers", "1", "--max-steps", "5", "--resume")
    assert "resumed at step 3, epoch 0" in out and torch.load(tmp_path / "torch.pt")["loader"]["samples_done"] == 5 * 16


def test_the_doctor_predicts_the_loader_with_a_torchvision_pipeline(photos):
    """stoker doctor times stoker.Loader(transform=<the user's Compose>) on its sample pack and proposes it."""
    train = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                       T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    report = stoker.doctor(photos, transform=train, step_time=0.001, batch_size=32, quick=True)
    loader = next(r for r in report.verdict.remedies if r.name.endswith("stoker.Loader with your transform"))
    assert loader.predicted_images_per_s and loader.predicted_images_per_s > 0, report.to_text()
    assert "transform=train_transform" in loader.how
    tuner = report.verdict.tuner  # forecast from the Loader's run with the Compose, not the one without it
    assert tuner is not None
    assert f"sample pack, {report.sample_pack.loader_transform:,.0f} img/s on" in tuner.measured["per_core"]
