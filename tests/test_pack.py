"""Packing real photos: byte-exact round trip, standard tar readers, sources, options, bad input."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import PackError
from stoker.format import read_manifest
from tests.conftest import CLASSES, PHOTOS, encode, source_files


def shard_paths(root: Path) -> list[Path]:
    return [root / s.name for s in read_manifest(root).shards]


def test_every_member_round_trips_byte_exact(photos, packed):
    sources = source_files(photos)
    dataset = stoker.ShardDataset(packed, decode="raw")
    assert len(dataset) == PHOTOS == len(sources)
    seen = set()
    for i in range(len(dataset)):
        key = dataset.key(i)
        members = dataset.read_sample(i)
        assert members["jpg"] == sources[key]
        assert int(members["cls"]) == dataset.targets[i] == dataset.classes.index(key.split("/")[0])
        seen.add(key)
    assert seen == set(sources)
    assert len(shard_paths(packed)) >= 8


def test_classes_and_targets_follow_imagefolder(photos, packed):
    dataset = stoker.ShardDataset(packed)
    classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
    assert dataset.classes == classes and len(classes) == CLASSES
    assert dataset.class_to_idx == {name: i for i, name in enumerate(classes)}
    expected = [classes.index(dataset.key(i).split("/")[0]) for i in range(len(dataset))]
    assert isinstance(dataset.targets, np.ndarray) and dataset.targets.tolist() == expected


def test_shards_read_with_python_tarfile_and_gnu_tar(photos, packed):
    sources = source_files(photos)
    names = []
    for shard in shard_paths(packed):
        with tarfile.open(shard) as tar:
            for member in tar:
                names.append(member.name)
                data = tar.extractfile(member).read()
                key, field = member.name.rsplit(".", 1)
                assert data == (sources[key] if field == "jpg" else data)
        listed = subprocess.run(["tar", "tf", str(shard)], capture_output=True, text=True, check=True).stdout.split()
        assert listed == names[-len(listed):]
    assert len(names) == 2 * PHOTOS
    assert [n.rsplit(".", 1)[0] for n in names[::2]] == [n.rsplit(".", 1)[0] for n in names[1::2]]  # adjacent


def test_shards_read_with_webdataset(photos, packed):
    webdataset = pytest.importorskip("webdataset")
    sources = source_files(photos)
    urls = [str(p) for p in shard_paths(packed)]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(samples) == PHOTOS
    for sample in samples:
        assert sample["jpg"] == sources[sample["__key__"]]
        assert int(sample["cls"]) in range(CLASSES)


def test_odd_image_modes_are_kept_byte_exact(odd_images, tmp_path):
    dst = tmp_path / "odd"
    result = stoker.pack(odd_images, dst, workers=1, progress=False)
    assert result.rejected == [] and result.num_samples == 8
    sources = source_files(odd_images)
    rgb = stoker.ShardDataset(dst, decode="rgb")
    tensors = stoker.ShardDataset(dst, decode="tensor")
    for i in range(len(rgb)):
        members = rgb.read_sample(i)
        image_field = next(f for f in members if f != "cls")
        assert members[image_field] == sources[rgb.key(i)]
        image, _ = rgb[i]
        assert image.dtype == np.uint8 and image.shape == (48, 64, 3)
        tensor, _ = tensors[i]
        assert tensor.shape == (3, 48, 64) and np.array_equal(tensor.permute(1, 2, 0).numpy(), image)
    assert rgb.classes == ["modes", "more"]
    assert {"jpg", "png", "webp", "bmp"} <= set(read_manifest(dst).schema)


def bomb_png() -> bytes:
    """A tiny PNG whose header claims 100,000 x 100,000 pixels (CRC fixed so it parses)."""
    data = bytearray(encode(Image.new("L", (8, 8)), "PNG"))
    data[16:24] = (100_000).to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


@pytest.fixture
def messy(photos, tmp_path) -> Path:
    """A few good photos and one of each kind of bad input."""
    root = tmp_path / "messy"
    good = sorted((photos / "class_00").glob("*.jpg"))[:4]
    (root / "good").mkdir(parents=True)
    (root / "bad").mkdir()
    for p in good:
        shutil.copy(p, root / "good" / p.name)
    photo = good[0].read_bytes()
    png = encode(Image.open(io.BytesIO(photo)), "PNG")
    (root / "bad/empty.jpg").write_bytes(b"")
    (root / "bad/truncated.jpg").write_bytes(photo[: len(photo) * 2 // 3])
    (root / "bad/truncated.png").write_bytes(png[: len(png) // 2])
    (root / "bad/notes.jpg").write_text("this is not an image\n")
    (root / "bad/bomb.png").write_bytes(bomb_png())
    bmp = encode(Image.open(io.BytesIO(photo)), "BMP")
    (root / "bad/truncated.bmp").write_bytes(bmp[: len(bmp) // 2])
    os.symlink(root / "does-not-exist.jpg", root / "bad/dangling.jpg")
    (root / "bad/readme.txt").write_text("ignored: not an image extension, as ImageFolder ignores it")
    return root


def snapshot(root: Path) -> dict[str, tuple]:
    return {str(p): (p.lstat().st_mtime_ns, p.lstat().st_size, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


EXPECTED_REASONS = {
    "empty.jpg": "empty file",
    "truncated.jpg": "truncated JPEG",
    "truncated.png": "truncated PNG",
    "notes.jpg": "not an image",
    "bomb.png": "decompression bomb",
    "truncated.bmp": "decode failed",
    "dangling.jpg": "cannot read: No such file",
}


def test_bad_inputs_are_skipped_and_reported(messy, tmp_path):
    before = snapshot(messy)
    dst = tmp_path / "out"
    result = stoker.pack(messy, dst, workers=2, progress=False)
    assert result.num_samples == 4
    report = (dst / "rejected.tsv").read_text().splitlines()
    assert report[0] == "path\treason"
    rows = dict(line.split("\t") for line in report[1:])
    assert {Path(p).name for p in rows} == set(EXPECTED_REASONS)
    for path, reason in rows.items():
        assert EXPECTED_REASONS[Path(path).name] in reason, (path, reason)
    assert snapshot(messy) == before, "the source must never be modified"


def test_strict_stops_at_the_first_bad_input(messy, tmp_path):
    (messy / "bad/dangling.jpg").unlink()
    dst = tmp_path / "strict"
    with pytest.raises(PackError, match=r"bad/\w+\.(jpg|png): .*stopped by --strict"):
        stoker.pack(messy, dst, workers=1, strict=True, progress=False)
    assert not (dst / "stoker.json").exists()


def test_verify_decode_catches_damage_inside_the_compressed_data(photos, tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    png = bytearray(encode(Image.open(next((photos / "class_01").glob("*.jpg"))), "PNG"))
    middle = len(png) // 2
    png[middle : middle + 64] = bytes(64)  # zeroed deflate data; the IEND chunk is still there
    (src / "a/damaged.png").write_bytes(bytes(png))
    cheap = stoker.pack(src, tmp_path / "cheap", workers=1, progress=False)
    assert cheap.rejected == []
    with pytest.raises(PackError, match=r"every input was rejected \(1, .*damaged.png: decode failed"):
        stoker.pack(src, tmp_path / "full", workers=1, verify_decode=True, progress=False)
    assert "damaged.png\tdecode failed" in (tmp_path / "full" / "rejected.tsv").read_text()


def test_path_list_sources(photos, tmp_path):
    files = sorted(photos.rglob("*.jpg"))[:10]
    listing = tmp_path / "list.csv"
    rows = ["path,label"] + [f"{os.path.relpath(p, tmp_path)},{'cat' if i % 2 else 'dog'}" for i, p in enumerate(files)]
    listing.write_text("\n".join(rows) + "\n")
    dataset = stoker.ShardDataset(stoker.pack(listing, tmp_path / "csv", workers=1, progress=False).dst, decode="raw")
    assert dataset.classes == ["cat", "dog"]
    assert sorted(dataset.targets.tolist()) == sorted(1 - i % 2 for i in range(10))
    by_bytes = {p.read_bytes(): ("cat" if i % 2 else "dog") for i, p in enumerate(files)}
    for i in range(len(dataset)):
        image, label = dataset[i]
        assert dataset.classes[label] == by_bytes[image]

    tsv = tmp_path / "list.tsv"
    tsv.write_text("".join(f"{p}\t{i}\n" for i, p in enumerate(files)))
    numeric = stoker.ShardDataset(stoker.pack(tsv, tmp_path / "tsv", workers=1, progress=False).dst, decode="raw")
    assert numeric.classes == [str(i) for i in range(10)] and sorted(numeric.targets.tolist()) == list(range(10))


def test_shuffle_seed_is_deterministic(photos, tmp_path):
    one = stoker.pack(photos, tmp_path / "one", shard_bytes=1_000_000, shuffle_seed=7, workers=2, progress=False)
    two = stoker.pack(photos, tmp_path / "two", shard_bytes=1_000_000, shuffle_seed=7, workers=1, progress=False)
    for a, b in zip(shard_paths(one.dst), shard_paths(two.dst)):
        assert a.read_bytes() == b.read_bytes()
        assert a.with_suffix(".idx").read_bytes() == b.with_suffix(".idx").read_bytes()
    keys = [stoker.ShardDataset(one.dst).key(i) for i in range(PHOTOS)]
    assert keys != sorted(keys) and sorted(keys) == sorted(source_files(photos))


def test_max_side_reencodes_only_large_images(photos, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(photos, src)
    small = encode(Image.new("RGB", (100, 80), "red"), "PNG")
    (src / "class_00" / "small.png").write_bytes(small)
    result = stoker.pack(src, tmp_path / "small", max_side=160, quality=80, workers=2, progress=False)
    dataset = stoker.ShardDataset(result.dst, decode="pil")
    for i in range(0, len(dataset), 7):
        image, _ = dataset[i]
        assert max(image.size) == 160
    assert dataset.read_sample(dataset.index_of("class_00/small"))["png"] == small
    assert result.total_bytes < result.source_bytes / 3
    assert read_manifest(result.dst).source["options"]["max_side"] == 160


def test_destination_rules(photos, packed, tmp_path):
    with pytest.raises(PackError, match="inside the source folder"):
        stoker.pack(photos, photos / "class_00" / "out", progress=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"x")
    with pytest.raises(PackError, match="holds other files"):
        stoker.pack(photos, foreign, progress=False)
    again = stoker.pack(photos, packed, shard_bytes=600_000, workers=2, progress=False)
    assert again.reused_shards == again.num_shards
    with pytest.raises(PackError, match="other input or options"):
        stoker.pack(photos, packed, shard_bytes=900_000, progress=False)
    with pytest.raises(PackError, match="no such folder"):
        stoker.pack(tmp_path / "nowhere", tmp_path / "x", progress=False)


@pytest.mark.parametrize("text, message", [
    ("path,label\na.jpg,cat\nb.jpg,\n", "no label while others have one"),
    ("a.jpg,1\nb.jpg,cat\n", "mix integers and class names"),
    ("a.jpg,1,2\n", "got 3 columns"),
])
def test_path_list_mistakes_are_refused(photos, tmp_path, text, message):
    listing = tmp_path / "list.csv"
    listing.write_text(text)
    with pytest.raises(PackError, match=rf"list.csv:\d+: .*{message}"):
        stoker.pack(listing, tmp_path / "out", progress=False)


def test_path_list_header_after_bom_and_comments(photos, tmp_path):
    files = sorted(photos.rglob("*.jpg"))[:3]
    rows = "".join(f"{p},{label}\n" for p, label in zip(files, (2, 10, -1)))
    (tmp_path / "list.csv").write_bytes("\ufeff# made by hand\npath,label\n".encode() + rows.encode())
    dataset = stoker.ShardDataset(stoker.pack(tmp_path / "list.csv", tmp_path / "out", progress=False).dst)
    assert len(dataset) == 3 and sorted(dataset.targets.tolist()) == [-1, 2, 10]
    assert dataset.classes == [str(i) for i in range(11)]  # integer labels without names: named by their numbers
