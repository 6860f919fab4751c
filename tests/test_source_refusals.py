"""What stoker.pack, loader_for and ShardDataset take, and the one line that refuses anything else:
what it got, what to do, and what is taken. Map-style Datasets users hold are taken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import stoker
from stoker.errors import OptionError
from stoker.sources import PACK_TAKES

datasets = pytest.importorskip("datasets")


class Photos(torch.utils.data.Dataset):
    """A user's map-style Dataset of (JPEG bytes, label) items."""

    def __init__(self, photos: Path) -> None:
        self.files = sorted(photos.rglob("*.jpg"))[:8]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return self.files[i].read_bytes(), i % 2


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from ()


def bare_ray_dataset():
    """An instance of Ray Data's Dataset class, without starting Ray: a refusal looks at nothing but its class."""
    ray_data = pytest.importorskip("ray.data")
    dataset = ray_data.Dataset.__new__(ray_data.Dataset)
    dataset._current_executor = None  # what its __del__ reads
    return dataset


# Each kind of thing that is not a source: how to make one, and what the refusal says of it.
REFUSED = {
    "DataLoader": (lambda photos: torch.utils.data.DataLoader(Photos(photos)),
                   "a torch DataLoader: pass its .dataset instead"),
    "IterableDataset": (lambda photos: Stream(), "an IterableDataset (no random access): pass a map-style Dataset, or "
                                                 "the files it reads"),
    "streaming": (lambda photos: datasets.Dataset.from_dict({"image": [b"x"]}).to_iterable_dataset(),
                  "a streaming Hugging Face dataset (no random access): load it without streaming=True, or "
                  "save_to_disk and pass the folder"),
    "Ray": (lambda photos: bare_ray_dataset(), "a Ray Dataset: hand it over on Ray (docs/distributed.md), or write it "
                                               "as Parquet (ds.write_parquet) and pass the folder"),
    "dict": (lambda photos: {"image": [b"x"]}, "a dict: for columns of images and labels pass pandas.DataFrame(it) or "
                                              "pyarrow.table(it)"),
    "object": (lambda photos: object(), "a object, which has no __getitem__ and __len__"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_what_is_not_a_source_is_refused_in_one_line(photos, tmp_path, kind):
    make, why = REFUSED[kind]
    source = make(photos)
    with pytest.raises(OptionError) as pack_refusal:
        stoker.pack(source, tmp_path / "ds", progress=False)
    assert str(pack_refusal.value) == f"stoker.pack got {why}. It takes {PACK_TAKES}"
    with pytest.raises(OptionError) as loader_refusal:
        stoker.loader_for(source, batch_size=4, progress=False)
    assert str(loader_refusal.value) == (f"stoker.loader_for got {why}. It takes a packed stoker data set (a folder or "
                                         f"URL), a ShardDataset, a Mix, or what stoker.pack takes: {PACK_TAKES}")
    assert "\n" not in str(pack_refusal.value) and not (tmp_path / "ds").exists()


def test_shard_dataset_refuses_what_is_not_a_path(photos):
    with pytest.raises(OptionError) as refusal:
        stoker.ShardDataset(Photos(photos))  # type: ignore[arg-type]
    assert str(refusal.value) == (
        f"ShardDataset takes the path or URL of a packed stoker data set, got a {__name__}.Photos; to read a folder of "
        "images, a Dataset or a table, pack it first: stoker.loader_for(source, transform, batch_size) packs it once "
        "and reads it, stoker.pack(source, dst) writes the data set ShardDataset reads")


def test_loader_for_takes_a_map_style_dataset_and_packs_it_once(photos, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = stoker.loader_for(Photos(photos), batch_size=4, progress=False)
    assert len(first.dataset) == 8 and first.dataset.classes == ["0", "1"]
    pack = Path(first.dataset.shards.root)
    made = {p.name: p.stat().st_mtime_ns for p in pack.iterdir()}
    assert Path(stoker.loader_for(Photos(photos), batch_size=4, progress=False).dataset.shards.root) == pack
    assert {p.name: p.stat().st_mtime_ns for p in pack.iterdir()} == made
    images, labels = next(iter(first))
    assert images.shape == (4, 3, 224, 224) and sorted(set(labels.tolist())) <= [0, 1]
    with pytest.raises(OptionError, match=r"image_column='x': these say what to pack; .* is packed already"):
        stoker.loader_for(pack, batch_size=4, image_column="x")


def test_a_dataset_whose_items_change_from_read_to_read_is_refused(photos, tmp_path):
    class Jittered(Photos):
        def __getitem__(self, i: int):
            return torch.randint(0, 255, (3, 8, 8), dtype=torch.uint8), 0

    with pytest.raises(stoker.PackError, match=r"Jittered\[0\]: the item differs from one read to the next \(a random "
                                               r"transform inside __getitem__\?\)"):
        stoker.pack(Jittered(photos), tmp_path / "ds", progress=False)


def test_loader_for_takes_a_dataframe_with_its_label_column(photos, tmp_path, monkeypatch):
    pandas = pytest.importorskip("pandas")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = Photos(photos).files
    frame = pandas.DataFrame({"path": [str(p) for p in files], "target": [p.parent.name for p in files]})
    loader = stoker.loader_for(frame, batch_size=4, label_column="target", progress=False)
    assert loader.transform is None and loader.dataset.classes == sorted({p.parent.name for p in files})
    with pytest.raises(OptionError, match="pack_options holds label_column: give them to loader_for itself"):
        stoker.loader_for(frame, batch_size=4, label_column="target", pack_options={"label_column": "x"})


def test_a_batch_size_given_where_loader_for_takes_the_transform_is_refused(packed):
    """DataLoader(dataset, 8) is a batch size; loader_for's second argument is the transform: say so."""
    with pytest.raises(OptionError, match=r"transform=8: must be callable .*pass batch_size=8"):
        stoker.loader_for(packed, 8)
