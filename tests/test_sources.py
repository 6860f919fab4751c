"""More sources for `stoker pack`: Parquet in the Hugging Face layout, WebDataset tar shards and
map-style Datasets, each round-tripped byte for byte, with bad input named and skipped."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
from PIL import Image

import stoker
from stoker.errors import PackError
from stoker.format import read_manifest
from tests.conftest import SMALL_SHARD, source_files


def class_of(key: str) -> str:
    return key.split("/")[0]


def write_hf_parquet(photos: Path, folder: Path, files: int = 2, row_group: int = 10) -> list[str]:
    """``photos`` as Hugging Face ``datasets`` writes an image data set: an Image struct column of
    bytes and path, a ClassLabel column, and the features in the schema metadata."""
    sources = source_files(photos)
    classes = sorted({class_of(key) for key in sources})
    keys = list(sources)
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    folder.mkdir(parents=True)
    for n, part in enumerate(np.array_split(np.arange(len(keys)), files)):
        table = pa.table({"image": [{"bytes": sources[keys[i]], "path": f"{keys[i].split('/')[-1]}.jpg"} for i in part],
                          "label": pa.array([classes.index(class_of(keys[i])) for i in part], pa.int64())})
        pq.write_table(table.replace_schema_metadata(metadata), folder / f"train-{n:05d}-of-{files:05d}.parquet",
                       row_group_size=row_group)
    return classes


def packed_members(dst: Path) -> dict[bytes, int]:
    """Image bytes -> label, for every sample of a packed data set."""
    dataset = stoker.ShardDataset(dst, decode="raw")
    out = {}
    for i in range(len(dataset)):
        members = dataset.read_sample(i)
        out[members["jpg"]] = int(members["cls"]) if "cls" in members else None
        assert int(dataset.targets[i]) == (out[members["jpg"]] if "cls" in members else -1)
    return out


def test_hugging_face_parquet_round_trips(photos, tmp_path):
    classes = write_hf_parquet(photos, tmp_path / "hf" / "data")
    result = stoker.pack(tmp_path / "hf", tmp_path / "ds", shard_bytes=SMALL_SHARD, workers=2, progress=False)
    assert result.num_samples == len(source_files(photos)) and result.num_shards > 4 and not result.rejected
    assert stoker.ShardDataset(result.dst).classes == classes
    expected = {data: classes.index(class_of(key)) for key, data in source_files(photos).items()}
    assert packed_members(result.dst) == expected
    assert read_manifest(result.dst).source["kind"] == "parquet"


def test_parquet_rows_without_bytes_and_damaged_files_are_named(photos, tmp_path):
    good = source_files(photos)
    data = list(good.values())[:3]
    table = pa.table({"png": pa.array([data[0], None, b"not an image", data[2]], pa.binary()),
                      "label": ["cat", "dog", "cat", "dog"]})
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "plain.parquet")
    result = stoker.pack(tmp_path / "src", tmp_path / "ds", workers=1, progress=False)
    assert result.num_samples == 2 and stoker.ShardDataset(result.dst).classes == ["cat", "dog"]
    assert [reason for _, reason in result.rejected] == ["no image in this row (no bytes, no path)",
                                                         "not an image (no known image format)"]
    assert all("plain.parquet[row group 0, row " in name for name, _ in result.rejected)

    (tmp_path / "src" / "plain.parquet").write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(PackError, match=r"plain.parquet: not a readable Parquet file"):
        stoker.pack(tmp_path / "src", tmp_path / "ds2", workers=1, progress=False)


def write_webdataset(photos: Path, folder: Path, per_tar: int = 40) -> None:
    """``photos`` as WebDataset shards written by webdataset's TarWriter: key.jpg + key.cls."""
    sources = source_files(photos)
    classes = sorted({class_of(key) for key in sources})
    folder.mkdir(parents=True)
    for n, start in enumerate(range(0, len(sources), per_tar)):
        with wds.TarWriter(str(folder / f"shard-{n:04d}.tar")) as sink:
            for key in list(sources)[start : start + per_tar]:
                sink.write({"__key__": key.replace("/", "_"), "jpg": sources[key], "cls": classes.index(class_of(key))})


def test_webdataset_shards_round_trip(photos, tmp_path):
    write_webdataset(photos, tmp_path / "wds")
    result = stoker.pack(tmp_path / "wds", tmp_path / "ds", shard_bytes=SMALL_SHARD, workers=2, progress=False)
    classes = sorted({class_of(key) for key in source_files(photos)})
    expected = {data: classes.index(class_of(key)) for key, data in source_files(photos).items()}
    assert not result.rejected and packed_members(result.dst) == expected
    dataset = stoker.ShardDataset(result.dst)
    assert sorted(dataset.key(i) for i in range(len(dataset)))[0].startswith("shard-0000/")


