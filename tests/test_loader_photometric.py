"""Loader(transform=<torchvision pipeline>) with the batched augmentation in one native call per
chunk (stoker.augment._photometric) against the same Loader augmenting image by image
(Augment.apply_image, where the extension is not built): the same batches, to float32 rounding."""

from __future__ import annotations

import pytest
import torch

import stoker
from stoker.augment import native as photometric
from stoker.loader import thread_augment

pytest.importorskip("torchvision", reason="needs torchvision (make test runs these tests in .venv-tv)")
pytest.importorskip("stoker.augment._photometric", reason="the photometric extension is not built")
import torchvision.transforms as T  # noqa: E402

pytestmark = pytest.mark.torchvision
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PIPELINES = {
    "train": T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4), T.ToTensor(),
                        T.Normalize(MEAN, STD)]),
    "hue + grayscale": T.Compose([T.RandomResizedCrop(40), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2),
                                  T.ToTensor(), T.Normalize(MEAN, STD)]),
    "uint8": T.Compose([T.RandomResizedCrop(40), T.ColorJitter(0.3, 0.3), T.PILToTensor()]),
}


def _batches(path, pipeline, threads) -> list[torch.Tensor]:
    loader = stoker.Loader(stoker.ShardDataset(path), 12, transform=pipeline, threads=threads, seed=3)
    return [images.clone() for images, _ in loader]


@pytest.mark.parametrize("name", PIPELINES)
def test_the_native_augmentation_gives_the_per_image_batches(packed, monkeypatch, name):
    calls = []
    real = thread_augment.augment_chunk
    monkeypatch.setattr(thread_augment, "augment_chunk", lambda *args: calls.append(1) or real(*args))
    native = _batches(packed, PIPELINES[name], threads=3)
    assert calls  # the native path ran
    with monkeypatch.context() as m:
        m.setattr(photometric, "apply_chunk", None)  # as where the extension is not built
        per_image = _batches(packed, PIPELINES[name], threads=2)
    assert len(native) == len(per_image)
    for a, b in zip(native, per_image):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == torch.uint8:
            assert (a.int() - b.int()).abs().max() <= 1
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
