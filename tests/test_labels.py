"""Labels are never lost silently: the image and label columns of Parquet, CSV/TSV, DataFrames and
Arrow tables can be named; a source where no label is found is refused, naming what it has, unless
it is said to be unlabelled; class names are never fewer than the labels need. Real files, real packs."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import stoker
from stoker.cli import main
from stoker.errors import OptionError, PackError
from stoker.format import MANIFEST_NAME, read_manifest, write_manifest

HINT = "or pack it without labels: --unlabelled (unlabelled=True)"


@pytest.fixture(scope="module")
def some(photos) -> list[Path]:
    """Twelve of the sample photos, three of each class."""
    return [p for c in sorted(photos.iterdir()) for p in sorted(c.iterdir())[:3]]


def served(dst: Path) -> dict[bytes, str]:
    """Each packed image's bytes -> its class name (the label's, by ShardDataset.classes)."""
    dataset = stoker.ShardDataset(dst, decode="raw")
    return {bytes(dataset[i][0]): dataset.classes[dataset[i][1]] for i in range(len(dataset))}


def write_target_parquet(some: list[Path], file: Path, labels: list) -> None:
    """A Parquet file as pandas writes one: an Image struct of bytes and path, and a ``target`` column."""
    file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"image": [{"bytes": p.read_bytes(), "path": p.name} for p in some], "target": labels}),
                   file)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_parquet_target_column_is_refused_without_label_column_and_packed_with_it(some, tmp_path, capsys):
    classes = [p.parent.name for p in some]
    write_target_parquet(some, tmp_path / "src" / "data.parquet", classes)
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "refused"), "--quiet"]) == 1
    assert error_line(capsys) == (f"stoker: error: {tmp_path / 'src'}: no label column (label, labels) among its "
                                  f"columns: image, target; name it with --label-column (label_column=); {HINT}")
    assert not (tmp_path / "refused" / MANIFEST_NAME).exists()

    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--label-column", "target", "--quiet"]) == 0
    assert served(tmp_path / "ds") == {p.read_bytes(): p.parent.name for p in some}
    assert stoker.ShardDataset(tmp_path / "ds").classes == sorted(set(classes))

    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "bare"), "--unlabelled", "--quiet"]) == 0
    bare = stoker.ShardDataset(tmp_path / "bare")
    assert (bare.targets == -1).all() and bare.classes == [] and len(bare) == len(some)


def test_named_columns_that_are_not_there_or_cannot_hold_images_are_refused(some, tmp_path):
    write_target_parquet(some, tmp_path / "src" / "data.parquet", list(range(len(some))))
    with pytest.raises(OptionError, match=re.escape(f"label_column='class' (--label-column): {tmp_path / 'src' / 'data.parquet'} "
                                                    "has no column 'class'; its columns: image, target")):
        stoker.pack(tmp_path / "src", tmp_path / "ds", label_column="class", progress=False)
    with pytest.raises(PackError, match=re.escape("column 'target' holds int64; an image column holds encoded bytes")):
        stoker.pack(tmp_path / "src", tmp_path / "ds", image_column="target", label_column="target", progress=False)
    with pytest.raises(OptionError, match="contradict each other"):
        stoker.pack(tmp_path / "src", tmp_path / "ds", label_column="target", unlabelled=True, progress=False)
    with pytest.raises(OptionError, match=re.escape("label_column='target' (--label-column) applies to tables")):
        stoker.pack(some[0].parent.parent, tmp_path / "ds", label_column="target", progress=False)


def test_integer_labels_get_numbered_class_names(some, tmp_path):
    write_target_parquet(some, tmp_path / "src" / "data.parquet", [i % 5 for i in range(len(some))])
    dataset = stoker.ShardDataset(stoker.pack(tmp_path / "src", tmp_path / "ds", label_column="target",
                                              progress=False).dst)
    assert dataset.classes == ["0", "1", "2", "3", "4"] and dataset.class_to_idx["4"] == 4

    class Numbered(torch.utils.data.Dataset):  # labels that come with the items, no classes attribute
        def __len__(self) -> int:
            return len(some)

        def __getitem__(self, i: int):
            return some[i].read_bytes(), 7 if i == 3 else i % 2

    packed = stoker.ShardDataset(stoker.pack(Numbered(), tmp_path / "items", workers=2, progress=False).dst)
    assert packed.classes == [str(i) for i in range(8)] and int(packed.targets.max()) == 7


def test_a_data_set_packed_without_class_names_reads_them_numbered(packed, tmp_path):
    import shutil

    copy = Path(shutil.copytree(packed, tmp_path / "old"))
    manifest = read_manifest(copy)
    manifest.classes = None  # as stoker wrote integer-labelled sources before class names were completed
    write_manifest(copy, manifest)
    assert json.loads((copy / MANIFEST_NAME).read_text())["classes"] is None
    assert stoker.ShardDataset(copy).classes == ["0", "1", "2", "3"]


def test_class_names_shorter_than_the_labels_are_completed_with_numbers(packed, tmp_path):
    import shutil

    copy = Path(shutil.copytree(packed, tmp_path / "short"))
    manifest = read_manifest(copy)
    manifest.classes = manifest.classes[:2]  # labels 2 and 3 have no name (written by hand, or another tool)
    write_manifest(copy, manifest)
    dataset = stoker.ShardDataset(copy)
    assert int(dataset.targets.max()) == 3
    assert dataset.classes == [*manifest.classes, "2", "3"]


def test_a_csv_with_a_header_row_names_its_columns(some, tmp_path, capsys):
    rows = ["split,file,target"] + [f"train,{p},{p.parent.name}" for p in some]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    assert main(["pack", str(tmp_path / "list.csv"), str(tmp_path / "refused"), "--image-column", "file", "--quiet"]) == 1
    assert error_line(capsys) == (f"stoker: error: {tmp_path / 'list.csv'}: no label column (label, labels) among its "
                                  f"columns: split, file, target; name it with --label-column (label_column=); {HINT}")
    assert main(["pack", str(tmp_path / "list.csv"), str(tmp_path / "ds"), "--image-column", "file",
                 "--label-column", "target", "--quiet"]) == 0
    assert served(tmp_path / "ds") == {p.read_bytes(): p.parent.name for p in some}


@pytest.mark.parametrize("header", ["path,caption", "path,caption,split"])
def test_a_csv_header_without_a_label_column_is_refused_unless_unlabelled(some, tmp_path, header):
    """A second column is a label only where the header says so: captions are not class names."""
    extra = header.count(",")
    rows = [header] + [f"{p},a photo of {p.stem}" + ",train" * (extra - 1) for p in some]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    columns = header.replace(",", ", ")
    with pytest.raises(PackError, match=re.escape(f"{tmp_path / 'list.csv'}: no label column (label, labels) among its "
                                                  f"columns: {columns}; name it with --label-column (label_column=); "
                                                  f"{HINT}")):
        stoker.pack(tmp_path / "list.csv", tmp_path / "refused", progress=False)
    result = stoker.pack(tmp_path / "list.csv", tmp_path / "ds", unlabelled=True, progress=False)
    dataset = stoker.ShardDataset(result.dst, decode="raw")
    assert dataset.classes == [] and {dataset[i][1] for i in range(len(dataset))} == {-1}
    assert sorted(bytes(dataset[i][0]) for i in range(len(dataset))) == sorted(p.read_bytes() for p in some)


def test_sources_without_labels_are_refused_unless_said_unlabelled(some, tmp_path):
    (tmp_path / "paths.csv").write_text("".join(f"{p}\n" for p in some))
    with pytest.raises(PackError, match=re.escape(f"{tmp_path / 'paths.csv'}: its rows hold no labels (expected "
                                                  f"'path,label' rows); {HINT}")):
        stoker.pack(tmp_path / "paths.csv", tmp_path / "ds", progress=False)
    assert stoker.pack(tmp_path / "paths.csv", tmp_path / "ds", unlabelled=True, progress=False).num_samples == len(some)

    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "a.tar", "w") as tar:
        for i, p in enumerate(some):
            tar.add(p, f"s{i}.jpg")
            tar.add(p, f"s{i}.target")  # any bytes: only the member's name matters here
    with pytest.raises(PackError, match=re.escape(f"{tmp_path / 'wds'}: no label member (.cls, .cls.txt, .label, "
                                                  ".label.txt, .class) in its samples; their members: .jpg, .target;")):
        stoker.pack(tmp_path / "wds", tmp_path / "wds-ds", progress=False)

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(some)

        def __getitem__(self, i: int):
            return some[i].read_bytes()

    name = f"{__name__}.test_sources_without_labels_are_refused_unless_said_unlabelled.<locals>.Images"
    with pytest.raises(PackError, match=re.escape(f"{name}: its items (bytes) hold no label (expected "
                                                  f"(image, label) or a dict with a label); {HINT}")):
        stoker.pack(Images(), tmp_path / "items", progress=False)
    result = stoker.pack(Images(), tmp_path / "items", unlabelled=True, workers=1, progress=False)
    assert result.num_samples == len(some) and stoker.ShardDataset(result.dst).classes == []

    class Dicts(Images):
        def __getitem__(self, i: int):
            return {"img": some[i].read_bytes(), "target": i % 2}

    with pytest.raises(PackError, match=re.escape("its items are dicts without a label key (label, labels, cls); "
                                                  "their keys: img, target; name it with --label-column")):
        stoker.pack(Dicts(), tmp_path / "dicts", progress=False)
    dicts = stoker.ShardDataset(stoker.pack(Dicts(), tmp_path / "dicts", label_column="target", workers=1,
                                            progress=False).dst)
    assert sorted(dicts.targets.tolist()) == sorted(i % 2 for i in range(len(some)))


def test_a_dataframe_and_an_arrow_table_are_packed_by_their_columns(some, tmp_path):
    frame = pd.DataFrame({"jpeg": [p.read_bytes() for p in some], "kind": [p.parent.name for p in some],
                          "note": ["x"] * len(some)})
    with pytest.raises(PackError, match=re.escape("no label column (label, labels) among its columns: jpeg, kind, note")):
        stoker.pack(frame, tmp_path / "df", progress=False)
    for name, table in (("df", frame), ("arrow", pa.Table.from_pandas(frame))):
        result = stoker.pack(table, tmp_path / name, label_column="kind", workers=2, progress=False)
        assert served(result.dst) == {p.read_bytes(): p.parent.name for p in some}, name
        assert stoker.ShardDataset(result.dst).classes == sorted({p.parent.name for p in some})

    paths = pd.DataFrame({"path": [str(p) for p in some], "label": [i % 3 for i in range(len(some))]})
    dataset = stoker.ShardDataset(stoker.pack(paths, tmp_path / "paths", workers=1, progress=False).dst, decode="raw")
    assert {bytes(dataset[i][0]) for i in range(len(dataset))} == {p.read_bytes() for p in some}

    from PIL import Image

    pictures = pd.DataFrame({"picture": [Image.open(p) for p in some[:2]], "label": [0, 1]})
    with pytest.raises(PackError, match=r"DataFrame: column 'picture' holds PIL\..*objects; an image column holds encoded"):
        stoker.pack(pictures, tmp_path / "pictures", image_column="picture", progress=False)
    with pytest.raises(PackError, match=r"DataFrame: no image column among its columns \(label \(int64\)\); .*; "
                                        r"besides, columns of Python objects: picture \(PIL\..* objects\)"):
        stoker.pack(pictures, tmp_path / "pictures", progress=False)
