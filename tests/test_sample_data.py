"""make_sample_photos: layout, realistic JPEGs, determinism, and safe reruns on the same folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PIL import Image

from stoker.errors import StokerError
from stoker.sample_data import SIZES, make_sample_photos

COUNT = 40
CLASSES = 4


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return make_sample_photos(tmp_path_factory.mktemp("sample") / "photos", count=COUNT, num_classes=CLASSES)


def files(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (hidden ones too) by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def stats(root: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) per file: a rewrite through a temporary file changes at least the inode."""
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_layout(sample):
    assert sorted(p.name for p in sample.iterdir()) == [f"class_{c:02d}" for c in range(CLASSES)]
    names = sorted(p.relative_to(sample).as_posix() for p in sample.rglob("*") if p.is_file())
    assert names == sorted(f"class_{i % CLASSES:02d}/img_{i:06d}.jpg" for i in range(COUNT))


def test_photos_are_rgb_jpegs_of_photo_size(sample):
    sizes = []
    for path in sample.rglob("*.jpg"):
        with Image.open(path) as image:
            assert image.format == "JPEG"
            assert image.mode == "RGB"
            assert image.size in SIZES
            image.load()
        sizes.append(path.stat().st_size)
    mean_kb = sum(sizes) / len(sizes) / 1000
    assert 40 <= mean_kb <= 130, f"mean JPEG size {mean_kb:.1f} KB is not photo-like"


def test_same_seed_same_bytes_other_seed_differs(sample, tmp_path):
    again = make_sample_photos(tmp_path / "again", count=COUNT, num_classes=CLASSES)
    assert files(again) == files(sample)
    other = make_sample_photos(tmp_path / "other", count=4, num_classes=CLASSES, seed=1)
    assert all(data != files(sample)[name] for name, data in files(other).items())


def test_rerun_writes_nothing(sample):
    before = stats(sample)
    assert make_sample_photos(sample, count=COUNT, num_classes=CLASSES) == sample
    assert stats(sample) == before


def test_rerun_completes_an_interrupted_or_smaller_set(tmp_path):
    full = files(make_sample_photos(tmp_path / "full", count=12, num_classes=3))
    dst = make_sample_photos(tmp_path / "part", count=8, num_classes=3)
    (dst / "class_01/img_000004.jpg").unlink()
    (dst / "class_02/.img_000005.jpg.tmp").write_bytes(b"half a JPEG")  # left by a kill before the rename
    (dst / "class_02/img_000005.jpg").unlink()
    kept = {name: st for name, st in stats(dst).items() if name.endswith(".jpg")}
    make_sample_photos(dst, count=12, num_classes=3)
    assert files(dst) == full  # missing files written, stale temporary file replaced and gone
    assert {name: st for name, st in stats(dst).items() if name in kept} == kept


@pytest.mark.parametrize("settings", [{"num_classes": 3}, {"count": 8}, {"seed": 1}, {"quality": 80}])
def test_refuses_to_mix_with_another_sample(sample, settings):
    before = stats(sample)
    with pytest.raises(StokerError, match="use an empty folder"):
        make_sample_photos(sample, **{"count": COUNT, "num_classes": CLASSES, **settings})
    assert stats(sample) == before


def test_missing_skimage_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "skimage", None)
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(ImportError, match=r"stoker\[sample\]"):
        make_sample_photos(tmp_path, count=1)
