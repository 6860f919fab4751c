"""The Loader's error policy is ShardDataset's: raise naming the sample, or skip and count; and the
two agree on which images are good (what the fast decoders refuse, Pillow decides)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker.errors import CorruptDataError

CROP = stoker.CropSpec(size=(24, 32))


def damage(root: Path, victims: list[int]) -> stoker.ShardDataset:
    """Overwrite bytes inside the stored image of each victim (its checksum no longer matches)."""
    dataset = stoker.ShardDataset(root)
    for victim in victims:
        shard, local = dataset.shards.locate(victim)
        member = dataset.shards.index(shard).sample_members(local)[0]
        with open(dataset.shards.reader(shard).path, "r+b") as f:
            f.seek(int(member["offset"]) + 100)
            f.write(b"\x00" * 64)
    return dataset


@pytest.mark.parametrize("processes", [0, 2])
def test_skip_replaces_damaged_samples_and_counts_them(packed, tmp_path, processes):
    root = shutil.copytree(packed, tmp_path / "ds")
    victims = [3, 40, 77]
    damage(root, victims)
    lines = []
    loader = stoker.Loader(stoker.ShardDataset(root, on_error="skip"), 8, crop=CROP, threads=2, processes=processes,
                           order="sequential")
    assert loader.on_error == "skip"  # the data set's policy, unless the Loader is given its own
    watched = stoker.watch(loader, every=4, log=lines.append)
    batches = [(images.clone(), labels.clone()) for images, labels in watched]
    assert sum(len(labels) for _, labels in batches) == len(loader.dataset)  # full batches: replacements
    assert loader.skipped == len(victims)
    assert any(f"{len(victims)} damaged samples skipped" in line for line in lines[-1:])
    reference = stoker.Loader(stoker.ShardDataset(packed), 8, crop=CROP, threads=2, order="sequential")
    clean = torch.cat([labels for _, labels in reference])
    got = torch.cat([labels for _, labels in batches])
    same = np.ones(len(got), bool)
    same[victims] = False
    assert torch.equal(got[same], clean[same])  # every other sample where it was


def test_raise_names_the_damaged_sample(packed, tmp_path):
    root = shutil.copytree(packed, tmp_path / "ds")
    dataset = damage(root, [9])
    with pytest.raises(CorruptDataError, match="checksum") as info:
        for _ in stoker.Loader(dataset, 8, crop=CROP, threads=2, order="sequential"):
            pass
    assert info.value.key == dataset.key(9)
    with pytest.raises(CorruptDataError):  # the Loader's own policy wins over the data set's
        for _ in stoker.Loader(stoker.ShardDataset(root, on_error="skip"), 8, crop=CROP, on_error="raise"):
            pass


def jpeg_with_stray_bytes(seed: int) -> bytes:
    """A JPEG with garbage between its last scan and the end marker: libjpeg warns ("extraneous
    bytes before marker"), which the fast decoders treat as an error, Pillow decodes it."""
    y, x = np.mgrid[0:48, 0:64]
    pixels = np.stack([x * 4, y * 5, (x + y + 40 * seed) % 256], axis=-1).astype(np.uint8)  # smooth: decoders agree
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    data = out.getvalue()
    return data[:-2] + b"\x00\x01\x02\x03" + data[-2:]


def test_the_loader_accepts_what_shard_dataset_accepts(tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(jpeg_with_stray_bytes(i))
    dst = tmp_path / "ds"
    stoker.pack(tmp_path / "src", dst, progress=False, verify_decode=True)
    dataset = stoker.ShardDataset(dst, decode="rgb")
    whole = [dataset[i][0] for i in range(len(dataset))]  # Pillow decodes them all
    loader = stoker.Loader(stoker.ShardDataset(dst), 4, crop=stoker.CropSpec("resize", size=(48, 64), flip=False),
                           order="sequential", threads=2)
    images, _ = next(iter(loader))
    assert loader.skipped == 0
    for image, expected in zip(images.movedim(1, -1).numpy(), whole):
        assert np.abs(image.astype(int) - expected.astype(int)).mean() < 2  # Pillow's pixels, resized to their own size


def test_skip_is_refused_where_it_cannot_be_honoured(packed):
    with pytest.raises(ValueError, match="on_error='skip' needs decode='cpu'"):
        stoker.Loader(stoker.ShardDataset(packed), 8, on_error="skip", decode="gpu")
    with pytest.raises(ValueError, match=r"on_error='ignore': must be one of 'raise', 'skip' or None"):
        stoker.Loader(stoker.ShardDataset(packed), 8, on_error="ignore")