def test_webdataset_samples_without_an_image_and_truncated_tars_are_named(photos, tmp_path):
    data = list(source_files(photos).values())
    (tmp_path / "wds").mkdir()
    with wds.TarWriter(str(tmp_path / "wds" / "a.tar")) as sink:
        sink.write({"__key__": "s1", "jpg": data[0], "cls": 1})
        sink.write({"__key__": "s2", "txt": "a caption without its image", "cls": 0})
        sink.write({"__key__": "s3", "jpg": data[1], "cls": 0})
    whole = (tmp_path / "wds" / "a.tar").read_bytes()
    result = stoker.pack(tmp_path / "wds", tmp_path / "ds", workers=1, progress=False)
    assert result.num_samples == 2
    assert result.rejected == [(f"{tmp_path / 'wds' / 'a.tar'}:s2", "the sample has no image member")]

    end_of_s3 = whole.index(data[1]) + len(data[1])
    (tmp_path / "wds" / "a.tar").write_bytes(whole[: end_of_s3 - 100])  # cut inside the last image
    result = stoker.pack(tmp_path / "wds", tmp_path / "ds2", workers=1, progress=False)
    assert result.num_samples == 1
    assert ("a.tar:s3.jpg", "truncated tar") in [(name.rsplit("/", 1)[-1], reason[:13]) for name, reason in result.rejected]
    assert (tmp_path / "wds" / "a.tar").stat().st_size == end_of_s3 - 100  # the source is only read


class PhotoDataset(torch.utils.data.Dataset):
    """A map-style Dataset as users have them: items of several kinds, and one that raises."""

    classes = ["even", "odd"]

    def __init__(self, photos: Path) -> None:
        self.files = sorted(photos.rglob("*.jpg"))[:12]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        data = self.files[i].read_bytes()
        if i == 5:
            raise OSError(f"cannot open {self.files[i].name}")
        if i % 3 == 0:
            return data, i % 2  # encoded bytes
        image = Image.open(io.BytesIO(data)).convert("RGB")
        if i % 3 == 1:
            return image, np.int64(i % 2)  # a PIL image, a numpy label
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous(), torch.tensor(i % 2)  # CHW tensor


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_map_style_dataset_round_trips(photos, tmp_path, engine):
    if engine == "ray":
        pytest.importorskip("ray")
    source = PhotoDataset(photos)
    result = stoker.pack(source, tmp_path / "ds", workers=2, progress=False, engine=engine)
    assert result.rejected == [("PhotoDataset[5]", "__getitem__ raised OSError: cannot open " + source.files[5].name)]
    dataset = stoker.ShardDataset(result.dst, decode="raw")
    decoded = stoker.ShardDataset(result.dst, decode="tensor")
    assert len(dataset) == 11 and dataset.classes == ["even", "odd"]
    for i in range(len(dataset)):
        n = int(dataset.key(i))
        members = dataset.read_sample(i)
        assert int(members["cls"]) == n % 2 == decoded[i][1]
        original = np.asarray(Image.open(source.files[n]).convert("RGB")).astype(np.float32)
        if n % 3 == 0:
            assert members["jpg"] == source.files[n].read_bytes()
        else:  # stored as JPEG at quality 90
            again = decoded[i][0].permute(1, 2, 0).numpy().astype(np.float32)
            assert again.shape == original.shape and np.abs(again - original).mean() < 3.0


def test_parquet_sources_are_checked_file_by_file(photos, tmp_path):
    write_hf_parquet(photos, tmp_path / "hf")
    data = next(iter(source_files(photos).values()))
    pq.write_table(pa.table({"image": [{"bytes": data, "path": "x.jpg"}]}), tmp_path / "hf" / "train-00002-of-00003.parquet")
    with pytest.raises(PackError, match=r"train-00002-of-00003.parquet: its image and label columns .* differ"):
        stoker.pack(tmp_path / "hf", tmp_path / "mixed", progress=False)
    (tmp_path / "hf" / "train-00002-of-00003.parquet").rename(tmp_path / "hf" / "test-00000-of-00001-1a2b3c.parquet")
    with pytest.raises(PackError, match=r"holds several splits or configs \(test, train\); pack one"):
        stoker.pack(tmp_path / "hf", tmp_path / "splits", progress=False)
    result = stoker.pack(tmp_path / "hf" / "train-*.parquet", tmp_path / "train", workers=2, progress=False,
                         shuffle_seed=3, shard_bytes=SMALL_SHARD)
    classes = sorted({class_of(key) for key in source_files(photos)})
    assert packed_members(result.dst) == {d: classes.index(class_of(k)) for k, d in source_files(photos).items()}


def test_a_dataset_whose_content_changed_is_packed_again_not_resumed(photos, tmp_path):
    class Shade(torch.utils.data.Dataset):
        def __init__(self, level: int) -> None:
            self.level = level

        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int):
            return np.full((8, 8, 3), self.level, np.uint8), 0

    stoker.pack(Shade(10), tmp_path / "ds", workers=1, progress=False)
    with pytest.raises(PackError, match="already holds a stoker data set made from other input"):
        stoker.pack(Shade(200), tmp_path / "ds", workers=1, progress=False)


def test_dict_items_cmyk_images_and_all_rejected_datasets(photos, tmp_path):
    class HuggingFaceLike(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            image = Image.new("CMYK", (16, 12), (0, 50, 100, 0)) if i == 1 else Image.new("RGB", (16, 12), (9, 9, 9))
            return {"image": image, "label": i}

    result = stoker.pack(HuggingFaceLike(), tmp_path / "hf", workers=1, progress=False)
    dataset = stoker.ShardDataset(result.dst, decode="tensor")
    assert not result.rejected and sorted(int(dataset[i][1]) for i in range(3)) == [0, 1, 2]

    class Floats(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            return torch.rand(3, 8, 8), 0

    with pytest.raises(PackError, match=r"every input was rejected \(2, .*Floats\[0\]: image array of float32"):
        stoker.pack(Floats(), tmp_path / "floats", workers=1, progress=False)
