"""Hugging Face ``datasets`` as sources: a Dataset, a DatasetDict's split and a save_to_disk folder
pack with their ClassLabel names and the images' original bytes; ``Image(decode=False)`` items and
``to_parquet`` output with paths but no bytes are read from their paths; loader_for packs a Dataset
once. Real Datasets built here from real JPEGs (no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import stoker
from stoker.cli import main
from stoker.errors import OptionError

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def some(photos) -> list[Path]:
    """Twelve of the sample photos, three of each class."""
    return [p for c in sorted(photos.iterdir()) for p in sorted(c.iterdir())[:3]]


def hf_dataset(some: list[Path], *, embedded: bool = True):
    """The photos as a Hugging Face Dataset: an Image feature (the encoded bytes, or only the
    files' paths) and a ClassLabel of the folder names."""
    names = sorted({p.parent.name for p in some})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    images = [{"bytes": p.read_bytes(), "path": None} if embedded else {"bytes": None, "path": str(p)} for p in some]
    return datasets.Dataset.from_dict({"image": images, "label": [names.index(p.parent.name) for p in some]},
                                      features=features)


def packed_bytes(dst: Path) -> dict[bytes, str]:
    """Each packed image's bytes -> its class name."""
    dataset = stoker.ShardDataset(dst, decode="raw")
    return {bytes(dataset[i][0]): dataset.classes[dataset[i][1]] for i in range(len(dataset))}


def test_a_dataset_keeps_its_original_bytes_and_classlabel_names(some, tmp_path):
    source = hf_dataset(some).shuffle(seed=3)  # an indices mapping over the table, as shuffle and select make
    result = stoker.pack(source, tmp_path / "ds", workers=2, progress=False)
    assert not result.rejected and packed_bytes(result.dst) == {p.read_bytes(): p.parent.name for p in some}
    assert stoker.ShardDataset(result.dst).classes == source.features["label"].names


def test_decode_false_items_and_path_only_parquet_are_read_from_their_paths(some, tmp_path):
    expected = {p.read_bytes(): p.parent.name for p in some}
    paths_only = hf_dataset(some, embedded=False).cast_column("image", datasets.Image(decode=False))
    assert paths_only[0]["image"] == {"bytes": None, "path": str(some[0])}
    result = stoker.pack(paths_only, tmp_path / "ds", workers=1, progress=False)
    assert not result.rejected and packed_bytes(result.dst) == expected

    paths_only.to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))
    result = stoker.pack(tmp_path / "pq", tmp_path / "from-parquet", workers=1, progress=False)
    assert not result.rejected and packed_bytes(result.dst) == expected
    assert stoker.ShardDataset(result.dst).classes == sorted({p.parent.name for p in some})  # ClassLabel metadata

    class Wrapped(torch.utils.data.Dataset):  # a user's Dataset handing on Image(decode=False) items
        def __len__(self) -> int:
            return len(paths_only)

        def __getitem__(self, i: int):
            return paths_only[i]

    result = stoker.pack(Wrapped(), tmp_path / "wrapped", workers=1, progress=False)
    assert not result.rejected and {bytes(stoker.ShardDataset(result.dst, decode="raw")[i][0])
                                    for i in range(len(some))} == set(expected)

    gone = tmp_path / "gone.jpg"
    missing = datasets.Dataset.from_dict({"image": [str(some[0]), str(gone)], "label": [0, 1]})
    result = stoker.pack(missing.cast_column("image", datasets.Image(decode=False)), tmp_path / "one", workers=1,
                         progress=False)
    assert result.num_samples == 1
    assert result.rejected == [("Dataset[1]", f"{gone}: cannot read: No such file or directory")]


def test_a_dataset_dict_split_and_save_to_disk_folders(some, tmp_path, capsys):
    splits = datasets.DatasetDict(train=hf_dataset(some[:8]), test=hf_dataset(some[8:]))
    with pytest.raises(OptionError, match=re.escape("a Hugging Face DatasetDict of splits train, test: choose one with "
                                                    "split= (--split)")):
        stoker.pack(splits, tmp_path / "ds", progress=False)
    with pytest.raises(OptionError, match=re.escape("split='val' (--split): a Hugging Face DatasetDict holds no such "
                                                    "split; its splits: train, test")):
        stoker.pack(splits, tmp_path / "ds", split="val", progress=False)
    result = stoker.pack(splits, tmp_path / "ds", split="test", workers=1, progress=False)
    assert packed_bytes(result.dst) == {p.read_bytes(): p.parent.name for p in some[8:]}

    for name, split in splits.items():
        split.to_parquet(str(tmp_path / "pq" / f"{name}-00000-of-00001.parquet"))
    with pytest.raises(stoker.PackError, match=r"holds several splits or configs \(test, train\); pack one: --split test"):
        stoker.pack(tmp_path / "pq", tmp_path / "both", progress=False)
    result = stoker.pack(tmp_path / "pq", tmp_path / "pq-test", split="test", workers=1, progress=False)
    assert packed_bytes(result.dst) == {p.read_bytes(): p.parent.name for p in some[8:]}

    splits["train"].save_to_disk(str(tmp_path / "saved"))
    splits.save_to_disk(str(tmp_path / "saved-dict"))
    result = stoker.pack(tmp_path / "saved", tmp_path / "from-disk", workers=1, progress=False)
    assert packed_bytes(result.dst) == {p.read_bytes(): p.parent.name for p in some[:8]}
    assert main(["pack", str(tmp_path / "saved-dict"), str(tmp_path / "cli"), "--split", "train", "--quiet"]) == 0
    assert packed_bytes(tmp_path / "cli") == packed_bytes(result.dst)
    capsys.readouterr()
    assert main(["pack", str(tmp_path / "saved-dict"), str(tmp_path / "cli2"), "--quiet"]) == 1
    assert capsys.readouterr().err == (f"stoker: error: {tmp_path / 'saved-dict'}: a Hugging Face DatasetDict "
                                       "(save_to_disk) of splits train, test: choose one with split= (--split)\n")


def test_loader_for_packs_a_dataset_once_and_a_save_to_disk_folder_by_its_files(some, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = hf_dataset(some)
    first = stoker.loader_for(source, batch_size=4, progress=False)
    pack = Path(first.dataset.shards.root)
    made = {p.name: p.stat().st_mtime_ns for p in pack.iterdir()}
    again = stoker.loader_for(hf_dataset(some), batch_size=4, progress=False)  # the same content, built anew
    assert Path(again.dataset.shards.root) == pack and {p.name: p.stat().st_mtime_ns for p in pack.iterdir()} == made
    assert again.dataset.classes == source.features["label"].names
    images, labels = next(iter(again))
    assert images.shape == (4, 3, 224, 224) and labels.dtype.is_floating_point is False

    other = stoker.loader_for(hf_dataset(some[:6]), batch_size=4, progress=False)
    assert Path(other.dataset.shards.root) != pack and len(other.dataset) == 6

    source.set_transform(lambda batch: batch)
    with pytest.raises(OptionError, match=re.escape("stoker.loader_for got a Hugging Face Dataset with a transform of "
                                                    "its own (set_transform / with_transform), which would not run")):
        stoker.loader_for(source, batch_size=4, progress=False)

    hf_dataset(some).save_to_disk(str(tmp_path / "saved"))
    saved = stoker.loader_for(tmp_path / "saved", batch_size=4, progress=False)
    assert len(saved.dataset) == len(some) and saved.dataset.classes == source.features["label"].names
